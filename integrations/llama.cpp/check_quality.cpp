// Quality of depthkv's budgets on llama.cpp's tiered cache against the same budgets in depthkv's own engine.
// A prompt of N tokens and a continuation of T tokens (the text's next ones) are teacher-forced; each run's T logit
// rows are compared with the full cache of the same engine: mean KL(full || pruned), top-1 disagreement, NLL
// increase of the true tokens (depthkv::compare_logits).
//   - llama.cpp, tiers by budget (depthkv_llamacpp.hpp, TierGrouping::kBudget): one position set per tier;
//   - llama.cpp, one tier per layer (TierGrouping::kLayer): one position set per layer, shared by its KV heads;
//   - depthkv's engine (PrunedGeneration, F16 cache, a decode schedule: the same chunk and interval), selecting per
//     (layer, KV head).
// Every run: flash attention off, swa_full false, chunk = ubatch, eviction after each chunk and every `interval`
// decoded tokens, sinks 4 and recent 16 protected.
// usage: check_quality MODEL TEXT [n_prompt=2048] [n_cont=64] [keep=0.2] [policy=uniform] [profile.json] [tiers=3]
//                      [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0] [windows=1]
// `windows` consecutive windows of the text's tokens (window w: tokens [w (N + T), (w + 1) (N + T))); each metric is
// the mean over them, with its standard error. Prints one JSON line. Exit 1 on an error; the agreement is reported, not asserted.
#include "depthkv_llamacpp.hpp"

#include <depthkv/llama/engine.hpp>
#include <depthkv/llama/gguf.hpp>
#include <depthkv/llama/pruned_generation.hpp>
#include <depthkv/metrics.hpp>
#include <depthkv/preset.hpp>
#include <depthkv/profile_io.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using depthkv::llama::RowMatrix;

static void log_cb(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || getenv("CHECK_QUALITY_VERBOSE")) {
        fputs(text, stderr);
    }
}

// rows[i] = logits predicting cont[i]: row 0 from the prompt, row i after feeding cont[i - 1]
template <class Step>
static RowMatrix collect(const float * first, const std::vector<llama_token> & cont, int n_vocab, Step && step) {
    RowMatrix rows((Eigen::Index) cont.size(), n_vocab);
    const float * lg = first;
    for (size_t i = 0; i < cont.size(); ++i) {
        rows.row((Eigen::Index) i) = Eigen::Map<const Eigen::RowVectorXf>(lg, n_vocab);
        if (i + 1 < cont.size()) {
            lg = step(cont[i]);
        }
    }
    return rows;
}

// llama.cpp's own memory (flash attention off, swa_full false): the prompt in ubatches, then the continuation
static RowMatrix llamacpp_full(llama_model * model, const std::vector<llama_token> & prompt,
                               const std::vector<llama_token> & cont, int ubatch, int threads, int n_vocab) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (prompt.size() + cont.size());
    cp.n_batch = cp.n_ubatch = ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = false;
    std::unique_ptr<llama_context, void (*)(llama_context *)> ctx(llama_init_from_model(model, cp), llama_free);
    DEPTHKV_CHECK(ctx, "llama_init_from_model failed");
    std::vector<llama_token> p = prompt;
    const int n = (int) p.size();
    for (int i = 0; i < n; i += ubatch) {
        DEPTHKV_CHECK(llama_decode(ctx.get(), llama_batch_get_one(p.data() + i, std::min(ubatch, n - i))) == 0, "prefill failed");
    }
    return collect(llama_get_logits_ith(ctx.get(), -1), cont, n_vocab, [&](llama_token t) {
        DEPTHKV_CHECK(llama_decode(ctx.get(), llama_batch_get_one(&t, 1)) == 0, "decode failed");
        return (const float *) llama_get_logits_ith(ctx.get(), -1);
    });
}

// "[mean, standard error]" (the standard error 0 for one value)
static std::string mean_se(const std::vector<double> & v) {
    double mean = 0.0, var = 0.0;
    for (double x : v) {
        mean += x / v.size();
    }
    for (double x : v) {
        var += (x - mean) * (x - mean);
    }
    const double se = v.size() > 1 ? std::sqrt(var / (v.size() - 1) / v.size()) : 0.0;
    std::ostringstream o;
    o.precision(5);
    o << "[" << mean << ", " << se << "]";
    return o.str();
}

int main(int argc, char ** argv) try {
    if (argc < 3) {
        fprintf(stderr, "usage: check_quality MODEL TEXT [n_prompt=2048] [n_cont=64] [keep=0.2] [policy=uniform] "
                        "[profile.json] [tiers=3] [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0] [windows=1]\n");
        return 2;
    }
    auto arg = [&](int i, const char * def) { return argc > i && argv[i][0] ? std::string(argv[i]) : std::string(def); };
    const std::string path_model = argv[1], path_text = argv[2];
    const int n_prompt = std::stoi(arg(3, "2048")), n_cont = std::stoi(arg(4, "64"));
    const double keep = std::stod(arg(5, "0.2"));
    const std::string policy = arg(6, "uniform"), profile = arg(7, "");
    const int tiers = std::stoi(arg(8, "3"));
    const std::string scorer = arg(9, "snapkv");
    const int ubatch = std::stoi(arg(10, "128")), interval = std::stoi(arg(11, "16")), threads = std::stoi(arg(12, "2"));
    const int swa_every = std::stoi(arg(13, "0")), windows = std::stoi(arg(14, "1"));
    DEPTHKV_CHECK(windows >= 1, "windows must be >= 1");
    DEPTHKV_CHECK(n_prompt >= 1 && n_cont >= 2 && ubatch >= 1 && interval >= 1 && threads >= 1 && keep > 0.0 && keep < 1.0,
                  "n_prompt, ubatch, interval, threads >= 1, n_cont >= 2 and keep in (0, 1)");

    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    std::unique_ptr<llama_model, void (*)(llama_model *)> model(llama_model_load_from_file(path_model.c_str(), mp),
                                                                  llama_model_free);
    DEPTHKV_CHECK(model, "cannot load " << path_model);
    std::ifstream f(path_text);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const llama_vocab * vocab = llama_model_get_vocab(model.get());
    std::vector<llama_token> ids(text.size() + 16);
    const int n_tok = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ids.data(), (int32_t) ids.size(), true, false);
    DEPTHKV_CHECK(n_tok >= windows * (n_prompt + n_cont),
                  path_text << " has " << n_tok << " tokens, fewer than " << windows * (n_prompt + n_cont));
    const std::vector<llama_token> prompt(ids.begin(), ids.begin() + n_prompt);
    const std::vector<llama_token> cont(ids.begin() + n_prompt, ids.begin() + n_prompt + n_cont);
    const int n_final = n_prompt + n_cont, n_layer = llama_model_n_layer(model.get());
    const int n_vocab = llama_vocab_n_tokens(vocab);

    depthkv::PruneSpec spec;
    spec.scorer.kind = depthkv::parse_scorer_kind(scorer);
    spec.budget = depthkv::Budget::keep(keep);
    spec.policy = depthkv::parse_allocation_policy(policy);
    spec.tiers = spec.policy == depthkv::AllocationPolicy::kOptimal ? tiers : 0;
    spec.schedule.mode = depthkv::ScheduleMode::kDecode;
    spec.schedule.chunk = ubatch;
    spec.schedule.interval = interval;
    depthkv::PolicyCurves curves;
    if (!profile.empty()) {
        curves = depthkv::policy_curves(depthkv::load_profile(profile), scorer, spec.policy);
    }
    std::vector<bool> swa;
    const depthkv::PolicyData data = curves.data();
    for (int l = 0; l < n_layer && swa_every > 0; ++l) {
        swa.push_back((l + 1) % swa_every != 0);
    }

    const depthkv::llama::LlamaModel dk_model = depthkv::llama::load_gguf(path_model);
    depthkv::llama::LlamaEngine engine(dk_model);
    depthkv::llama::ForwardOptions run;
    run.chunk_size = ubatch;
    run.n_threads = threads;
    const char * names[4] = { "llamacpp_tiers", "llamacpp_layers", "depthkv_engine", "engines_full" };
    std::vector<depthkv::ContinuationMetrics> m[4];  // [run][window]
    int n_tiers[2] = { 0, 0 };
    for (int w = 0; w < windows; ++w) {
        const auto w0 = ids.begin() + (std::ptrdiff_t) w * (n_prompt + n_cont);
        const std::vector<llama_token> prompt(w0, w0 + n_prompt), cont(w0 + n_prompt, w0 + n_prompt + n_cont);
        const std::vector<int> targets(cont.begin(), cont.end());  // row i predicts cont[i]
        const RowMatrix ll_full = llamacpp_full(model.get(), prompt, cont, ubatch, threads, n_vocab);
        for (int gi = 0; gi < 2; ++gi) {
            const auto g = gi ? depthkv::llamacpp::TierGrouping::kLayer : depthkv::llamacpp::TierGrouping::kBudget;
            const auto plan = depthkv::llamacpp::plan_tiers(spec, data, n_layer, swa, n_final, g);
            depthkv::llamacpp::Session s(model.get(), spec, plan, n_final, threads);
            const RowMatrix rows = collect(s.prefill(prompt), cont, n_vocab, [&](llama_token t) { return s.step(t); });
            m[gi].push_back(depthkv::compare_logits(ll_full, rows, targets));
            n_tiers[gi] = plan.n_tiers();
        }
        // depthkv's engine: full, then the spec
        const std::vector<int> p_ids(prompt.begin(), prompt.end()), c_ids(cont.begin(), cont.end() - 1);
        RowMatrix dk[2];
        for (int pruned = 0; pruned < 2; ++pruned) {
            depthkv::llama::PrunedGeneration<depthkv::llama::HostCacheF16> g(
                engine, engine.make_cache<Eigen::half>(), pruned ? std::optional<depthkv::PruneSpec>(spec) : std::nullopt,
                curves, nullptr, run);
            const RowMatrix first = g.prefill(p_ids);
            const RowMatrix rest = g.teacher_force(c_ids);
            dk[pruned].resize(n_cont, first.cols());
            dk[pruned].row(0) = first.row(0);
            dk[pruned].bottomRows(n_cont - 1) = rest;
        }
        DEPTHKV_CHECK(dk[0].cols() == n_vocab, "depthkv's vocabulary " << dk[0].cols() << " differs from llama.cpp's " << n_vocab);
        m[2].push_back(depthkv::compare_logits(dk[0], dk[1], targets));
        m[3].push_back(depthkv::compare_logits(ll_full, dk[0], targets));
    }
    std::ostringstream out;
    out.precision(5);
    out << "{\"model\": \"" << path_model.substr(path_model.find_last_of('/') + 1) << "\", \"n_prompt\": " << n_prompt
        << ", \"n_cont\": " << n_cont << ", \"windows\": " << windows << ", \"keep\": " << keep << ", \"policy\": \""
        << policy << "\", \"scorer\": \"" << scorer << "\", \"n_tiers\": " << n_tiers[0] << ", \"n_layer_tiers\": "
        << n_tiers[1];
    for (int r = 0; r < 4; ++r) {
        out << ", \"" << names[r] << "\": {";
        const char * keys[3] = { "kl", "top1_disagree", "dnll" };
        for (int k = 0; k < 3; ++k) {
            std::vector<double> v;
            for (const auto & x : m[r]) {
                v.push_back(k == 0 ? x.loss.kl : k == 1 ? x.loss.top1_disagree : x.loss.dnll);
            }
            out << (k ? ", " : "") << "\"" << keys[k] << "\": " << mean_se(v);
        }
        out << "}";
    }
    out << "}";
    printf("%s\n", out.str().c_str());
    return 0;
} catch (const std::exception & e) {
    fprintf(stderr, "check_quality: %s\n", e.what());
    return 1;
}
