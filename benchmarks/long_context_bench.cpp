// long_context_bench: decode speed and memory of the reference engine at a long context, with the
// full KV cache or a bounded one (keep a ratio of the tokens, evicting after every prefill chunk
// and every `interval` decoded tokens: a decode-schedule spec), and the work bound of the decode
// step (long_context_bound.hpp). The run is the library's driver (`PrunedGeneration`,
// llama/pruned_generation.hpp) on the reference engine.
//
// One run per process, so that the peak RSS (VmHWM) is the run's. Input: a model file (GGUF or
// llama2.c), or a real model's shape with random weights of a file type built in memory
// (synthetic_models.hpp). The context is read in chunks of --chunk tokens:
//   --prefill real       through the engine (prefill tok/s measured; attention costs O(T^2));
//   --prefill synthetic  random keys and values appended to the cache instead (the driver's engine
//                        call does it), each chunk with one observed attention row per query head
//                        (random probabilities), and the same evictions: the cache holds what a real prefill leaves (its size,
//                        not its values), in seconds instead of hours at 32K. No prefill speed then,
//                        and the peak RSS lacks the prefill's working memory.
// Then --decode tokens are decoded greedily, one at a time (`PrunedGeneration::step`). Reported: prefill and decode tok/s; peak RSS; the KV bytes held at
// the peak (before any eviction) and at the end; the seconds inside the observer (scores
// accumulated from the attention) and inside the schedule's calls (scoring, allocation, eviction,
// compaction), as fractions of the prefill, the decode and the whole run; the decode step's work
// (weight bytes, KV bytes, FLOPs, averaged over the decode steps) against the full cache's at the
// same positions, the bytes-only and FLOPs-only speedup bounds; and the decode's bytes per second
// against a memcpy ceiling.
//
// Usage: long_context_bench (--model F | --shape S [--type T] [--layers N]) [--context N]
//          [--decode M] [--threads T] [--keep R] [--schedule chunked] [--chunk C] [--interval I]
//          [--scorer preset|NAME] [--sinks N] [--recent N] [--prefill real|synthetic]
//          [--max-seconds S] [--shrink] [--kv-type f16|f32] [--json F]
// --kv-type: the cache's keys and values in F16 (the default, as the engine's generate and
// llama.cpp hold them) or float32.
//
// The cache is sized once (make_cache): for the whole sequence with the full cache, for the
// budget + a chunk + an interval + the protected tokens with keep < 1, and evictions keep its
// capacity (EvictOptions::shrink off), as an engine that knows its budget sizes a sequence;
// --shrink uses the library's defaults instead (no capacity reserved, doubling on demand,
// shrinking after every eviction), whose reallocations show in the peak RSS.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/open_model.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/scorer_registry.hpp"
#include "bench_args.hpp"
#include "long_context_bound.hpp"
#include "synthetic_models.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif

using namespace depthkv;
using namespace depthkv::llama;
using Clock = std::chrono::steady_clock;
/// The engine's cache of `Scalar` keys and values (float, or Eigen::half: --kv-type).
template <class Scalar>
using CacheOf = decltype(std::declval<const LlamaEngine&>().template make_cache<Scalar>(0));

namespace {

constexpr int kMaxContext = 32768;

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A `kB` field of /proc/self/status in MiB (0 when absent, e.g. off Linux).
double status_mb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::atof(line.c_str() + n + 1) / 1024.0;
  return 0;
}

struct Settings {
  std::string model, shape, type = "Q8_0", schedule = "chunked", scorer = "preset", prefill = "real", json;
  std::string kv_type = "f16";  ///< the cache's keys and values: "f16" (the engine's default, as llama.cpp) or "f32"
  int layers = 0, context = 4096, decode = 32, threads = 2, chunk = 1024, interval = 32, sinks = 4, recent = 16;
  double keep = 1.0, max_seconds = 0;
  bool shrink = false;
  bool full() const { return keep >= 1.0; }
  /// Slots per head the cache is sized for at the start: the whole sequence (full cache), or
  /// the budget + a chunk + an interval + the protected tokens (keep < 1, unless --shrink: then
  /// none, and the layers grow on demand by doubling and shrink after every eviction, the
  /// library's defaults).
  int capacity() const {
    if (full()) return context + decode;
    if (shrink) return 0;
    return static_cast<int>(std::ceil(keep * (context + decode))) + std::max(chunk, interval) + interval + sinks + recent;
  }
};

/// What is wrong with the input and size options ("" when nothing).
std::string size_error(const Settings& s) {
  if (s.model.empty() == s.shape.empty()) return "give exactly one of --model FILE and --shape NAME";
  if (!s.model.empty() && s.layers != 0) return "--layers is for --shape only";
  if (s.context < 1 || s.context > kMaxContext) return "--context must be in [1, 32768], got " + std::to_string(s.context);
  if (s.decode < 1) return "--decode must be >= 1 (decode speed is what is measured)";
  if (s.threads < 0 || s.threads > kMaxThreads) return "--threads must be in [0, " + std::to_string(kMaxThreads) + "] (0: all cores)";
  if (s.prefill != "real" && s.prefill != "synthetic") return "--prefill must be 'real' or 'synthetic'";
  if (!(s.max_seconds >= 0)) return "--max-seconds must be >= 0 (0: no limit)";
  if (s.kv_type != "f16" && s.kv_type != "f32") return "--kv-type must be 'f16' or 'f32', got '" + s.kv_type + "'";
  return "";
}

/// What is wrong with the cache options ("" when nothing).
std::string cache_error(const Settings& s) {
  if (!(s.keep > 0) || s.keep > 1) return "--keep must be in (0, 1] (1: the full cache)";
  if (s.schedule != "chunked") return "--schedule: only 'chunked' (evict after every chunk and interval)";
  if (s.chunk < 1 || s.interval < 1) return "--chunk and --interval must be >= 1";
  if (s.sinks < 0 || s.recent < 0) return "--sinks and --recent must be >= 0";
  return "";
}

/// Parses and validates the options; prints what is wrong and returns false.
bool parse_settings(int argc, char** argv, Settings& s) {
  depthkv_bench::Args a("long_context_bench");
  a.option("--model", s.model).option("--shape", s.shape).option("--type", s.type).option("--layers", s.layers);
  a.option("--context", s.context).option("--decode", s.decode).option("--threads", s.threads).option("--keep", s.keep);
  a.option("--schedule", s.schedule).option("--chunk", s.chunk).option("--interval", s.interval);
  a.option("--scorer", s.scorer).option("--sinks", s.sinks).option("--recent", s.recent);
  a.option("--prefill", s.prefill).option("--max-seconds", s.max_seconds).option("--json", s.json);
  a.option("--kv-type", s.kv_type);
  a.flag("--shrink", s.shrink);
  if (!a.parse(argc, argv)) return false;
  const std::string e = size_error(s).empty() ? cache_error(s) : size_error(s);
  return e.empty() || a.fail(e);
}

LlamaModel load_input(const Settings& s) {
  if (!s.shape.empty()) return depthkv_bench::synthetic_model(s.shape, s.type, s.layers);
  return detect_model_format(s.model) == ModelFormat::kGguf ? load_gguf(s.model) : load_llama2c(s.model);
}

/// The weights one decode step multiplies (layer matrices and classifier) and their bytes.
depthkv_bench::DecodeShape decode_shape(const LlamaModel& m) {
  const LlamaConfig& c = m.config;
  depthkv_bench::DecodeShape d{c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, 0, 0};
  auto add = [&](const RowMatrix& w, const QuantWeight& q) {
    d.weight_params += q.empty() ? static_cast<double>(w.size()) : static_cast<double>(q.rows) * static_cast<double>(q.cols);
    d.weight_bytes += q.empty() ? 4.0 * static_cast<double>(w.size()) : static_cast<double>(q.n_bytes());
  };
  for (const LlamaLayerWeights& w : m.layers) {
    add(w.wq, w.wq_quant);
    add(w.wk, w.wk_quant);
    add(w.wv, w.wv_quant);
    add(w.wo, w.wo_quant);
    add(w.w1, w.w1_quant);
    add(w.w2, w.w2_quant);
    add(w.w3, w.w3_quant);
  }
  add(m.classifier, m.classifier_quant);
  return d;
}

/// Slots held, summed over layers and KV heads.
template <class Cache>
double slots_held(const Cache& cache) {
  double n = 0;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h) n += cache.layer(l).size(h);
  return n;
}

/// Copy bandwidth of 256 MiB buffers (bytes read + written per second, best of 3).
double memcpy_bytes_per_s() {
  const std::size_t n = std::size_t(256) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e300;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds(t0));
    a[static_cast<std::size_t>(r)] = b[n - 1 - static_cast<std::size_t>(r)];
  }
  return 2.0 * static_cast<double>(n) / best;
}

/// Everything measured in one run.
struct Figures {
  double prefill_s = 0, decode_s = 0, prefill_observer_s = 0, decode_observer_s = 0;
  double prefill_calls_s = 0, decode_calls_s = 0;
  std::size_t kv_peak = 0, kv_end = 0, kv_allocated_end = 0;
  std::vector<std::size_t> kv_end_layers;
  int evictions = 0;
  double decode_slots_sum = 0, decode_full_slots_sum = 0;  // over the decode steps
  std::vector<double> step_s;                               // seconds of each decode step (with its schedule call)
  double rss_load_mb = 0, peak_rss_mb = 0, memcpy_bps = 0;
  double tokens_end = 0;  // context + decode
};

}  // namespace

namespace {

/// The engine a run drives through the library's driver (`PrunedGeneration`): the reference
/// engine, with its observer calls timed, whose calls append random keys and values instead of
/// running the model while `synthetic` is set (--prefill synthetic: each call then hands the
/// observer one row of random probabilities per query head, at the call's last position).
class BenchEngine {
 public:
  BenchEngine(const LlamaModel& model, bool synthetic) : engine_(model), synthetic_(synthetic) {}
  const LlamaConfig& config() const { return engine_.config(); }
  const LlamaEngine& engine() const { return engine_; }
  /// Later calls run the model.
  void end_synthetic() { synthetic_ = false; }
  /// Seconds inside the observer since the last call.
  double take_observer_s() { return std::exchange(observer_s_, 0.0); }

  /// The driver's engine call (llama/pruned_generation.hpp).
  template <class Cache>
  RowMatrix forward(const int* tokens, int n, std::int32_t pos0, Cache& cache, const ForwardOptions& opt) const {
    ForwardOptions o = opt;
    if (opt.observer)
      o.observer = [this, &opt](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int m) {
        const auto t0 = Clock::now();
        opt.observer(l, q, p0, nq, pr, ld, m);
        observer_s_ += seconds(t0);
      };
    if (!synthetic_) return engine_.forward(tokens, n, pos0, cache, o);
    synthetic_call(pos0, n, cache, o.observer);
    return RowMatrix::Zero(1, engine_.config().vocab_size);
  }

 private:
  template <class Cache>
  void synthetic_call(int pos0, int n, Cache& cache, const AttentionObserver& observer) const {
    const LlamaConfig& c = engine_.config();
    const std::size_t row = static_cast<std::size_t>(c.n_kv_heads) * static_cast<std::size_t>(c.head_dim);
    std::vector<float> k(row), v(row), probs;
    for (int l = 0; l < c.n_layers; ++l)
      for (int t = 0; t < n; ++t) {
        depthkv_bench::fill(k.data(), row, 1.0f, rng_);
        depthkv_bench::fill(v.data(), row, 1.0f, rng_);
        cache.layer(l).append(k.data(), v.data(), pos0 + t);
      }
    if (!observer) return;
    for (int l = 0; l < c.n_layers; ++l)
      for (int qh = 0; qh < c.n_heads; ++qh) {
        const int m = cache.layer(l).size(qh / (c.n_heads / c.n_kv_heads));
        probs.resize(static_cast<std::size_t>(m));
        depthkv_bench::fill(probs.data(), probs.size(), 0.5f, rng_);
        float sum = 0;
        for (float& p : probs) sum += (p += 0.5f);
        for (float& p : probs) p /= sum;
        observer(l, qh, pos0 + n - 1, 1, probs.data(), m, m);
      }
  }

  const LlamaEngine engine_;
  bool synthetic_;
  mutable double observer_s_ = 0;
  mutable std::uint64_t rng_ = 0x2545F4914F6CDD1Dull;
};

/// One run on the driver: a cache of `Scalar` keys and values sized by `Settings::capacity`,
/// and (keep < 1) a decode-schedule spec that evicts after every chunk and interval.
template <class Scalar>
class Run {
 public:
  Run(const LlamaModel& model, const Settings& s)
      : s_(s), engine_(model, s.prefill == "synthetic"), gen_(engine_, engine_.engine().template make_cache<Scalar>(s.capacity()),
                                                         spec(), PolicyCurves{}, wo(model), run_options(), "", evict()) {}

  /// The scorer: the "best" preset's (SnapKV, max pooling, output-aware) without its lookahead,
  /// which a schedule cannot use; or a registered name.
  ScorerConfig scorer() const {
    if (s_.scorer != "preset") return scorer_config(s_.scorer);
    return preset_spec("best", PruneSpec{}, 0).scorer;
  }
  std::string scorer_name() const { return s_.full() ? "none" : depthkv::scorer_name(scorer()) + (scorer().output_aware ? "+output-aware" : ""); }

  void prefill(Figures& f);
  void decode(Figures& f);

 private:
  std::optional<PruneSpec> spec() const {
    if (s_.full()) return std::nullopt;
    PruneSpec spec;
    spec.scorer = scorer();
    spec.budget = Budget::keep(s_.keep);
    spec.schedule = {ScheduleMode::kDecode, s_.chunk, s_.interval};
    spec.protection = {s_.sinks, s_.recent};
    return spec;
  }
  const OutputProjections* wo(const LlamaModel& model) {
    if (!s_.full() && scorer().output_aware) wo_ = std::make_unique<OutputProjections>(model);
    return wo_.get();
  }
  /// The engine's settings; the hook sums the slots each decoded token's step attended to.
  ForwardOptions run_options() {
    ForwardOptions run;
    run.chunk_size = s_.chunk;
    run.n_threads = s_.threads;
    run.after_chunk = [this](int, std::int32_t) {
      if (decoding_) slots_sum_ += slots_held(gen_.cache());
    };
    return run;
  }
  EvictOptions evict() const {
    EvictOptions e;
    e.shrink = s_.shrink;
    return e;
  }
  void check_time(Clock::time_point t0, int done) const;

  const Settings& s_;
  std::unique_ptr<OutputProjections> wo_;
  BenchEngine engine_;
  PrunedGeneration<CacheOf<Scalar>, BenchEngine> gen_;
  bool decoding_ = false;
  double slots_sum_ = 0;
  int next_token_ = 1;
};

/// --max-seconds: stops a prefill whose time, projected linearly from the chunks done, exceeds the
/// limit (the attention of later chunks costs more, so the projection is a lower bound).
template <class Scalar>
void Run<Scalar>::check_time(Clock::time_point t0, int done) const {
  if (s_.max_seconds <= 0 || done >= s_.context) return;
  // a lower estimate: the chunks still to come cost at least as much as the ones done
  const double projected = seconds(t0) * static_cast<double>(s_.context) / done;
  DEPTHKV_CHECK(projected <= s_.max_seconds, "the prefill would take at least " << static_cast<long>(projected) << " s (after "
                                                 << done << " of " << s_.context << " tokens in " << seconds(t0)
                                                 << " s), over --max-seconds " << s_.max_seconds
                                                 << ": use --prefill synthetic or a shorter --context");
}

/// The context fed to the driver one chunk at a time (each evicted after it), as token ids
/// spread over the vocabulary, or (--prefill synthetic) random keys and values.
template <class Scalar>
void Run<Scalar>::prefill(Figures& f) {
  std::vector<int> ids(static_cast<std::size_t>(s_.chunk));
  const int vocab = engine_.config().vocab_size;
  const auto t0 = Clock::now();
  for (int c0 = 0; c0 < s_.context; c0 += s_.chunk) {
    const int n = std::min(s_.chunk, s_.context - c0);
    for (int i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int>((static_cast<long long>(c0 + i) * 7919 + 13) % vocab);
    const RowMatrix last = gen_.feed(ids.data(), n);
    if (s_.prefill == "real") next_token_ = last_argmax(last);
    check_time(t0, c0 + n);
  }
  f.prefill_s = seconds(t0);
  f.prefill_observer_s = engine_.take_observer_s();
  f.prefill_calls_s = gen_.report().schedule_ms / 1000.0;
  engine_.end_synthetic();
}

/// --decode greedy steps on the driver (each step's time includes its eviction).
template <class Scalar>
void Run<Scalar>::decode(Figures& f) {
  const LlamaConfig& c = engine_.config();
  decoding_ = true;
  const auto t0 = Clock::now();
  for (int i = 0; i < s_.decode; ++i) {
    const auto ts = Clock::now();
    next_token_ = last_argmax(gen_.step(next_token_));
    f.decode_full_slots_sum += static_cast<double>(c.n_layers) * c.n_kv_heads * (s_.context + i + 1);
    f.step_s.push_back(seconds(ts));
  }
  f.decode_s = seconds(t0);
  f.decode_observer_s = engine_.take_observer_s();
  f.decode_calls_s = gen_.report().schedule_ms / 1000.0 - f.prefill_calls_s;
  f.decode_slots_sum = slots_sum_;
  f.kv_peak = gen_.report().peak_bytes;
  f.evictions = gen_.report().evictions;
  f.kv_end = gen_.cache().bytes();
  f.kv_allocated_end = gen_.cache().bytes_allocated();
  f.kv_end_layers = gen_.cache().bytes_per_layer();
}

}  // namespace

namespace {

using depthkv_bench::DecodeBound;
using depthkv_bench::DecodeWork;

/// The decode step's mean work with the cache run, and with the full cache at the same positions.
struct Bound {
  DecodeWork pruned, full;
  DecodeBound speedup;
  double kv_full_end = 0;  ///< bytes a full cache holds at the end (context + decode tokens)
};

/// @param e bytes per key or value element of the cache
Bound bound_of(const depthkv_bench::DecodeShape& shape, const Figures& f, int decode, double e) {
  Bound b;
  b.pruned = depthkv_bench::decode_work(shape, f.decode_slots_sum / decode, e);
  b.full = depthkv_bench::decode_work(shape, f.decode_full_slots_sum / decode, e);
  b.speedup = depthkv_bench::bound_speedup(b.full, b.pruned);
  b.kv_full_end = depthkv_bench::kv_bytes_per_token(shape, e) * f.tokens_end;
  return b;
}

double frac(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

/// Decode tok/s of the fastest `w` consecutive steps (w = the interval, so that a window holds one
/// eviction; all steps when fewer): less sensitive than the mean to other processes' load.
double best_window_tok_s(const std::vector<double>& step_s, int w) {
  const std::size_t n = std::min(step_s.size(), static_cast<std::size_t>(w));
  double sum = 0, best = 1e300;
  for (std::size_t i = 0; i < step_s.size(); ++i) {
    sum += step_s[i] - (i >= n ? step_s[i - n] : 0.0);
    if (i + 1 >= n) best = std::min(best, sum);
  }
  return static_cast<double>(n) / best;
}

void print_report(const Settings& s, const std::string& scorer, const LlamaModel& m, const Figures& f, const Bound& b) {
  const double mib = 1048576.0;
  const bool real = s.prefill == "real";
  std::printf("long_context_bench: %s, %d layers; context %d (%s prefill, chunks of %d), decode %d, %d threads, %s KV\n",
              m.source_path.c_str(), m.config.n_layers, s.context, s.prefill.c_str(), s.chunk, s.decode, s.threads,
              s.kv_type == "f16" ? "F16" : "float32");
  if (s.full())
    std::printf("  cache: full\n");
  else
    std::printf("  cache: keep %.3g, chunked schedule, interval %d, scorer %s, uniform policy, sinks %d + recent %d (%d evictions); "
                "%s\n", s.keep, s.interval, scorer.c_str(), s.sinks, s.recent, f.evictions,
                s.shrink ? "grown on demand, shrunk after every eviction" : ("sized for " + std::to_string(s.capacity()) + " tokens per head").c_str());
  if (real)
    std::printf("  prefill: %.2f s = %.1f tok/s\n", f.prefill_s, s.context / f.prefill_s);
  else
    std::printf("  prefill: synthetic, %.2f s (no speed measured)\n", f.prefill_s);
  std::printf("  decode at %d..%d: %.3f s = %.2f tok/s (fastest %d consecutive steps: %.2f tok/s)\n", s.context,
              s.context + s.decode, f.decode_s, s.decode / f.decode_s, std::min(s.decode, s.interval),
              best_window_tok_s(f.step_s, s.interval));
  std::printf("  RSS after load %.1f MiB, peak %.1f MiB (weights %.1f MiB)\n", f.rss_load_mb, f.peak_rss_mb, m.file_size / mib);
  std::printf("  KV bytes: peak %.2f MiB, end %.2f MiB (allocated %.2f MiB); full cache at the end %.2f MiB\n", f.kv_peak / mib,
              f.kv_end / mib, f.kv_allocated_end / mib, b.kv_full_end / mib);
  const double in_p = f.prefill_observer_s + f.prefill_calls_s, in_d = f.decode_observer_s + f.decode_calls_s;
  std::printf("  scoring + allocation + eviction: prefill %.1f%% (observer %.1f%%, schedule calls %.1f%%), decode %.1f%% "
              "(observer %.1f%%, schedule calls %.1f%%), whole run %.1f%%\n",
              100 * frac(in_p, f.prefill_s), 100 * frac(f.prefill_observer_s, f.prefill_s), 100 * frac(f.prefill_calls_s, f.prefill_s),
              100 * frac(in_d, f.decode_s), 100 * frac(f.decode_observer_s, f.decode_s), 100 * frac(f.decode_calls_s, f.decode_s),
              100 * frac(in_p + in_d, f.prefill_s + f.decode_s));
  std::printf("  decode step work: weights %.1f MiB, KV %.2f MiB (full %.2f), FLOPs %.3g (attention %.3g, full %.3g)\n",
              b.pruned.weight_bytes / mib, b.pruned.kv_bytes / mib, b.full.kv_bytes / mib, b.pruned.flops(),
              b.pruned.attention_flops, b.full.attention_flops);
  std::printf("  bound over the full cache: %.3fx (bytes only) .. %.3fx (FLOPs only)\n", b.speedup.bytes_only, b.speedup.flops_only);
  const double bps = b.pruned.bytes() * s.decode / f.decode_s;
  std::printf("  decode reads %.2f GB/s = %.2f of memcpy's %.2f GB/s\n", bps / 1e9, bps / f.memcpy_bps, f.memcpy_bps / 1e9);
}

void write_json(const Settings& s, const std::string& scorer, const LlamaModel& m, const Figures& f, const Bound& b) {
  std::ostringstream js;
  js.precision(10);
  const bool real = s.prefill == "real";
  std::string layers;
  for (std::size_t i = 0; i < f.kv_end_layers.size(); ++i) layers += (i ? ", " : "") + std::to_string(f.kv_end_layers[i]);
  double load[1] = {0};
#ifdef __linux__
  if (getloadavg(load, 1) != 1) load[0] = -1;
#endif
  js << "{\"input\": \"" << m.source_path << "\", \"shape\": \"" << s.shape << "\", \"type\": \"" << (s.shape.empty() ? "" : s.type)
     << "\", \"n_layers\": " << m.config.n_layers << ", \"context\": " << s.context << ", \"decode\": " << s.decode
     << ", \"threads\": " << s.threads << ", \"kv_type\": \"" << s.kv_type << "\", \"keep\": " << s.keep << ", \"mode\": \"" << (s.full() ? "full" : "keep")
     << "\", \"schedule\": \"" << (s.full() ? "none" : s.schedule) << "\", \"chunk\": " << s.chunk << ", \"interval\": " << s.interval
     << ", \"shrink\": " << (s.shrink ? "true" : "false") << ", \"capacity_tokens\": " << s.capacity()
     << ", \"scorer\": \"" << scorer << "\", \"prefill\": \"" << s.prefill << "\", \"prefill_s\": " << f.prefill_s
     << ", \"prefill_tok_s\": " << (real ? std::to_string(s.context / f.prefill_s) : "null") << ", \"decode_s\": " << f.decode_s
     << ", \"decode_tok_s\": " << s.decode / f.decode_s
     << ", \"decode_tok_s_best_window\": " << best_window_tok_s(f.step_s, s.interval) << ", \"rss_after_load_mb\": " << f.rss_load_mb
     << ", \"peak_rss_mb\": " << f.peak_rss_mb << ", \"weights_mb\": " << m.file_size / 1048576.0
     << ", \"kv_peak_bytes\": " << f.kv_peak << ", \"kv_end_bytes\": " << f.kv_end << ", \"kv_end_layer_bytes\": [" << layers
     << "], \"kv_allocated_end_bytes\": " << f.kv_allocated_end << ", \"kv_full_end_bytes\": " << b.kv_full_end << ", \"evictions\": " << f.evictions
     << ", \"prefill_observer_s\": " << f.prefill_observer_s << ", \"prefill_schedule_s\": " << f.prefill_calls_s
     << ", \"decode_observer_s\": " << f.decode_observer_s << ", \"decode_schedule_s\": " << f.decode_calls_s
     << ", \"decode_overhead_fraction\": " << frac(f.decode_observer_s + f.decode_calls_s, f.decode_s)
     << ", \"prefill_overhead_fraction\": " << frac(f.prefill_observer_s + f.prefill_calls_s, f.prefill_s)
     << ", \"step_weight_bytes\": " << b.pruned.weight_bytes << ", \"step_kv_bytes\": " << b.pruned.kv_bytes
     << ", \"step_flops\": " << b.pruned.flops() << ", \"step_attention_flops\": " << b.pruned.attention_flops
     << ", \"full_step_kv_bytes\": " << b.full.kv_bytes << ", \"full_step_attention_flops\": " << b.full.attention_flops
     << ", \"bound_speedup_bytes\": " << b.speedup.bytes_only << ", \"bound_speedup_flops\": " << b.speedup.flops_only
     << ", \"memcpy_gb_s\": " << f.memcpy_bps / 1e9 << ", \"load_avg\": " << load[0] << ", \"unix_time\": " << std::time(nullptr)
     << "}\n";
  std::ofstream out(s.json);
  out << js.str();
  DEPTHKV_CHECK(out.good(), "cannot write --json " << s.json);
}

/// The prefill and the decode of one run with a cache of `Scalar` keys and values, the peak RSS
/// read before the run's memory is freed; returns the scorer's name.
template <class Scalar>
std::string run_once(const LlamaModel& model, const Settings& s, Figures& f) {
  Run<Scalar> run(model, s);
  run.prefill(f);
  run.decode(f);
  f.peak_rss_mb = status_mb("VmHWM");
  return run.scorer_name();
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!parse_settings(argc, argv, s)) return 2;
  try {
    const LlamaModel model = load_input(s);
    Figures f;
    f.rss_load_mb = status_mb("VmRSS");
    f.tokens_end = s.context + s.decode;
    const bool f16 = s.kv_type == "f16";
    const std::string scorer = f16 ? run_once<Eigen::half>(model, s, f) : run_once<float>(model, s, f);
    f.memcpy_bps = memcpy_bytes_per_s();  // after the peak is read: its buffers are not the run's
    const Bound b = bound_of(decode_shape(model), f, s.decode, f16 ? 2.0 : 4.0);
    print_report(s, scorer, model, f, b);
    if (!s.json.empty()) write_json(s, scorer, model, f, b);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "long_context_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
