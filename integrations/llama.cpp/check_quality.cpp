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
#include "run_args.hpp"

#include <depthkv/llama/engine.hpp>
#include <depthkv/llama/gguf.hpp>
#include <depthkv/llama/pruned_generation.hpp>
#include <depthkv/metrics.hpp>
#include <depthkv/preset.hpp>
#include <depthkv/profile_io.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// llama.cpp's own memory (RunArgs::full_params): the prompt in ubatches, then the continuation
static RowMatrix llamacpp_full(llama_model * model, const RunArgs & a, const std::vector<llama_token> & prompt,
                               const std::vector<llama_token> & cont, int n_vocab) {
    std::unique_ptr<llama_context, void (*)(llama_context *)> ctx(
        llama_init_from_model(model, a.full_params((int) (prompt.size() + cont.size()))), llama_free);
    DEPTHKV_CHECK(ctx, "llama_init_from_model failed");
    std::vector<llama_token> p = prompt;
    const int n = (int) p.size();
    for (int i = 0; i < n; i += a.ubatch) {
        DEPTHKV_CHECK(llama_decode(ctx.get(), llama_batch_get_one(p.data() + i, std::min(a.ubatch, n - i))) == 0, "prefill failed");
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

// depthkv's engine on one window (PrunedGeneration, decode schedule when `spec` is set, else the full cache): the
// logits predicting cont[0..n)
static RowMatrix depthkv_rows(depthkv::llama::LlamaEngine & engine, const depthkv::llama::ForwardOptions & run,
                              const std::optional<depthkv::PruneSpec> & spec, const depthkv::PolicyCurves & curves,
                              const std::vector<llama_token> & prompt, const std::vector<llama_token> & cont) {
    const std::vector<int> p_ids(prompt.begin(), prompt.end()), c_ids(cont.begin(), cont.end() - 1);
    depthkv::llama::PrunedGeneration<depthkv::llama::HostCacheF16> g(engine, engine.make_cache<Eigen::half>(), spec,
                                                                     curves, nullptr, run);
    const RowMatrix first = g.prefill(p_ids);
    const RowMatrix rest = g.teacher_force(c_ids);
    RowMatrix rows((Eigen::Index) cont.size(), first.cols());
    rows.row(0) = first.row(0);
    rows.bottomRows((Eigen::Index) cont.size() - 1) = rest;
    return rows;
}

static const char * const RUN_NAMES[4] = { "llamacpp_tiers", "llamacpp_layers", "depthkv_engine", "engines_full" };

// The output line: the settings, then each run's [mean, standard error] of KL, top-1 disagreement and NLL increase
static std::string report_json(const RunArgs & a, int windows, const int n_tiers[2],
                               const std::vector<depthkv::ContinuationMetrics> m[4]) {
    std::ostringstream out;
    out.precision(5);
    out << "{\"model\": \"" << a.model.substr(a.model.find_last_of('/') + 1) << "\", \"n_prompt\": " << a.n_prompt
        << ", \"n_cont\": " << a.n_new << ", \"windows\": " << windows << ", \"keep\": " << a.keep << ", \"policy\": \""
        << a.policy << "\", \"scorer\": \"" << a.scorer << "\", \"n_tiers\": " << n_tiers[0] << ", \"n_layer_tiers\": "
        << n_tiers[1];
    for (int r = 0; r < 4; ++r) {
        out << ", \"" << RUN_NAMES[r] << "\": {";
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
    return out.str();
}

int main(int argc, char ** argv) try {
    if (argc < 3) {
        fprintf(stderr, "usage: check_quality MODEL TEXT [n_prompt=2048] [n_cont=64] [keep=0.2] [policy=uniform] "
                        "[profile.json] [tiers=3] [scorer=snapkv] [ubatch=128] [interval=16] [threads=2] [swa_every=0] [windows=1]\n");
        return 2;
    }
    const RunArgs a = RunArgs::parse(argc, argv, "2048", "64", "0.2", "1");
    const int n_prompt = a.n_prompt, n_cont = a.n_new, windows = std::stoi(a.extra);
    DEPTHKV_CHECK(windows >= 1 && n_prompt >= 1 && n_cont >= 2 && a.keep < 1.0,
                  "windows and n_prompt >= 1, n_cont >= 2 and keep < 1");

    const RunArgs::ModelPtr model = a.load_model(log_cb);
    const llama_vocab * vocab = llama_model_get_vocab(model.get());
    const std::vector<llama_token> ids = RunArgs::read_tokens(vocab, a.text);
    DEPTHKV_CHECK((int) ids.size() >= windows * (n_prompt + n_cont),
                  a.text << " has " << ids.size() << " tokens, fewer than " << windows * (n_prompt + n_cont));
    const int n_final = n_prompt + n_cont, n_layer = llama_model_n_layer(model.get());
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const depthkv::PruneSpec spec = a.spec(depthkv::ScheduleMode::kDecode);
    const depthkv::PolicyCurves curves = a.curves(spec);
    const depthkv::PolicyData data = curves.data();
    const std::vector<bool> swa = a.swa(n_layer);

    const depthkv::llama::LlamaModel dk_model = depthkv::llama::load_gguf(a.model);
    depthkv::llama::LlamaEngine engine(dk_model);
    depthkv::llama::ForwardOptions run;
    run.chunk_size = a.ubatch;
    run.n_threads = a.threads;
    std::vector<depthkv::ContinuationMetrics> m[4];  // [run][window]
    int n_tiers[2] = { 0, 0 };
    for (int w = 0; w < windows; ++w) {
        const auto w0 = ids.begin() + (std::ptrdiff_t) w * (n_prompt + n_cont);
        const std::vector<llama_token> prompt(w0, w0 + n_prompt), cont(w0 + n_prompt, w0 + n_prompt + n_cont);
        const std::vector<int> targets(cont.begin(), cont.end());  // row i predicts cont[i]
        const RowMatrix ll_full = llamacpp_full(model.get(), a, prompt, cont, n_vocab);
        for (int gi = 0; gi < 2; ++gi) {
            const auto g = gi ? depthkv::llamacpp::TierGrouping::kLayer : depthkv::llamacpp::TierGrouping::kBudget;
            const auto plan = depthkv::llamacpp::plan_tiers(spec, data, n_layer, swa, n_final, g);
            depthkv::llamacpp::Session s(model.get(), spec, plan, n_final, a.threads);
            const RowMatrix rows = collect(s.prefill(prompt), cont, n_vocab, [&](llama_token t) { return s.step(t); });
            m[gi].push_back(depthkv::compare_logits(ll_full, rows, targets));
            n_tiers[gi] = plan.n_tiers();
        }
        // depthkv's engine: full, then the spec
        const RowMatrix dk[2] = { depthkv_rows(engine, run, std::nullopt, curves, prompt, cont),
                                  depthkv_rows(engine, run, spec, curves, prompt, cont) };
        DEPTHKV_CHECK(dk[0].cols() == n_vocab, "depthkv's vocabulary " << dk[0].cols() << " differs from llama.cpp's " << n_vocab);
        m[2].push_back(depthkv::compare_logits(dk[0], dk[1], targets));
        m[3].push_back(depthkv::compare_logits(ll_full, dk[0], targets));
    }
    printf("%s\n", report_json(a, windows, n_tiers, m).c_str());
    return 0;
} catch (const std::exception & e) {
    fprintf(stderr, "check_quality: %s\n", e.what());
    return 1;
}
