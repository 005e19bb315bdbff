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
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/sampler.hpp"
#include "depthkv/token_scorer.hpp"
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
  SelectionSettings sel = SelectionSettings::generate();
  PresetSettings preset;
};

/// What both pruning modes (--keep, --max-kv-tokens) give the allocator besides the budget: the
/// observation window, the safeguard floor (protected tokens + margin, as eval) and the profile's
/// curves. @return the curves (in `curves`) for the curve-based policies, else nullptr
const depthkv::SensitivityProfile* add_policy_inputs(const GenerateArgs& a, const std::string& scorer,
                                                     depthkv::AllocationPolicy policy, const depthkv::ProfileFile* file,
                                                     depthkv::BudgetRequest& b, depthkv::SensitivityProfile& curves) {
  b.window = a.sel.obs_window;
  b.min_tokens = depthkv::safeguard_floor(a.sel.protection());
  b.safeguard_shrink = true;
  if (!add_profile_inputs(policy, file, scorer, b, curves)) return nullptr;
  std::fputs(selection_note(policy, *file, a.sel).c_str(), stderr);
  return &curves;
}

void run_generate(const GenerateArgs& a) {
  using namespace depthkv;
  using namespace depthkv::llama;
  check_keep(a.keep);
  a.sel.check();
  DEPTHKV_CHECK(a.steps >= 0, "--steps must be >= 0, got " << a.steps);
  DEPTHKV_CHECK(std::isfinite(a.temperature) && a.temperature >= 0.0f,
                "--temperature must be a number >= 0, got " << a.temperature);
  DEPTHKV_CHECK(a.topp >= 0.0f && a.topp <= 1.0f, "--topp must be in [0, 1], got " << a.topp);
  DEPTHKV_CHECK(a.max_kv_tokens == -1 || a.max_kv_tokens >= 1, "--max-kv-tokens must be >= 1, got " << a.max_kv_tokens);
  DEPTHKV_CHECK(a.chunk >= 1, "--chunk must be >= 1, got " << a.chunk);
  depthkv::llama::check_thread_count(a.threads, "--threads");
  const bool bounded = a.max_kv_tokens >= 0;
  DEPTHKV_CHECK(!bounded || a.keep >= 1.0, "give --keep or --max-kv-tokens, not both");
  DEPTHKV_CHECK(a.interval >= 1, "--interval must be >= 1, got " << a.interval);
#ifdef _OPENMP
  if (a.threads > 0) omp_set_num_threads(a.threads);
#endif
  const AllocationPolicy policy = parse_allocation_policy(a.policy);
  const HeadAllocation head_alloc = a.sel.head_allocation();

  // the profile (curve-based and InfoNCE-guided policies), checked against the model first
  std::unique_ptr<ProfileFile> profile_file;
  if (!a.profile.empty()) profile_file = std::make_unique<ProfileFile>(load_profile(a.profile, a.model));
  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/true);
  DEPTHKV_CHECK(
      !profile_file || profile_file->n_layers == lm.model.config.n_layers,
      "the profile has " << profile_file->n_layers << " layers, the model " << lm.model.config.n_layers);
  const TextTokenizer& tok = *lm.tokenizer;
  const LlamaEngine engine(lm.model);
  const LlamaConfig& cfg = lm.model.config;

  // As run.c: seed 0 -> time, steps 0 or beyond the context -> seq_len (a negative --steps, a
  // negative or non-finite temperature and a top-p outside [0, 1] are refused when parsed).
  const unsigned long long seed = a.seed > 0 ? a.seed : static_cast<unsigned long long>(std::time(nullptr));
  Sampler sampler(cfg.vocab_size, a.temperature, a.topp, seed);
  int steps = a.steps;
  if (steps == 0 || steps > cfg.seq_len) steps = cfg.seq_len;

  const std::vector<int> prompt = tok.encode(a.prompt, /*bos=*/true, /*eos=*/false);
  DEPTHKV_CHECK(!prompt.empty(), "the prompt encodes to no tokens");
  const int n_prompt = static_cast<int>(prompt.size());
  const int n_feed = std::min(n_prompt, steps);

  // --preset: the candidate scorer of the lowest predicted loss for this request (lengths: the
  // prompt's with --keep, the whole run's with --max-kv-tokens)
  std::string scorer = a.scorer;
  if (a.preset.active() && (a.keep < 1.0 || bounded)) {
    DEPTHKV_CHECK(profile_file, "--preset " << a.preset.name << " needs --profile with head curves");
    const std::vector<int> lengths(static_cast<std::size_t>(cfg.n_layers), bounded ? steps : n_feed);
    PruneSpec base = request_spec(a.sel, "h2o", a.keep, policy, -1);
    if (bounded) base.budget = Budget::tokens(std::min<long long>(a.max_kv_tokens, static_cast<long long>(cfg.n_layers) * steps));
    const PresetChoice c = preset(a.preset.name, *profile_file, base, lengths, a.sel.lookahead);
    scorer = to_string(c.spec.scorer.kind);
    std::fprintf(stderr, "kv cache: --preset %s: scorer %s (predicted loss %s)\n", a.preset.name.c_str(),
                 scorer.c_str(), describe_predicted(c.predicted).c_str());
  } else if (a.preset.active()) {
    scorer = a.preset.candidates().front();  // nothing is evicted
  }
  ScorerConfig scfg = a.sel.scorer(scorer);
  if (bounded && scfg.lookahead > 0 && a.preset.active() && !a.preset.lookahead_given()) {
    // a schedule evicts while the prompt is read, before any lookahead could run
    scfg.lookahead = 0;
    std::fprintf(stderr, "kv cache: --preset %s: no lookahead with --max-kv-tokens (the schedule evicts during the prefill)\n",
                 a.preset.name.c_str());
  }
  if (a.keep < 1.0 && scfg.lookahead > 0) check_lookahead(scfg.lookahead, n_feed, cfg.seq_len, "prompt");
  // output-aware: every layer's wo as float (a copy of the layers stored as F16 or quantized)
  const OutputProjections wo = scfg.output_aware ? OutputProjections(lm.model) : OutputProjections();
  // head-optimal: the profile's head curves of the scorer
  SensitivityProfile head_curves;
  if (is_head_policy(policy)) {
    DEPTHKV_CHECK(profile_file, "policy " << kHeadOptimal << " needs --profile with head curves");
    head_curves = profile_file->head_profile(scorer);
  }
  const SensitivityProfile* head_profile = is_head_policy(policy) ? &head_curves : nullptr;

  // Prefill the prompt tokens run.c would forward (positions 0..n_feed-1) as one batch.
  HostCache cache = engine.make_cache();
  const bool prune = a.keep < 1.0;
  std::vector<TokenScorer> scorers;
  ForwardOptions opt;
  opt.chunk_size = a.chunk;
  opt.all_logits = false;
  if (prune) {
    scorers = make_scorers(cfg, scfg);
    if (scfg.lookahead == 0) opt.observer = observe_into(scorers);  // else: observe_lookahead after the prefill
  }
  // bounded memory: an EvictionSchedule evicting after every prefill chunk and every `interval`
  // decoded tokens down to --max-kv-tokens
  SensitivityProfile bounded_curves;
  std::unique_ptr<EvictionSchedule> schedule;
  std::size_t peak_bytes = 0;
  if (bounded) {
    ScheduleConfig sc;
    sc.policy = policy;
    sc.budget.total_tokens = a.max_kv_tokens;
    sc.protection = a.sel.protection();
    sc.scorer = scfg;
    sc.interval = a.interval;
    sc.head_allocation = head_alloc;
    sc.head_alpha = a.sel.head_alpha;
    sc.output_projections = scfg.output_aware ? &wo.views() : nullptr;
    sc.profile = add_policy_inputs(a, scorer, policy, profile_file.get(), sc.budget, bounded_curves);
    sc.head_profile = head_profile;
    schedule = std::make_unique<EvictionSchedule>(sc, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads);
    opt.observer = schedule->observer();
    opt.after_chunk = [&](int, std::int32_t) {
      peak_bytes = std::max(peak_bytes, cache.bytes());
      schedule->after_chunk(cache);
    };
  }
  const auto t_prefill = std::chrono::steady_clock::now();
  const RowMatrix prefill_logits =
      engine.prefill(std::vector<int>(prompt.begin(), prompt.begin() + n_feed), 0, cache, opt);
  const double prefill_ms = 1000.0 * seconds_since(t_prefill);
  if (prune) {
    if (scfg.lookahead > 0) observe_lookahead(engine, cache, last_argmax(prefill_logits), n_feed, {&scorers});
    PruneRequest req;
    req.policy = policy;
    req.budget.keep_ratio = a.keep;
    req.protection = a.sel.protection();
    req.head_allocation = head_alloc;
    req.head_alpha = a.sel.head_alpha;
    req.output_projections = scfg.output_aware ? &wo.views() : nullptr;
    SensitivityProfile curves;
    req.profile = add_policy_inputs(a, scorer, policy, profile_file.get(), req.budget, curves);
    req.head_profile = head_profile;
    const PruneReport rep = score_and_evict(cache, scorers, req);
    std::fprintf(stderr, "kv cache: %s/%s keep %.3f -> per-layer tokens", scorer.c_str(), a.policy.c_str(),
                 a.keep);
    for (int b : rep.budgets) std::fprintf(stderr, " %d", b);
    std::fprintf(stderr, " of %d; %zu of %zu bytes", n_feed, rep.bytes_after, rep.bytes_before);
    if (scfg.lookahead > 0) std::fprintf(stderr, "; scored by the next %d greedy tokens (lookahead)", scfg.lookahead);
    std::fprintf(stderr, "\n");
  }

  // run.c's generation loop.
  const auto t_decode = std::chrono::steady_clock::now();
  int token = prompt[0];
  int pos = 0;
  int decoded = 0;
  while (pos < steps) {
    int next;
    if (pos < n_prompt - 1) {
      next = prompt[static_cast<std::size_t>(pos) + 1];
    } else if (pos == n_feed - 1) {
      next = sampler.sample(prefill_logits.row(0).transpose());
    } else {
      if (bounded) {
        ForwardOptions dopt;
        dopt.observer = schedule->observer();
        const RowMatrix l = engine.forward(&token, 1, pos, cache, dopt);
        peak_bytes = std::max(peak_bytes, cache.bytes());
        schedule->after_decode_step(cache);
        next = sampler.sample(l.row(0).transpose());
      } else {
        next = sampler.sample(engine.decode(token, pos, cache));
      }
      ++decoded;
    }
    ++pos;
    if (next == tok.bos_id() || tok.ends_generation(next)) break;  // BOS (=1) delimits sequences; BPE: EOS/EOT
    const std::string piece = tok.printable(tok.decode(token, next));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    token = next;
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double decode_ms = 1000.0 * seconds_since(t_decode);
  if (bounded) {
    peak_bytes = std::max(peak_bytes, cache.bytes());
    const std::size_t token_bytes = static_cast<std::size_t>(cfg.n_layers) * static_cast<std::size_t>(cfg.n_kv_heads) *
                                    static_cast<std::size_t>(cfg.head_dim) * 2 * sizeof(float);
    std::fprintf(stderr,
                 "kv cache: max %lld tokens (interval %d), %d evictions; peak %zu bytes, full cache would hold %zu "
                 "bytes (%lld positions)\n",
                 a.max_kv_tokens, a.interval, schedule->n_evictions(), peak_bytes,
                 token_bytes * static_cast<std::size_t>(schedule->tokens_seen()), schedule->tokens_seen());
  }
  std::fprintf(stderr,
               "prefill: %d tokens in %.2f ms (%.1f tok/s); decode: %d tokens in %.2f ms (%.1f tok/s)\n",
               n_feed, prefill_ms, prefill_ms > 0 ? 1000.0 * n_feed / prefill_ms : 0.0, decoded, decode_ms,
               decode_ms > 0 ? 1000.0 * decoded / decode_ms : 0.0);
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
  cmd->add_option("--scorer", args->scorer, "token scorer: h2o, h2o-v1, h2o-v2, snapkv, tova, knorm")
      ->capture_default_str();
  args->sel.add_options(cmd, /*old_window=*/"--obs-window N", /*old_sink=*/true);
  cmd->add_option("--chunk", args->chunk, "prefill chunk size")->capture_default_str()->check(at_least(1));
  cmd->add_option("--max-kv-tokens", args->max_kv_tokens,
                  "bounded memory: at most this many KV tokens over all layers (plus one interval), evicting after "
                  "every prefill chunk and every --interval decoded tokens")
      ->check(at_least(1));
  cmd->add_option("--interval", args->interval, "with --max-kv-tokens: evict every this many tokens")
      ->capture_default_str()
      ->check(at_least(1));
  cmd->add_option("--threads", args->threads, "threads (0: OpenMP default)")
      ->capture_default_str()
      ->check(thread_count());
  args->preset.add_option(cmd, {"--policy", "--scorer", "--pooling", "--output-aware", "--head-alloc", "--head-alpha"});
  cmd->callback([args]() {
    args->preset.apply(args->sel, &args->scorer, &args->policy);
    run_generate(*args);
  });
}

}  // namespace depthkv_cli
