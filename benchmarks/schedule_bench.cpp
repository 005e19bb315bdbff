// schedule_bench: the cost of bounded KV memory (depthkv/eviction_schedule.hpp) against the
// engine's own time, per prefill chunk and per decode step.
//
// For stories260K (real weights) and a synthetic model of TinyLlama-1.1B shape (random F32
// weights, 22 layers by default), one sequence is prefilled in chunks and then decoded, three ways
// on the same tokens:
//   base      no observer, no eviction (the engine alone, full cache);
//   observed  the schedule's scorers fed by the attention observer, never evicting (budget 1.0);
//   schedule  an EvictionSchedule (uniform policy, keep ratio, H2O or SnapKV, interval M):
//             after_chunk after every prefill chunk, after_decode_step after every decoded token.
// Reported per token: the time of each run, the schedule run's overhead against base
// ((schedule - base) / base), and the time spent inside the schedule's calls (scoring, allocation,
// eviction, scorer compaction) and inside the observer, as shares of the schedule run. The cache of
// the schedule run is smaller, so its attention is cheaper: the wall-clock overhead nets that out;
// the in-call shares do not. Each run is repeated --reps times, alternating, and the fastest kept.
//
// Usage: schedule_bench [--layers N] [--prompt N] [--decode N] [--chunk N] [--interval M]
//                       [--keep R] [--scorer h2o|snapkv] [--reps N] [--skip-synthetic] [--data DIR]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "bench_args.hpp"
#include "synthetic_models.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif

using namespace depthkv;
using namespace depthkv::llama;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Settings {
  int prompt = 512, decode = 64, chunk = 128, interval = 32, reps = 3;
  double keep = 0.2;
  std::string scorer = "h2o";
};

enum class Mode { kBase, kObserved, kSchedule };

/// Seconds of one run: prefill (all chunks) and decode (all steps), and inside the schedule.
struct Timing {
  double prefill_s = 0, decode_s = 0;
  double prefill_calls_s = 0, decode_calls_s = 0;  // inside after_chunk / after_decode_step
  double prefill_observer_s = 0, decode_observer_s = 0;
  int evictions = 0;
  std::size_t peak_bytes = 0, end_bytes = 0;
};

Timing run(const LlamaEngine& engine, const std::vector<int>& tokens, const Settings& s, Mode mode) {
  const LlamaConfig& c = engine.config();
  PruneSpec spec;
  spec.budget = Budget::keep(mode == Mode::kSchedule ? s.keep : 1.0);
  spec.schedule.interval = s.interval;
  spec.protection = {4, 16};
  spec.scorer.kind = parse_scorer_kind(s.scorer);
  EvictionSchedule schedule(spec, {}, c.n_layers, c.n_heads, c.n_kv_heads);
  HostCache cache = engine.make_cache();
  Timing t;
  double observer_s = 0;
  const AttentionObserver feed = schedule.observer();
  ForwardOptions opt;
  opt.chunk_size = s.chunk;
  opt.all_logits = false;
  if (mode != Mode::kBase)
    opt.observer = [&](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
      const auto t0 = Clock::now();
      feed(l, q, p0, nq, pr, ld, n);
      const double dt = seconds(t0);
#ifdef _OPENMP
#pragma omp atomic
#endif
      observer_s += dt;
    };
  auto call = [&](double& acc, bool decode) {
    t.peak_bytes = std::max(t.peak_bytes, cache.bytes());
    if (mode == Mode::kBase) return;
    const auto t0 = Clock::now();
    const bool evicted = decode ? schedule.after_decode_step(cache) : schedule.after_chunk(cache);
    acc += seconds(t0);
    t.evictions += evicted ? 1 : 0;
  };
  opt.after_chunk = [&](int, std::int32_t) { call(t.prefill_calls_s, false); };
  auto t0 = Clock::now();
  const RowMatrix last = engine.prefill(tokens, 0, cache, opt);
  t.prefill_s = seconds(t0);
  t.prefill_observer_s = observer_s;
  observer_s = 0;
  opt.after_chunk = nullptr;
  Eigen::Index next = 0;
  last.row(0).maxCoeff(&next);
  t0 = Clock::now();
  for (int i = 0; i < s.decode; ++i) {
    const int tok = static_cast<int>(next);
    const RowMatrix lg = engine.forward(&tok, 1, s.prompt + i, cache, opt);
    lg.row(0).maxCoeff(&next);
    call(t.decode_calls_s, true);
  }
  t.decode_s = seconds(t0);
  t.decode_observer_s = observer_s;
  t.end_bytes = cache.bytes();
  return t;
}

Timing fastest(const Timing& a, const Timing& b) {
  Timing r = a;
  if (b.prefill_s < a.prefill_s) {
    r.prefill_s = b.prefill_s;
    r.prefill_calls_s = b.prefill_calls_s;
    r.prefill_observer_s = b.prefill_observer_s;
  }
  if (b.decode_s < a.decode_s) {
    r.decode_s = b.decode_s;
    r.decode_calls_s = b.decode_calls_s;
    r.decode_observer_s = b.decode_observer_s;
  }
  return r;
}

void bench(const char* name, const LlamaModel& model, Settings s) {
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  s.prompt = std::min(s.prompt, c.seq_len - s.decode);
  std::vector<int> tokens(static_cast<std::size_t>(s.prompt));
  for (int i = 0; i < s.prompt; ++i) tokens[static_cast<std::size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
  {  // warm-up (allocations, thread pool)
    HostCache w = engine.make_cache();
    engine.prefill(std::vector<int>(tokens.begin(), tokens.begin() + std::min(s.prompt, 16)), 0, w);
  }
  Timing best[3];
  for (int r = 0; r < s.reps; ++r)
    for (int m = 0; m < 3; ++m) {
      const Timing t = run(engine, tokens, s, static_cast<Mode>(m));
      best[m] = r == 0 ? t : fastest(best[m], t);
    }
  const Timing &base = best[0], &obs = best[1], &sch = best[2];
  const int n_chunks = (s.prompt + s.chunk - 1) / s.chunk;
  std::printf("\n%s: %d layers, %d heads / %d KV heads of %d; prompt %d in %d chunks of %d, decode %d; "
              "schedule: uniform, keep %.2f, %s, interval %d, sinks 4 + recent 16 (best of %d)\n",
              name, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, s.prompt, n_chunks, s.chunk, s.decode, s.keep,
              s.scorer.c_str(), s.interval, s.reps);
  std::printf("  KV bytes: full cache at the end %zu; schedule run peak %zu, end %zu (%d evictions)\n", base.end_bytes,
              sch.peak_bytes, sch.end_bytes, sch.evictions);
  auto line = [&](const char* what, double b, double o, double sc, double calls, double observer, int n) {
    std::printf("  %-7s per %s: base %.3f ms, observed %.3f ms, schedule %.3f ms; overhead %+.1f%% (observer alone "
                "%+.1f%%); inside the schedule's calls %.1f%%, inside the observer %.1f%% of the schedule run\n",
                what, n == n_chunks ? "chunk" : "token", 1e3 * b / n, 1e3 * o / n, 1e3 * sc / n, 100 * (sc / b - 1),
                100 * (o / b - 1), 100 * calls / sc, 100 * observer / sc);
  };
  line("prefill", base.prefill_s, obs.prefill_s, sch.prefill_s, sch.prefill_calls_s, sch.prefill_observer_s, n_chunks);
  if (s.decode > 0)
    line("decode", base.decode_s, obs.decode_s, sch.decode_s, sch.decode_calls_s, sch.decode_observer_s, s.decode);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  int layers = 22;
  bool synthetic = true;
  std::string data = depthkv_bench::default_data_dir();
  depthkv_bench::Args args("schedule_bench");
  args.option("--layers", layers).option("--prompt", s.prompt).option("--decode", s.decode).option("--chunk", s.chunk);
  args.option("--interval", s.interval).option("--keep", s.keep).option("--scorer", s.scorer).option("--reps", s.reps);
  args.flag("--skip-synthetic", synthetic, false).option("--data", data);
  if (!args.parse(argc, argv)) return 2;
  if (layers < 1 || s.prompt < 1 || s.decode < 0 || s.chunk < 1 || s.interval < 1 || s.reps < 1 || !(s.keep > 0) ||
      s.keep > 1) {
    std::fprintf(stderr, "schedule_bench: --layers, --prompt, --chunk, --interval, --reps must be >= 1, --decode >= 0, "
                         "--keep in (0, 1]\n");
    return 2;
  }
  try {
    std::printf("Eigen %d.%d.%d, %d threads; SIMD: %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION,
                Eigen::nbThreads(), Eigen::SimdInstructionSetsInUse());
    bench("stories260K", load_llama2c(data + "/models/stories260K/stories260K.bin"), s);
    if (synthetic) {
      const LlamaModel tl = depthkv_bench::synthetic_tinyllama(layers);
      char name[96];
      std::snprintf(name, sizeof name, "synthetic TinyLlama-1.1B shape, %d of 22 layers", layers);
      bench(name, tl, s);
    }
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "schedule_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
