// depthkv generate: text generation exactly as llama2.c's `run` prints it (stdout), optionally on
// a KV cache pruned after the prompt's prefill (score, allocate per-layer budgets, evict).
// Timings go to stderr only.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>


#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/llama/sampler.hpp"
#include "depthkv/preset.hpp"
#include "model_io.hpp"
#include "policy_request.hpp"

namespace depthkv_cli {
namespace {

struct GenerateArgs {
  std::string model, tokenizer, prompt, profile;
  int steps = 256;
  float temperature = 1.0f;
  float topp = 0.9f;
  unsigned long long seed = 0;
  double keep = 1.0;
  std::string policy = "uniform", scorer = "h2o";
  int chunk = 1024, threads = 0;
  long long max_kv_tokens = -1;  ///< bounded memory: KV tokens over all layers (-1: off)
  int interval = 32;             ///< with max_kv_tokens: evict every this many tokens
  bool span_pooling = false;     ///< ScorerConfig::span_pooling over the prompt's words and digit runs
  int stats_every = 0;           ///< a memory line on stderr every this many decoded tokens (0: none)
  bool ignore_eos = false;       ///< generate past end-of-generation tokens
  std::string kv_type = depthkv::llama::kv_type_name(depthkv::llama::kDefaultKvType);  ///< f16 or f32
  SelectionSettings sel;  ///< the selection flags, with profile's and eval's defaults
  PresetSettings preset;
};

/// @throws depthkv::Error on a bad combination of the arguments (before anything is loaded)
void check_generate_args(const GenerateArgs& a) {
  check_keep(a.keep, "--keep");
  a.sel.check();
  DEPTHKV_CHECK(a.steps >= 0, "--steps must be >= 0, got " << a.steps);
  DEPTHKV_CHECK(std::isfinite(a.temperature) && a.temperature >= 0.0f,
                "--temperature must be a number >= 0, got " << a.temperature);
  DEPTHKV_CHECK(a.topp >= 0.0f && a.topp <= 1.0f, "--topp must be in [0, 1], got " << a.topp);
  DEPTHKV_CHECK(a.max_kv_tokens == -1 || a.max_kv_tokens >= 1, "--max-kv-tokens must be >= 1, got " << a.max_kv_tokens);
  DEPTHKV_CHECK(a.chunk >= 1, "--chunk must be >= 1, got " << a.chunk);
  depthkv::llama::check_thread_count(a.threads, "--threads");
  DEPTHKV_CHECK(a.max_kv_tokens < 0 || a.keep >= 1.0, "give --keep or --max-kv-tokens, not both");
  DEPTHKV_CHECK(a.interval >= 1, "--interval must be >= 1, got " << a.interval);
  DEPTHKV_CHECK(a.stats_every >= 0, "--stats-every must be >= 0, got " << a.stats_every);
  (void)depthkv::llama::parse_kv_type(a.kv_type);
}

/// The positions of one run: the prompt's tokens, those prefilled, and the positions run.
struct RunShape {
  std::vector<int> prompt;
  int n_feed = 0, steps = 0;
};

/// The spec of this run (--keep: oneshot after the prompt; --max-kv-tokens: a chunked schedule
/// with a token total), its scorer chosen by depthkv::preset with --preset (lengths: the
/// prompt's with --keep, the whole run's with --max-kv-tokens).
depthkv::PruneSpec generate_spec(const GenerateArgs& a, const depthkv::ProfileFile* file, int n_layers,
                                 const RunShape& run) {
  using namespace depthkv;
  const bool bounded = a.max_kv_tokens >= 0;
  const AllocationPolicy policy = parse_allocation_policy(a.policy);
  std::string scorer = a.scorer;
  if (a.preset.active() && (a.keep < 1.0 || bounded)) {
    DEPTHKV_CHECK(file, "--preset " << a.preset.name << " needs --profile with head curves");
    const std::vector<int> lengths(static_cast<std::size_t>(n_layers), bounded ? run.steps : run.n_feed);
    PruneSpec base = request_spec(a.sel, "h2o", a.keep, policy, -1);
    if (bounded) base.budget = Budget::tokens(std::min<long long>(a.max_kv_tokens, static_cast<long long>(n_layers) * run.steps));
    const PresetChoice c = preset(a.preset.name, *file, base, lengths, a.sel.lookahead, a.sel.context_weight);
    scorer = scorer_name(c.spec.scorer);
    std::fprintf(stderr, "kv cache: --preset %s: scorer %s (predicted loss %s)\n", a.preset.name.c_str(),
                 scorer.c_str(), describe_predicted(c.predicted).c_str());
  } else if (a.preset.active()) {
    scorer = a.preset.candidates().front();  // nothing is evicted
  }
  PruneSpec spec = request_spec(a.sel, scorer, a.keep, policy, -1);
  if (bounded && spec.scorer.lookahead > 0 && a.preset.active() && !a.preset.lookahead_given()) {
    // a schedule evicts while the prompt is read, before any lookahead could run
    spec.scorer.lookahead = 0;
    spec.scorer.context_weight = 0.0;
    std::fprintf(stderr, "kv cache: --preset %s: no lookahead with --max-kv-tokens (the schedule evicts during the prefill)\n",
                 a.preset.name.c_str());
  }
  if (bounded) {
    spec.budget = Budget::tokens(a.max_kv_tokens);
    spec.schedule = {ScheduleMode::kChunked, a.chunk, a.interval};
  }
  return spec;
}

/// What the spec's policy reads from --profile (nothing without one; refused when it needs one).
depthkv::PolicyCurves generate_curves(const depthkv::PruneSpec& spec, const depthkv::ProfileFile* file,
                                      const SelectionSettings& sel) {
  using namespace depthkv;
  const std::string scorer = scorer_name(spec.scorer);
  DEPTHKV_CHECK(file || !is_head_policy(spec.policy), "policy " << kHeadOptimal << " needs --profile with head curves");
  BudgetRequest unused;
  SensitivityProfile none;
  if (!file) {
    add_profile_inputs(spec.policy, nullptr, scorer, unused, none);  // refuses what needs a profile
    return {};
  }
  if (policy_needs_profile(spec.policy)) std::fputs(selection_note(spec.policy, *file, sel).c_str(), stderr);
  return policy_curves(*file, scorer, spec.policy);
}

/// The driver's report of the prompt's pruning (stderr): the preset rule's verdict, the budgets.
void report_prune(const GenerateArgs& a, const depthkv::llama::GenerationReport& r, int n_feed, int vocab_size) {
  using namespace depthkv;
  if (r.rule_ran)
    std::fprintf(stderr, "kv cache: --preset %s: normalized NLL of the prompt's last %d tokens %.3f (trusted up to %.2f): %s\n",
                 a.preset.name.c_str(), r.nll_tokens, normalized_nll(r.context_nll, vocab_size), kPresetMaxNormalizedNll,
                 r.trusted ? "the preset's spec" : "its fallback, plain SnapKV with uniform budgets");
  if (!r.pruned) return;
  if (r.raised_to_protection)
    std::fprintf(stderr, "kv cache: keep %.3f of the prompt's %d tokens is below the protected %d sinks + %d recent "
                         "tokens per layer: the protected tokens are kept\n",
                 a.keep, n_feed, r.spec.protection.n_sink, r.spec.protection.n_recent);
  std::fprintf(stderr, "kv cache: %s/%s keep %.3f -> per-layer tokens", scorer_name(r.spec.scorer).c_str(),
               to_string(r.spec.policy).c_str(), a.keep);
  for (int b : r.prune.budgets) std::fprintf(stderr, " %d", b);
  std::fprintf(stderr, " of %d; %zu of %zu bytes", n_feed, r.prune.bytes_after, r.prune.bytes_before);
  if (r.lookahead > 0) std::fprintf(stderr, "; scored by the next %d greedy tokens (lookahead)", r.lookahead);
  if (r.spec.scorer.span_pooling) std::fprintf(stderr, "; scores pooled over the prompt's words and digit runs");
  std::fprintf(stderr, "\n");
}

/// Resident memory of this process (VmRSS of /proc/self/status) in MiB; 0 where it is not available.
double resident_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0.0;
  char line[256];
  double kb = 0.0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb / 1024.0;
}

/// --stats-every: one line (stderr) on the memory after `decoded` tokens: resident memory, the KV
/// bytes, the tokens held over all layers and the largest layer; with --max-kv-tokens the bound
/// they stay within (the budget plus one interval per layer, the schedule's guarantee).
template <class Cache>
void report_stats(const GenerateArgs& a, const depthkv::llama::PrunedGeneration<Cache>& g, int decoded) {
  long long held = 0;
  int largest = 0;
  for (int n : g.cache().lengths()) {
    held += n;
    largest = std::max(largest, n);
  }
  std::fprintf(stderr, "stats: decoded %d, position %d, rss %.1f MiB, kv %zu bytes, held %lld tokens (largest layer %d)",
               decoded, g.position(), resident_mib(), g.cache().bytes(), held, largest);
  if (a.max_kv_tokens >= 0)
    std::fprintf(stderr, ", bound %lld", a.max_kv_tokens + static_cast<long long>(g.cache().n_layers()) * a.interval);
  std::fprintf(stderr, "\n");
}

/// run.c's generation loop after the prefill (stdout), decoding on the (pruned) cache;
/// `after_step(decoded)` after each decoded token.
/// @return the decoded tokens
template <class Cache, class AfterStep>
int generate_tokens(depthkv::llama::PrunedGeneration<Cache>& g, const depthkv::llama::TextTokenizer& tok,
                    depthkv::llama::Sampler& sampler, const RunShape& run, const depthkv::llama::RowMatrix& prompt_logits,
                    bool ignore_eos, AfterStep&& after_step) {
  const int n_prompt = static_cast<int>(run.prompt.size());
  int token = run.prompt[0], pos = 0, decoded = 0;
  while (pos < run.steps) {
    int next;
    if (pos < n_prompt - 1) {
      next = run.prompt[static_cast<std::size_t>(pos) + 1];
    } else if (pos == run.n_feed - 1) {
      next = sampler.sample(prompt_logits.row(0).transpose());
    } else {
      next = sampler.sample(g.step(token).row(0).transpose());
      after_step(++decoded);
    }
    ++pos;
    if (!ignore_eos && (next == tok.bos_id() || tok.ends_generation(next))) break;  // BOS (=1) delimits sequences; BPE: EOS/EOT
    const std::string piece = tok.printable(tok.decode(token, next));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    token = next;
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  return decoded;
}

/// The bounded run's memory line (stderr).
template <class Cache>
void report_bounded(const GenerateArgs& a, const depthkv::llama::LlamaConfig& cfg,
                    const depthkv::llama::GenerationReport& r) {
  const std::size_t token_bytes = static_cast<std::size_t>(cfg.n_layers) * static_cast<std::size_t>(cfg.n_kv_heads) *
                                  static_cast<std::size_t>(cfg.head_dim) * 2 *
                                  sizeof(typename Cache::LayerType::Scalar);
  std::fprintf(stderr,
               "kv cache: max %lld tokens (interval %d), %d evictions; peak %zu bytes, full cache would hold %zu "
               "bytes (%lld positions)\n",
               a.max_kv_tokens, a.interval, r.evictions, r.peak_bytes,
               token_bytes * static_cast<std::size_t>(r.tokens_seen), r.tokens_seen);
}

/// The lookahead's cost line (stderr), apart from the prefill's and the decode's: nothing when
/// no lookahead ran.
void report_lookahead(const depthkv::llama::GenerationReport& r) {
  if (r.lookahead <= 0) return;
  std::fprintf(stderr,
               "lookahead: %d decode steps on the full prompt cache (%d extra KV slots per head) in %.2f ms (%.0f%% "
               "of the prefill's time)\n",
               r.lookahead, r.lookahead, r.lookahead_ms, r.prefill_ms > 0 ? 100.0 * r.lookahead_ms / r.prefill_ms : 0.0);
}

/// The prefill, the pruning and the generation on a cache of type `Cache` (the library's
/// driver, `PrunedGeneration`), then the timing lines (stderr).
template <class Cache>
void generate_on(Cache cache, const depthkv::llama::LlamaEngine& engine, const depthkv::llama::TextTokenizer& tok,
                 depthkv::llama::Sampler& sampler, const GenerateArgs& a, const depthkv::PruneSpec& spec,
                 const depthkv::PolicyCurves& curves, const depthkv::llama::OutputProjections& wo, const RunShape& run) {
  using namespace depthkv::llama;
  const bool prunes = a.keep < 1.0 || a.max_kv_tokens >= 0;
  ForwardOptions opt;
  opt.chunk_size = a.chunk;
  opt.n_threads = a.threads;
  // the preset's per-input rule: only with --keep (a bounded run evicts before the prompt's NLL is known)
  const std::string rule = a.preset.active() && a.keep < 1.0 ? a.preset.name : "";
  PrunedGeneration<Cache> g(engine, std::move(cache), prunes ? std::optional<depthkv::PruneSpec>(spec) : std::nullopt,
                            curves, &wo, opt, rule);
  const std::vector<int> fed(run.prompt.begin(), run.prompt.begin() + run.n_feed);
  const RowMatrix logits = g.prefill(fed);
  report_prune(a, g.report(), run.n_feed, engine.config().vocab_size);
  const auto t_decode = std::chrono::steady_clock::now();
  const int decoded = generate_tokens(g, tok, sampler, run, logits, a.ignore_eos, [&](int n) {
    if (a.stats_every > 0 && n % a.stats_every == 0) report_stats(a, g, n);
  });
  const double decode_ms = 1000.0 * seconds_since(t_decode);
  const GenerationReport& r = g.report();
  if (a.max_kv_tokens >= 0) report_bounded<Cache>(a, engine.config(), r);
  std::fprintf(stderr, "prefill: %d tokens in %.2f ms (%.1f tok/s); decode: %d tokens in %.2f ms (%.1f tok/s)\n",
               run.n_feed, r.prefill_ms, r.prefill_ms > 0 ? 1000.0 * run.n_feed / r.prefill_ms : 0.0, decoded,
               decode_ms, decode_ms > 0 ? 1000.0 * decoded / decode_ms : 0.0);
  report_lookahead(r);
}

/// The preset's own lookahead (not one given with --lookahead) shortened to the model's context
/// left after the prompt, with a note on stderr.
void fit_preset_lookahead(const GenerateArgs& a, int seq_len, const RunShape& run, depthkv::PruneSpec& spec) {
  if (a.keep >= 1.0 || !a.preset.active() || a.preset.lookahead_given() || spec.scorer.lookahead <= seq_len - run.n_feed)
    return;
  spec.scorer.lookahead = std::max(0, seq_len - run.n_feed);
  if (spec.scorer.lookahead == 0) spec.scorer.context_weight = 0.0;
  std::fprintf(stderr, "kv cache: --preset %s: lookahead shortened to %d tokens (the model's context of %d holds a prompt of %d)\n",
               a.preset.name.c_str(), spec.scorer.lookahead, seq_len, run.n_feed);
}

void run_generate(const GenerateArgs& a) {
  using namespace depthkv;
  using namespace depthkv::llama;
  check_generate_args(a);
  parse_allocation_policy(a.policy);
  // the profile (curve-based and InfoNCE-guided policies), checked against the model first
  std::unique_ptr<ProfileFile> file;
  if (!a.profile.empty()) file = std::make_unique<ProfileFile>(load_profile(a.profile, a.model));
  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/true);
  const LlamaConfig& cfg = lm.model.config;
  if (file) check_profile_matches(*file, cfg, a.model);
  const LlamaEngine engine(lm.model);
  // As run.c: seed 0 -> time, steps 0 or beyond the context -> seq_len.
  const unsigned long long seed = a.seed > 0 ? a.seed : static_cast<unsigned long long>(std::time(nullptr));
  Sampler sampler(cfg.vocab_size, a.temperature, a.topp, seed);
  RunShape run;
  run.steps = a.steps == 0 || a.steps > cfg.seq_len ? cfg.seq_len : a.steps;
  run.prompt = lm.tokenizer->encode(a.prompt, /*bos=*/true, /*eos=*/false);
  DEPTHKV_CHECK(!run.prompt.empty(), "the prompt encodes to no tokens");
  run.n_feed = std::min(static_cast<int>(run.prompt.size()), run.steps);
  PruneSpec spec = generate_spec(a, file.get(), cfg.n_layers, run);
  fit_preset_lookahead(a, cfg.seq_len, run, spec);
  if (a.keep < 1.0 && spec.scorer.lookahead > 0) check_lookahead(spec.scorer.lookahead, run.n_feed, cfg.seq_len, "prompt");
  const bool prunes = a.keep < 1.0 || a.max_kv_tokens >= 0;
  spec.scorer.span_pooling = a.span_pooling;
  PolicyCurves curves = prunes ? generate_curves(spec, file.get(), a.sel) : PolicyCurves{};
  if (a.span_pooling) curves.span_start = token_span_starts(*lm.tokenizer, run.prompt);
  // output-aware: every layer's wo as float (a copy of the layers stored as F16 or quantized)
  const OutputProjections wo = spec.scorer.output_aware ? OutputProjections(lm.model) : OutputProjections();
  if (parse_kv_type(a.kv_type) == KvType::kF16) {
    generate_on(engine.make_cache<Eigen::half>(), engine, *lm.tokenizer, sampler, a, spec, curves, wo, run);
  } else {
    generate_on(engine.make_cache(), engine, *lm.tokenizer, sampler, a, spec, curves, wo, run);
  }
}

/// The options of how generate runs: the prefill chunk, bounded memory, threads, span pooling,
/// the KV type, the memory lines and end-of-generation tokens.
void add_run_options(CLI::App* cmd, GenerateArgs& a) {
  cmd->add_option("--chunk", a.chunk, "prefill chunk size")->capture_default_str()->check(at_least(1));
  cmd->add_option("--max-kv-tokens", a.max_kv_tokens,
                  "bounded memory: at most this many KV tokens over all layers (plus one interval), evicting after "
                  "every prefill chunk and every --interval decoded tokens")
      ->check(at_least(1));
  cmd->add_option("--interval", a.interval, "with --max-kv-tokens: evict every this many tokens")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--threads", a.threads, "threads (0: OpenMP default)")
      ->capture_default_str()
      ->check(thread_count());
  cmd->add_flag("--span-pooling", a.span_pooling,
               "score each word and digit run of the prompt as its best token, so that a number or a name is "
               "kept or dropped whole (ScorerConfig::span_pooling; with --keep or --max-kv-tokens)");
  cmd->add_option("--kv-type", a.kv_type,
                  "element type of the KV cache: f16 (half the bytes, as llama.cpp) or f32 (llama2.c's run.c)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}));
  cmd->add_option("--stats-every", a.stats_every,
                  "every this many decoded tokens, a line on stderr: resident memory (VmRSS), KV bytes, tokens held "
                  "(with --max-kv-tokens: and the bound they stay within); 0: none")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_flag("--ignore-eos", a.ignore_eos,
                "keep generating past end-of-generation tokens (BOS, EOS, EOT) until --steps, e.g. for long runs");
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd =
      app.add_subcommand("generate", "generate text as llama2.c's run (optionally on a pruned KV cache)");
  cmd->add_option("-m,--model", args->model, "model file: llama2.c checkpoint (.bin) or GGUF")->required();
  cmd->add_option("-z,--tokenizer", args->tokenizer,
                  "tokenizer file where the model file holds none (default: from the GGUF, or tok512.bin beside a .bin)");
  cmd->add_option("-i,--prompt", args->prompt, "prompt text (default: empty, generation starts from BOS)");
  cmd->add_option("-n,--steps", args->steps,
                  "number of positions to run, prompt included (0: the model's seq_len)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("-t,--temperature", args->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(at_least(0));
  cmd->add_option("-p,--topp", args->topp, "top-p (nucleus) threshold in [0, 1]")
      ->capture_default_str()
      ->check(in_range(0, 1));
  cmd->add_option("-s,--seed", args->seed, "random seed (0: the current time, as run.c)")
      ->capture_default_str()
      ->check(in_range(0, 18446744073709551615.0L));
  cmd->add_option("--keep", args->keep,
                  "global KV keep ratio in (0, 1] after the prompt's prefill (1: no eviction)")
      ->capture_default_str()
      ->check(finite_number());
  cmd->add_option("--policy", args->policy,
                  "per-layer budget policy: " + depthkv::allocation_policy_names() + ", or " + kHeadOptimal +
                      " (per KV head; proportional, optimal, mga, mlma* and head-optimal need --profile, "
                      "head-optimal one with head curves)")
      ->capture_default_str();
  cmd->add_option("--profile", args->profile,
                  "profile file of this model (from depthkv profile) for the curve-based policies, measured "
                  "with the same scorer and selection (--sinks, --recent, --obs-window, --kernel, --pooling)");
  cmd->add_option("--scorer", args->scorer, "token scorer: h2o, h2o-v1, h2o-v2, snapkv, tova, knorm, keydiff, snapkv-keydiff")
      ->capture_default_str();
  args->sel.add_options(cmd, /*old_window=*/"--obs-window N", /*old_sink=*/true);
  add_run_options(cmd, *args);
  args->preset.add_option(cmd, {"--policy", "--scorer", "--pooling", "--output-aware", "--head-alloc", "--head-alpha"});
  cmd->callback([args]() {
    args->preset.apply(args->sel, &args->scorer, &args->policy);
    run_generate(*args);
  });
}

}  // namespace depthkv_cli
