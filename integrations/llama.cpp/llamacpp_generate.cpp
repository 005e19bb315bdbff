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

int main(int argc, char ** argv) try {
    if (argc < 3) {
        return fail("usage: llamacpp_generate MODEL.gguf TEXT [n_prompt=2048] [n_gen=32] [keep=1] [policy=uniform] "
                    "[profile.json] [tiers=3] [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0] [grouping=budget]");
    }
    const RunArgs a = RunArgs::parse(argc, argv, "2048", "32", "1", "budget");
    const std::string & grouping = a.extra;
    if (grouping != "budget" && grouping != "layer") {
        return fail("grouping must be budget or layer, not " + grouping);
    }
    const int n_gen = a.n_new, ubatch = a.ubatch;

    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(a.model.c_str(), mp);
    if (!model) {
        return fail("cannot load " + a.model);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> prompt = RunArgs::read_tokens(vocab, a.text);
    if ((int) prompt.size() < std::max(1, a.n_prompt)) {
        return fail(a.text + " has " + std::to_string(prompt.size()) + " tokens, fewer than " +
                    std::to_string(std::max(1, a.n_prompt)));
    }
    if (a.n_prompt > 0) {
        prompt.resize(a.n_prompt);
    }
    const int n_prompt_run = (int) prompt.size();
    const int n_final = n_prompt_run + n_gen, n_layer = llama_model_n_layer(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
#ifdef DEPTHKV_STOCK
    (void) n_layer;
#endif

    // the full cache: llama.cpp's own memory, flash attention off as in the pruned runs
    std::unique_ptr<llama_context, void (*)(llama_context *)> full(nullptr, llama_free);
#ifndef DEPTHKV_STOCK
    std::unique_ptr<depthkv::llamacpp::Session> session;
#endif
    std::string tiers_json = "[]";
    kv_buffer_mib = 0.0;
    if (a.keep >= 1.0) {
        full.reset(llama_init_from_model(model, a.full_params(n_final)));
        if (!full) {
            return fail("llama_init_from_model failed");
        }
    } else {
#ifdef DEPTHKV_STOCK
        return fail("the stock build runs keep 1 only");
#else
        const depthkv::PruneSpec spec = a.spec();
        const depthkv::PolicyCurves curves = a.curves(spec);
        depthkv::llamacpp::TierPlan plan = depthkv::llamacpp::plan_tiers(
            spec, curves.data(), n_layer, a.swa(n_layer), n_final,
            grouping == "layer" ? depthkv::llamacpp::TierGrouping::kLayer : depthkv::llamacpp::TierGrouping::kBudget);
        session = std::make_unique<depthkv::llamacpp::Session>(model, spec, plan, n_final, a.threads);
        std::ostringstream tj;
        tj << "[";
        for (int t = 0; t < plan.n_tiers(); ++t) {
            int layers = 0;
            for (int l = 0; l < n_layer; ++l) {
                layers += !plan.swa[l] && (int) plan.tier_of_layer[l] == t;
            }
            tj << (t ? ", " : "") << "{\"layers\": " << layers << ", \"budget\": " << plan.budget[t] << "}";
        }
        tj << "]";
        tiers_json = tj.str();
#endif
    }
    llama_context * ctx = full ? full.get() : nullptr;
#ifndef DEPTHKV_STOCK
    if (session) {
        ctx = session->context();
    }
#endif

    double t0 = now_s();
    const float * logits = nullptr;
#ifndef DEPTHKV_STOCK
    if (session) {
        logits = session->prefill(prompt);
    }
#endif
    if (full) {
        for (int i = 0; i < n_prompt_run; i += ubatch) {
            if (llama_decode(ctx, llama_batch_get_one(prompt.data() + i, std::min(ubatch, n_prompt_run - i))) != 0) {
                return fail("prefill failed");
            }
        }
        logits = llama_get_logits_ith(ctx, -1);
    }
    const double prefill_s = now_s() - t0;

    std::vector<llama_token> out;
    t0 = now_s();
    for (int i = 0; i < n_gen; ++i) {
        llama_token tok = (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
        out.push_back(tok);
        if (i + 1 == n_gen) {
            break;
        }
#ifndef DEPTHKV_STOCK
        if (session) {
            logits = session->step(tok);
            continue;
        }
#endif
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            return fail("decode failed");
        }
        logits = llama_get_logits_ith(ctx, -1);
    }
    const double decode_s = now_s() - t0;

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"model\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"keep\": %g, \"policy\": \"%s\", \"scorer\": \"%s\", "
           "\"ubatch\": %d, \"interval\": %d, \"threads\": %d, \"kv_buffer_mib\": %.2f, \"tiers\": %s, "
           "\"peak_rss_mib\": %.1f, \"prefill_tok_s\": %.1f, \"decode_tok_s\": %.2f",
           a.model.substr(a.model.find_last_of('/') + 1).c_str(), n_prompt_run, n_gen, a.keep,
           a.keep >= 1.0 ? "full" : a.policy.c_str(), a.keep >= 1.0 ? "" : a.scorer.c_str(), ubatch, a.interval, a.threads,
           kv_buffer_mib, tiers_json.c_str(), ru.ru_maxrss / 1024.0, n_prompt_run / prefill_s, (n_gen - 1) / decode_s);
#ifndef DEPTHKV_STOCK
    if (session) {
        const auto & r = session->report();
        printf(", \"evictions\": %d, \"removed\": %lld", r.evictions, r.removed);
    }
#endif
    printf(", \"tokens\": [");
    for (size_t i = 0; i < out.size(); ++i) {
        printf("%s%d", i ? ", " : "", out[i]);
    }
    printf("]}\n");
    full.reset();
#ifndef DEPTHKV_STOCK
    session.reset();
#endif
    llama_model_free(model);
    return 0;
} catch (const std::exception & e) {
    return fail(e.what());
}
