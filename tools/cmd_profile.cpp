// depthkv profile: measures the per-layer loss curves of a model ("only layer l pruned to keep
// ratio r, all other layers full", for every layer and probed ratio, for each token scorer) on
// calibration windows of a text, and writes them as a profile file (JSON).

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/representation_probe.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "flag_alias.hpp"
#include "model_io.hpp"

namespace depthkv_cli {
namespace {

struct ProfileArgs {
  std::string model, tokenizer, text, tokens, output, scorers = "h2o,snapkv", ratios = "0.05,0.1,0.2,0.3,0.5,0.75";
  std::string metrics = "kl";
  std::string schedule = "oneshot";  ///< oneshot: evict once after the context; chunked: after every chunk
  int context = 384, continuation = 128, windows = 24, skip = 0, threads = 0, chunk = 1024, probe_samples = 64;
  bool resume = false;
  bool head_curves = false;  ///< also measure each scorer's per-(layer, KV head) curves
  SelectionSettings sel;
  PresetSettings preset;
  DocumentSettings docs;
};

/// What --metrics asks for: the loss metric of the curves (kl, dnll or top1; "" for none) and/or
/// the representation metrics ("infonce"; alone it skips the pruned runs).
struct MetricChoice {
  std::string loss_metric;
  bool infonce = false;
};

MetricChoice parse_metrics(const std::string& list) {
  MetricChoice c;
  for (const std::string& m : split_list(list)) {
    if (m == "infonce") {
      c.infonce = true;
    } else {
      depthkv::parse_loss_metric(m);
      DEPTHKV_CHECK(c.loss_metric.empty(), "--metrics: give at most one of kl, dnll, top1");
      c.loss_metric = m;
    }
  }
  DEPTHKV_CHECK(c.infonce || !c.loss_metric.empty(), "--metrics is empty");
  return c;
}

/// The recorded eviction chunk: 0 for oneshot, the chunk size for chunked.
int eviction_chunk(const ProfileArgs& a) { return a.schedule == "chunked" ? a.chunk : 0; }

/// The profile file to fill: the partial output file with --resume (checked to be measured with
/// these settings), else a new one describing this calibration.
depthkv::ProfileFile start_profile(const ProfileArgs& a, const std::vector<double>& keep_ratios, int n_layers,
                                   const std::string& src, const MetricChoice& metrics) {
  using namespace depthkv;
  ProfileFile out;
  if (a.resume && std::ifstream(a.output).good()) {
    out = load_profile(a.output, a.model);
    DEPTHKV_CHECK(out.calibration.text_file == src && out.calibration.context == a.context &&
                      out.calibration.continuation == a.continuation && out.calibration.skip == a.skip &&
                      out.calibration.samples == a.windows && out.keep_ratios == keep_ratios &&
                      out.calibration.eviction_chunk == eviction_chunk(a) &&
                      document_split(out.calibration.documents) == a.docs.split,
                  "--resume: '" << a.output
                                << "' was measured with other settings (text, document split, windows, ratios or schedule)");
    std::fprintf(stderr, "profile: resuming from %s\n", a.output.c_str());
    return out;
  }
  out.model = model_identity(a.model);
  out.n_layers = n_layers;
  out.keep_ratios = keep_ratios;
  out.metric = metrics.loss_metric.empty() ? "kl" : metrics.loss_metric;
  out.calibration.text_file = src;
  out.calibration.context = a.context;
  out.calibration.continuation = a.continuation;
  out.calibration.skip = a.skip;
  out.calibration.samples = a.windows;
  out.calibration.window_begin = a.skip;
  out.calibration.window_end = a.skip + a.windows;
  out.calibration.description = a.sel.describe() + (a.tokens.empty() ? " text" : " pre-tokenized");
  out.calibration.selection = a.sel.spec("h2o");
  out.calibration.eviction_chunk = eviction_chunk(a);
  if (a.tokens.empty()) out.calibration.documents = document_record(a.docs.split);
  return out;
}

/// The representation metrics (InfoNCE, effective rank, spectral entropy) into `out`: two
/// forward passes per probe story (the story and a copy with 10% of its words dropped), stories
/// taken right after the calibration windows. Saves `out`.
void probe_into(const ProfileArgs& a, const depthkv::llama::LlamaEngine& engine, const depthkv::llama::TextTokenizer* tok,
                depthkv::ProfileFile& out) {
  using namespace depthkv;
  using namespace depthkv::llama;
  DEPTHKV_CHECK(tok != nullptr, "--metrics infonce needs text and a tokenizer");
  DEPTHKV_CHECK(a.tokens.empty(), "--metrics infonce needs --text (it perturbs words)");
  const std::vector<std::string> stories = split_text(read_text_file(a.text), a.text, a.docs.split);
  const int first =
      first_story_after(*tok, stories, static_cast<long long>(a.skip + a.windows) * (a.context + a.continuation));
  DEPTHKV_CHECK(static_cast<long long>(stories.size()) >= first + static_cast<long long>(a.probe_samples),
                "'" << a.text << "' has " << stories.size() << " stories; the probe needs " << a.probe_samples
                    << " after story " << first);
  const std::vector<std::string> texts(stories.begin() + first, stories.begin() + first + a.probe_samples);
  ProbeOptions po;
  po.n_threads = a.threads;
  Progress pbar("profile infonce");
  po.progress = [&](int done, int total) { pbar.update(done, total); };
  const auto tp = std::chrono::steady_clock::now();
  write_layer_metrics(out, probe_representations(engine, *tok, texts, po));
  std::printf("representation metrics (InfoNCE, effective rank, spectral entropy; 4 stages) on stories %d..%d: %.2f s\n",
              first, first + a.probe_samples - 1, seconds_since(tp));
  save_profile(out, a.output);
}

/// One profiler run of `units` rows for the state `state` (resumed from it, checkpointed into it
/// and the output file after every unit).
void run_units(const ProfileArgs& a, int units, const depthkv::ProfilerOptions& popt, const std::string& label,
               const depthkv::LayerRunFunction& fn, depthkv::ProfilerState* state, depthkv::ProfileFile& out) {
  depthkv::SensitivityProfiler prof(units, popt);
  if (!state->done.empty()) prof.resume(*state);
  if (prof.state().complete()) return;
  Progress bar(label);
  prof.options().progress = [&](int done, int total) {
    bar.update(done, total);
    *state = prof.state();  // checkpoint: --resume continues from here
    depthkv::save_profile(out, a.output);
    return true;
  };
  prof.run_batched(fn);
  *state = prof.state();
}

/// Seconds and layer-token products of the layer curves and of the head curves.
struct CurveCost {
  double layer_s = 0, head_s = 0;
  long long layer_tokens = 0, head_tokens = 0;
};

/// Runs the profiler of every scorer not yet complete in `out`, and with --head-curves the head
/// profiler (n_layers x n_kv_heads units), checkpointing `out` to the output file as it goes;
/// saves `out`.
CurveCost measure_curves(const ProfileArgs& a, const depthkv::llama::PruningEvaluator& ev, int n_layers,
                         const std::vector<std::string>& scorer_names, const depthkv::ProfilerOptions& popt,
                         depthkv::ProfileFile& out) {
  using namespace depthkv;
  CurveCost cost;
  for (std::size_t s = 0; s < scorer_names.size(); ++s) {
    const std::string& name = scorer_names[s];
    auto t = std::chrono::steady_clock::now();
    long long tok = ev.layer_tokens_run();
    run_units(a, n_layers, popt, "profile " + name, ev.layer_function(static_cast<int>(s)), &out.scorers[name], out);
    cost.layer_s += seconds_since(t);
    cost.layer_tokens += ev.layer_tokens_run() - tok;
    if (!a.head_curves) continue;
    HeadCurves& hc = out.head_curves[name];
    hc.n_kv_heads = ev.n_kv_heads();
    t = std::chrono::steady_clock::now();
    tok = ev.layer_tokens_run();
    run_units(a, n_layers * ev.n_kv_heads(), popt, "profile " + name + " heads", ev.head_function(static_cast<int>(s)),
              &hc.state, out);
    cost.head_s += seconds_since(t);
    cost.head_tokens += ev.layer_tokens_run() - tok;
  }
  save_profile(out, a.output);
  return cost;
}

/// Each scorer's curves: mean loss per layer (rows) and keep ratio (columns) +- standard error.
void print_curves(const depthkv::ProfileFile& out, const std::vector<std::string>& scorer_names) {
  for (const std::string& name : scorer_names) {
    const depthkv::SensitivityProfile p = out.profile(name);
    std::printf("\nscorer %s: mean %s per layer (rows) and keep ratio (columns), +- standard error\n", name.c_str(),
                out.metric.c_str());
    std::printf("layer");
    for (double r : p.keep_ratios) std::printf("  %15.2f", r);
    std::printf("\n");
    for (int l = 0; l < p.n_layers(); ++l) {
      std::printf("%5d", l);
      for (int k = 0; k < p.n_ratios(); ++k)
        std::printf("  %7.4f+-%6.4f", p.loss(l, k), p.loss_stderr.size() ? p.loss_stderr(l, k) : 0.0);
      std::printf("\n");
    }
  }
}

/// The evaluation settings of the profiling runs: `scorer_cfgs` under `a`'s selection, chunking,
/// threads and schedule.
depthkv::llama::EvalConfig profile_eval_config(const ProfileArgs& a,
                                               const std::vector<depthkv::ScorerConfig>& scorer_cfgs) {
  depthkv::llama::EvalConfig ecfg;
  ecfg.scorers = scorer_cfgs;
  ecfg.spec.protection = a.sel.protection();
  ecfg.spec.head_split = {a.sel.head_allocation(), a.sel.head_alpha};
  ecfg.spec.schedule.chunk = a.chunk;
  ecfg.n_threads = a.threads;
  ecfg.chunked_plans = a.schedule == "chunked";
  return ecfg;
}

/// Prints where the profile went and what it cost (`cost` of `n_layers` x `n_ratios` x `n_scorers`
/// runs, and of the head curves when asked for) against one full pass of `full_s` seconds over
/// `ev`'s windows.
void print_cost(const ProfileArgs& a, const depthkv::llama::PruningEvaluator& ev, int n_layers,
                int n_kv_heads, std::size_t n_ratios, std::size_t n_scorers, const CurveCost& cost, double full_s) {
  using namespace depthkv::llama;
  const int L = n_layers;
  const double prof_s = cost.layer_s;

  // Cost: layer-token products of the plan runs against one full pass (context + continuation
  // through all layers) over the same windows.
  long long full_tokens = 0;
  for (const EvalWindow& w : ev.windows())
    full_tokens += static_cast<long long>(L) * static_cast<long long>(w.context.size() + w.continuation.size());
  const double equiv = static_cast<double>(cost.layer_tokens) / static_cast<double>(full_tokens);
  const int runs = L * static_cast<int>(n_ratios) * static_cast<int>(n_scorers);
  std::printf("profile written to %s\n", a.output.c_str());
  std::printf("cost: full evaluation pass %.3f s; profiling %.3f s = %.2f full passes for %d (layer, ratio, scorer) runs "
              "(naive: %d full passes); compute %.2f full-pass equivalents (layer-token products)\n",
              full_s, prof_s, prof_s / full_s, runs, runs, equiv);
  if (a.head_curves) {
    const int H = n_kv_heads;
    std::printf("cost of the head curves (%d layers x %d KV heads x %zu ratios x %zu scorers = %d runs): %.3f s = "
                "%.2f full passes, %.2fx the layer curves' time; compute %.2f full-pass equivalents (%.2fx the layer "
                "curves')\n",
                L, H, n_ratios, n_scorers, runs * H, cost.head_s, cost.head_s / full_s,
                prof_s > 0 ? cost.head_s / prof_s : 0.0, static_cast<double>(cost.head_tokens) / full_tokens,
                cost.layer_tokens > 0 ? static_cast<double>(cost.head_tokens) / static_cast<double>(cost.layer_tokens) : 0.0);
  }
}

void run_profile(const ProfileArgs& a) {
  using namespace depthkv;
  using namespace depthkv::llama;
  a.sel.check();
  DEPTHKV_CHECK(a.text.empty() != a.tokens.empty(), "give exactly one of --text FILE and --tokens FILE");
  DEPTHKV_CHECK(a.schedule == "oneshot" || a.schedule == "chunked",
                "--schedule must be oneshot or chunked, got '" << a.schedule << "'");
  const std::vector<std::string> scorer_names = split_list(a.scorers);
  DEPTHKV_CHECK(!scorer_names.empty(), "--scorers is empty");
  std::vector<ScorerConfig> scorer_cfgs;
  for (const std::string& s : scorer_names) scorer_cfgs.push_back(a.sel.scorer(s));
  ProfilerOptions popt;
  popt.keep_ratios = parse_doubles(a.ratios, "--ratios");
  const MetricChoice metrics = parse_metrics(a.metrics);

  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/a.tokens.empty());
  const LlamaEngine engine(lm.model);
  const int L = lm.model.config.n_layers;
  const long long window_len = static_cast<long long>(a.context) + a.continuation;
  DEPTHKV_CHECK(window_len <= lm.model.config.seq_len,
                "context + continuation = " << window_len << " exceeds the model's trained context "
                                            << lm.model.config.seq_len);
  check_lookahead(a.sel.lookahead, a.context, lm.model.config.seq_len, "context");
  const std::string src = a.text.empty() ? a.tokens : a.text;
  std::vector<EvalWindow> windows = load_windows(src, lm.tokenizer.get(), a.context, a.continuation, a.skip, a.windows,
                                                 !a.tokens.empty(), lm.model.config.vocab_size, a.docs.split);
  ProfileFile out = start_profile(a, popt.keep_ratios, L, src, metrics);
  out.layer_window = lm.model.config.layer_window;  // the allocator caps the local layers at their window
  out.kv_heads = lm.model.config.n_kv_heads;
  out.head_dim = lm.model.config.head_dim;

  if (metrics.infonce) {
    probe_into(a, engine, lm.tokenizer.get(), out);
    if (metrics.loss_metric.empty()) {
      std::printf("profile written to %s (representation metrics only)\n", a.output.c_str());
      return;
    }
  }

  const EvalConfig ecfg = profile_eval_config(a, scorer_cfgs);
  std::fprintf(stderr, "profile: %s, %d layers, %d windows of %d+%d tokens from %s%s, scorers %s%s\n",
               base_name(a.model).c_str(), L, a.windows, a.context, a.continuation, base_name(src).c_str(),
               a.docs.given && a.tokens.empty() ? (" (documents: " + a.docs.split.describe() + ")").c_str() : "",
               a.scorers.c_str(),
               ecfg.chunked_plans ? (", eviction after every " + std::to_string(a.chunk) + "-token chunk").c_str() : "");
  const auto t_full = std::chrono::steady_clock::now();
  const PruningEvaluator ev(engine, std::move(windows), ecfg);
  const double full_s = seconds_since(t_full);
  const CurveCost cost = measure_curves(a, ev, L, scorer_names, popt, out);
  print_cost(a, ev, L, lm.model.config.n_kv_heads, popt.keep_ratios.size(), scorer_names.size(), cost,
             full_s);
  print_curves(out, scorer_names);
}

}  // namespace

void register_profile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* c = app.add_subcommand("profile", "measure per-layer loss curves on calibration text and write a profile file");
  c->add_option("--model", a->model, "model file (llama2.c .bin or GGUF)")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file where the model file holds none (default: from the GGUF, or tok512.bin beside a .bin)");
  c->add_option("--text", a->text, "calibration text (cut into documents by --doc-opening or --doc-separator)");
  c->add_option("--tokens", a->tokens, "pre-tokenized calibration input: a file of token ids (instead of --text)");
  a->docs.add_options(c, "'Once upon a time' (TinyStories)");
  c->add_option("-o,--output", a->output, "profile file to write (JSON)")->required();
  c->add_option("--context", a->context, "context tokens per window (prefilled, then pruned)")
      ->capture_default_str()
      ->check(at_least(1));
  c->add_option("--continuation", a->continuation, "continuation tokens per window (scored)")
      ->capture_default_str()
      ->check(at_least(2));
  c->add_option("--windows", a->windows, "calibration windows")->capture_default_str()->check(at_least(1));
  c->add_option("--skip", a->skip, "windows skipped before the first calibration window")
      ->capture_default_str()
      ->check(at_least(0));
  c->add_option("--scorers", a->scorers, "token scorers to profile: any of h2o, h2o-v1, h2o-v2, snapkv, tova, knorm, keydiff, snapkv-keydiff")
      ->capture_default_str();
  c->add_option("--ratios", a->ratios, "probed layer keep ratios (each layer alone pruned to each)")->capture_default_str();
  CLI::Option* metrics =
      c->add_option("--metrics", a->metrics,
                    "loss metric of the curves (kl, dnll or top1) and/or infonce (representation metrics for the "
                    "mga/mlma policies), e.g. kl,infonce")
          ->capture_default_str();
  add_deprecated_alias(c, metrics, "--metric", a->metrics);  // renamed: a list is plural
  c->add_option("--probe-samples", a->probe_samples, "stories probed by --metrics infonce (after the calibration windows)")
      ->capture_default_str()
      ->check(at_least(1));
  a->sel.add_options(c, /*old_window=*/"--recent N --obs-window N (--window N set both)");
  c->add_option("--chunk", a->chunk, "prefill chunk size (chunked: eviction after every chunk)")
      ->capture_default_str()
      ->check(at_least(1));
  c->add_option("--schedule", a->schedule,
                "oneshot: measure each layer pruned once after the context; chunked: after every prefill chunk "
                "(as eval --schedule chunked evicts)")
      ->capture_default_str();
  c->add_option("--threads", a->threads, "threads (0: OpenMP default)")->capture_default_str()->check(thread_count());
  c->add_flag("--resume", a->resume, "continue an interrupted run from the partial output file");
  c->add_flag("--head-curves", a->head_curves,
              "also measure every scorer's per-(layer, KV head) curves (only that head pruned; n_kv_heads times "
              "the runs), for eval/allocate's head-optimal policy");
  a->preset.add_option(c, {"--scorers", "--pooling", "--output-aware", "--head-alloc", "--head-alpha", "--head-curves"});
  c->callback([a] {
    a->preset.apply(a->sel, &a->scorers, nullptr, &a->head_curves);
    // the preset's curves are its lookahead scorer's: the context weight blends the scores at
    // pruning time and the budgets stay these curves' (PruneSpec::same_selection)
    if (a->preset.active() && !a->preset.context_weight(a->sel)) a->sel.context_weight = 0.0;
    run_profile(*a);
  });
}

}  // namespace depthkv_cli
