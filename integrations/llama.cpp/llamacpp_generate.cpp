// Greedy generation on llama.cpp with depthkv's budgets (depthkv_llamacpp.hpp), or on the full cache,
// printing one JSON line: the KV bytes llama.cpp allocated, the peak RSS, prefill and decode speed, the tokens.
// usage: llamacpp_generate MODEL.gguf TEXT [n_prompt=2048] [n_gen=32] [keep=1] [policy=uniform|optimal]
//                          [profile.json] [tiers=3] [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0]
//                          [grouping=budget|layer]
// TEXT: a text file (its first n_prompt tokens, BOS first), or ids:FILE (token ids, whitespace-separated; n_prompt
// 0: all of them). grouping: depthkv::llamacpp::TierGrouping.
// Flash attention off and swa_full false (window layers hold window + ubatch cells) in every run.
// keep 1: the full cache (no tiers: llama.cpp's own memory). Built with -DDEPTHKV_STOCK against the unpatched
// llama.cpp, only keep 1 runs. swa_every N: every N-th layer is global, the others sliding-window (Gemma 3: 6).
#include "run_args.hpp"

#ifndef DEPTHKV_STOCK
#include "depthkv_llamacpp.hpp"
#endif

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

static double kv_buffer_mib = 0.0;  // the sum of llama.cpp's "KV buffer size = X MiB" lines

static void log_cb(ggml_log_level level, const char * text, void *) {
    const char * p = strstr(text, "KV buffer size =");
    if (p) {
        kv_buffer_mib += atof(p + strlen("KV buffer size ="));
    }
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMACPP_GENERATE_VERBOSE")) {
        fputs(text, stderr);
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int fail(const std::string & msg) {
    fprintf(stderr, "llamacpp_generate: %s\n", msg.c_str());
    return 1;
}

// One generation's two calls: the prompt's last logits, and one decoded token's.
struct Generator {
    std::function<const float *(std::vector<llama_token> &)> prefill;
    std::function<const float *(llama_token)>                step;
};

// llama.cpp's own memory: the prompt one ubatch per llama_decode, then token by token
static Generator full_generator(llama_context * ctx, int ubatch) {
    Generator g;
    g.prefill = [ctx, ubatch](std::vector<llama_token> & prompt) {
        const int n = (int) prompt.size();
        for (int i = 0; i < n; i += ubatch) {
            if (llama_decode(ctx, llama_batch_get_one(prompt.data() + i, std::min(ubatch, n - i))) != 0) {
                throw std::runtime_error("prefill failed");
            }
        }
        return (const float *) llama_get_logits_ith(ctx, -1);
    };
    g.step = [ctx](llama_token t) {
        if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
            throw std::runtime_error("decode failed");
        }
        return (const float *) llama_get_logits_ith(ctx, -1);
    };
    return g;
}

// n_gen greedy tokens (the first from the prompt's logits), timing the prefill and the n_gen - 1 decode steps
static std::vector<llama_token> greedy(const Generator & g, std::vector<llama_token> & prompt, int n_gen, int n_vocab,
                                       double & prefill_s, double & decode_s) {
    double t0 = now_s();
    const float * logits = g.prefill(prompt);
    prefill_s = now_s() - t0;
    std::vector<llama_token> out;
    t0 = now_s();
    for (int i = 0; i < n_gen; ++i) {
        const llama_token tok = (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
        out.push_back(tok);
        if (i + 1 < n_gen) {
            logits = g.step(tok);
        }
    }
    decode_s = now_s() - t0;
    return out;
}

#ifndef DEPTHKV_STOCK
// [{"layers": n, "budget": b}, ...] of the plan's tiers
static std::string tiers_json(const depthkv::llamacpp::TierPlan & plan) {
    std::ostringstream tj;
    tj << "[";
    for (int t = 0; t < plan.n_tiers(); ++t) {
        int layers = 0;
        for (size_t l = 0; l < plan.tier_of_layer.size(); ++l) {
            layers += !plan.swa[l] && (int) plan.tier_of_layer[l] == t;
        }
        tj << (t ? ", " : "") << "{\"layers\": " << layers << ", \"budget\": " << plan.budget[t] << "}";
    }
    return tj.str() + "]";
}
#endif

// The prompt's first n_prompt tokens (all when 0); throws std::invalid_argument on a shorter text
static std::vector<llama_token> read_prompt(const RunArgs & a, const llama_vocab * vocab) {
    std::vector<llama_token> prompt = RunArgs::read_tokens(vocab, a.text);
    if ((int) prompt.size() < std::max(1, a.n_prompt)) {
        throw std::invalid_argument(a.text + " has " + std::to_string(prompt.size()) + " tokens, fewer than " +
                                    std::to_string(std::max(1, a.n_prompt)));
    }
    if (a.n_prompt > 0) {
        prompt.resize(a.n_prompt);
    }
    return prompt;
}

// What one generation runs on: llama.cpp's own memory (keep 1) or an adapter session on the tiered cache
struct Run {
    std::unique_ptr<llama_context, void (*)(llama_context *)> full{ nullptr, llama_free };
#ifndef DEPTHKV_STOCK
    std::unique_ptr<depthkv::llamacpp::Session> session;
#endif
    Generator   gen;
    std::string tiers = "[]";

    Run(const RunArgs & a, llama_model * model, int n_final) {
        if (a.keep >= 1.0) {
            full.reset(llama_init_from_model(model, a.full_params(n_final)));
            if (!full) {
                throw std::runtime_error("llama_init_from_model failed");
            }
            gen = full_generator(full.get(), a.ubatch);
            return;
        }
#ifdef DEPTHKV_STOCK
        throw std::invalid_argument("the stock build runs keep 1 only");
#else
        const int n_layer = llama_model_n_layer(model);
        const depthkv::PruneSpec spec = a.spec();
        const depthkv::PolicyCurves curves = a.curves(spec);
        const depthkv::llamacpp::TierPlan plan = depthkv::llamacpp::plan_tiers(
            spec, curves.data(), n_layer, a.swa(n_layer), n_final,
            a.extra == "layer" ? depthkv::llamacpp::TierGrouping::kLayer : depthkv::llamacpp::TierGrouping::kBudget);
        session = std::make_unique<depthkv::llamacpp::Session>(model, spec, plan, n_final, a.threads);
        tiers = tiers_json(plan);
        depthkv::llamacpp::Session * s = session.get();
        gen.prefill = [s](std::vector<llama_token> & p) { return s->prefill(p); };
        gen.step = [s](llama_token t) { return s->step(t); };
#endif
    }
    // ", \"evictions\": n, \"removed\": m" of a session, else ""
    std::string evictions() const {
#ifndef DEPTHKV_STOCK
        if (session) {
            return ", \"evictions\": " + std::to_string(session->report().evictions) + ", \"removed\": " +
                   std::to_string(session->report().removed);
        }
#endif
        return "";
    }
};

int main(int argc, char ** argv) try {
    if (argc < 3) {
        return fail("usage: llamacpp_generate MODEL.gguf TEXT [n_prompt=2048] [n_gen=32] [keep=1] [policy=uniform] "
                    "[profile.json] [tiers=3] [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0] [grouping=budget]");
    }
    const RunArgs a = RunArgs::parse(argc, argv, "2048", "32", "1", "budget");
    if (a.extra != "budget" && a.extra != "layer") {
        return fail("grouping must be budget or layer, not " + a.extra);
    }
    const RunArgs::ModelPtr model = a.load_model(log_cb);
    const llama_vocab * vocab = llama_model_get_vocab(model.get());
    std::vector<llama_token> prompt = read_prompt(a, vocab);
    kv_buffer_mib = 0.0;
    const Run run(a, model.get(), (int) prompt.size() + a.n_new);
    double prefill_s = 0.0, decode_s = 0.0;
    const std::vector<llama_token> out = greedy(run.gen, prompt, a.n_new, llama_vocab_n_tokens(vocab), prefill_s, decode_s);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"model\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"keep\": %g, \"policy\": \"%s\", \"scorer\": \"%s\", "
           "\"ubatch\": %d, \"interval\": %d, \"threads\": %d, \"kv_buffer_mib\": %.2f, \"tiers\": %s, "
           "\"peak_rss_mib\": %.1f, \"prefill_tok_s\": %.1f, \"decode_tok_s\": %.2f%s, \"tokens\": [",
           a.model.substr(a.model.find_last_of('/') + 1).c_str(), (int) prompt.size(), a.n_new, a.keep,
           a.keep >= 1.0 ? "full" : a.policy.c_str(), a.keep >= 1.0 ? "" : a.scorer.c_str(), a.ubatch, a.interval,
           a.threads, kv_buffer_mib, run.tiers.c_str(), ru.ru_maxrss / 1024.0, prompt.size() / prefill_s,
           (a.n_new - 1) / decode_s, run.evictions().c_str());
    for (size_t i = 0; i < out.size(); ++i) {
        printf("%s%d", i ? ", " : "", out[i]);
    }
    printf("]}\n");
    return 0;
} catch (const std::exception & e) {
    return fail(e.what());
}
