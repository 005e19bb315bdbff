#pragma once
// The positional arguments llamacpp_generate and check_quality share, and what they build from them:
//   MODEL TEXT [n_prompt] [n_new] [keep] [policy=uniform] [profile.json] [tiers=3] [scorer=snapkv] [ubatch=128]
//   [interval=16] [threads=2] [swa_every=0] [extra]
// (an empty argument takes the default). Without DEPTHKV_STOCK also the spec, the profile's curves and the window
// layers, on depthkv's headers.
#include "llama.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef DEPTHKV_STOCK
#include <depthkv/preset.hpp>
#include <depthkv/profile_io.hpp>
#include <depthkv/prune_spec.hpp>
#endif

struct RunArgs {
    std::string model, text;
    int         n_prompt = 0, n_new = 0;
    double      keep = 1.0;
    std::string policy, profile;
    int         tiers = 3;
    std::string scorer;
    int         ubatch = 128, interval = 16, threads = 2, swa_every = 0;
    std::string extra;  // argument 14: the program's own

    // throws std::invalid_argument naming the argument on a value that is not a number
    static RunArgs parse(int argc, char ** argv, const char * n_prompt, const char * n_new, const char * keep,
                         const char * extra) {
        auto arg = [&](int i, const char * def) { return argc > i && argv[i][0] ? std::string(argv[i]) : std::string(def); };
        auto num = [&](int i, const char * def, const char * name) {
            try {
                return std::stod(arg(i, def));
            } catch (const std::exception &) {
                throw std::invalid_argument(std::string(name) + ": not a number: " + arg(i, def));
            }
        };
        RunArgs a;
        a.model = arg(1, "");
        a.text = arg(2, "");
        a.n_prompt = (int) num(3, n_prompt, "n_prompt");
        a.n_new = (int) num(4, n_new, "n_new");
        a.keep = num(5, keep, "keep");
        a.policy = arg(6, "uniform");
        a.profile = arg(7, "");
        a.tiers = (int) num(8, "3", "tiers");
        a.scorer = arg(9, "snapkv");
        a.ubatch = (int) num(10, "128", "ubatch");
        a.interval = (int) num(11, "16", "interval");
        a.threads = (int) num(12, "2", "threads");
        a.swa_every = (int) num(13, "0", "swa_every");
        a.extra = arg(14, extra);
        if (a.ubatch < 1 || a.interval < 1 || a.threads < 1 || a.n_prompt < 0 || a.n_new < 1 || !(a.keep > 0.0 && a.keep <= 1.0)) {
            throw std::invalid_argument("ubatch, interval, threads and n_new must be >= 1, n_prompt >= 0, keep in (0, 1]");
        }
        return a;
    }

    using ModelPtr = std::unique_ptr<llama_model, void (*)(llama_model *)>;

    // llama.cpp's backend initialized with `log` as its log callback, and `model` loaded on the CPU
    // throws std::runtime_error when llama.cpp cannot load it
    ModelPtr load_model(ggml_log_callback log) const {
        llama_log_set(log, nullptr);
        llama_backend_init();
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = 0;
        ModelPtr m(llama_model_load_from_file(model.c_str(), mp), llama_model_free);
        if (!m) {
            throw std::runtime_error("cannot load " + model);
        }
        return m;
    }

    // llama.cpp's own memory for n_ctx positions: one ubatch per llama_decode, flash attention off (as the tiered
    // runs, which observe the probabilities), window layers at their window plus one ubatch (swa_full false)
    llama_context_params full_params(int n_ctx) const {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) n_ctx;
        cp.n_batch = cp.n_ubatch = (uint32_t) ubatch;
        cp.n_seq_max = 1;
        cp.n_threads = cp.n_threads_batch = threads;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.swa_full = false;
        return cp;
    }

    // the tokens of `path`: a text file tokenized by llama.cpp (BOS first), or ids:FILE (token ids, whitespace-separated)
    static std::vector<llama_token> read_tokens(const llama_vocab * vocab, const std::string & path) {
        const bool ids = path.rfind("ids:", 0) == 0;
        std::ifstream f(ids ? path.substr(4) : path);
        if (!f) {
            throw std::invalid_argument("cannot read " + path);
        }
        std::vector<llama_token> out;
        if (ids) {
            for (long long t; f >> t;) {
                if (t < 0 || t >= llama_vocab_n_tokens(vocab)) {
                    throw std::invalid_argument(path + ": token id " + std::to_string(t) + " outside the vocabulary");
                }
                out.push_back((llama_token) t);
            }
            if (!f.eof()) {
                throw std::invalid_argument(path + ": not a list of token ids");
            }
            return out;
        }
        std::stringstream ss;
        ss << f.rdbuf();
        const std::string text = ss.str();
        out.resize(text.size() + 16);
        const int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), true, false);
        out.resize(n > 0 ? n : 0);
        return out;
    }

#ifndef DEPTHKV_STOCK
    // what to keep: the scorer, keep ratio and policy (optimal: in `tiers` tiers), chunk = ubatch, the interval
    depthkv::PruneSpec spec(depthkv::ScheduleMode mode = depthkv::ScheduleMode::kOneshot) const {
        depthkv::PruneSpec s;
        s.scorer.kind = depthkv::parse_scorer_kind(scorer);
        s.budget = depthkv::Budget::keep(keep);
        s.policy = depthkv::parse_allocation_policy(policy);
        s.tiers = s.policy == depthkv::AllocationPolicy::kOptimal ? tiers : 0;
        s.schedule.mode = mode;
        s.schedule.chunk = ubatch;
        s.schedule.interval = interval;
        return s;
    }
    // the profile's curves for the spec's policy (none without a profile)
    depthkv::PolicyCurves curves(const depthkv::PruneSpec & s) const {
        return profile.empty() ? depthkv::PolicyCurves{} : depthkv::policy_curves(depthkv::load_profile(profile), scorer, s.policy);
    }
    // every swa_every-th layer global, the others sliding-window (empty: none); llama.cpp does not expose the flag
    std::vector<bool> swa(int n_layer) const {
        std::vector<bool> out;
        for (int l = 0; l < n_layer && swa_every > 0; ++l) {
            out.push_back((l + 1) % swa_every != 0);
        }
        return out;
    }
#endif
};
