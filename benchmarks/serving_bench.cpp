// serving_bench: does memory freed by eviction turn into concurrency? A serving simulation on
// stories260K with the reference engine over one shared BlockPool (paged_cache.hpp).
//
// The pool: --pool-seqs full-length sequences (context + generation tokens, default 8 of 384 + 128)
// in blocks of --block-size tokens (default 16). ONE pool holds the blocks of every layer of
// every sequence (per-layer tables, blocks of all KV heads): pool blocks = pool-seqs x layers x
// ceil((context + gen - 1) / block_size).
//
// The queue: --requests requests (default 64), request i = the first --context tokens (384) of
// TinyStories window --skip + i (512-token windows of tinystories_valid.txt; skip 24 = the eval
// table's windows, disjoint from the profile's calibration windows 0..23), then --gen tokens (128)
// generated greedily.
//
// Admission: a request is admitted when the blocks reserved by the active requests plus its own
// reservation fit the pool. The reservation is the request's peak block count, as the schedule
// guarantees it:
//   no eviction   every layer holds every token: layers x ceil((context + gen - 1) / block_size);
//   eviction      after each eviction the layers sum to exactly B(seen) = llround(keep x layers x
//                 seen) tokens (at least the protected tokens), and between evictions every layer
//                 grows by the same number of tokens (at most one prefill chunk, or `interval`
//                 decoded tokens). The reservation walks the request's calls (prefill chunks, then
//                 decode steps) with the schedule's rule and takes the largest
//                 floor((S + layers x (block_size - 1)) / block_size) over the points just before
//                 each call, S the guaranteed token sum (a layer of n tokens holds ceil(n / bs) blocks).
// The simulation checks that no request ever holds more than its reservation (`over_reservation`)
// and that no append finds the pool short (`exhausted`: blocks_for_tokens() against num_free()
// before each forward, and the engine's "pool exhausted" Error, thrown before any layer is
// touched, counted if it is thrown anyway: the request then retries in the next step).
//
// Continuous batching: one step gives every active request one unit of work: a prefill chunk of
// --chunk tokens (64; the schedule's after_chunk after each) for each request still in its context,
// one forward per request; then one decode token for every generating request together, in one
// batched forward (`PrunedGeneration::step_batch`: each weight matrix read once for all, each
// request at its own position on its own cache, after_decode_step for each after it). With
// --no-batch each generating request decodes in a forward of its own. A request that has
// generated --gen tokens releases its blocks (its layers are cleared) and the next requests are
// admitted before the next step. Forward passes are single-threaded.
//
// Modes: none (full cache); uniform and optimal (profile docs/results/stories260K.profile.json,
// --scorer snapkv or h2o, sinks 4 + recent 16, observation window 16, kernel 7, max pooling: the
// profile's selection) at every --keep ratio, with the chunked EvictionSchedule (evicts after every
// prefill chunk and every --interval decoded tokens).
//
// Quality: for the first --quality requests (16), the logits that chose each generated token are
// kept, and the same request is run again on a full host cache, teacher-forced on the generated
// tokens: mean KL(full || pruned) over the --gen distributions, and the share of tokens whose
// argmax the full cache would have chosen too (top-1 agreement). Not timed. Each of them is also
// run alone, on a pool of its own with the same spec and chunks, one forward per token,
// teacher-forced on the served tokens: every kept position must be the same and every logit
// within 1e-4 of the row's largest |logit| of the served one (bit for bit with --no-batch, whose
// forwards are the same; a batched product rounds differently), so no request's pruning or
// blocks leak into another's (column `alone`: the requests that differ; `dlogit`: the largest
// difference over all of them, relative to the row's largest |logit|).
//
// --mixed: request i's context is --context x (4 - i % 4) / 4 tokens (full, 3/4, 1/2, 1/4 in
// turn; the reservation stays the longest request's).
//
// Usage: serving_bench [--pool-seqs N] [--block-size N] [--requests N] [--context N] [--gen N]
//                      [--chunk N] [--interval M] [--keep R,R,...] [--policies uniform,optimal]
//                      [--scorer snapkv|h2o] [--quality N] [--skip N] [--reps N] [--profile FILE]
//                      [--data DIR] [--json] [--reserve-blocks N] [--mixed] [--alone-chunk N] [--no-batch]
//                      [--model FILE [--text FILE]]
// --model: another model (GGUF or llama2.c) instead of stories260K, with --text as one document
// (default TinyStories); --profile is then needed by the policies other than uniform.
// --reps N repeats each mode's simulation N times and reports the fastest wall time (tokens/s).
// --reserve-blocks N admits every request with a reservation of N blocks instead of the computed one
// (to check the checks: a reservation below the peak must make the run fail); --alone-chunk N runs
// the requests alone with prefill chunks of N (another chunk evicts at other points: the outputs
// must then differ and the run fail).
// Exit status: 0 when every mode completed every request with no request over its reservation, no
// append finding the pool short and no quality request differing from its run alone; 1 otherwise
// (each breach named on stderr), or on an error.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/open_model.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/paged_cache.hpp"
#include "depthkv/profile_io.hpp"
#include "bench_args.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif
#ifndef DEPTHKV_SOURCE_DIR
#define DEPTHKV_SOURCE_DIR "."
#endif

using namespace depthkv;
using namespace depthkv::llama;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A served request equals its run alone when every logit is within this fraction of the row's
/// largest |logit| (file comment).
constexpr double kAloneTolerance = 1e-4;

struct Settings {
  int pool_seqs = 8, block_size = 16, requests = 64, context = 384, gen = 128, chunk = 64, interval = 16;
  int quality = 16, skip = 24;
  bool mixed = false;        ///< --mixed: request i's context is --context x (4 - i % 4) / 4 tokens
  bool batch = true;         ///< decode steps of all generating requests in one batched forward (--no-batch: one each)
  int alone_chunk = 0;       ///< the prefill chunk of the runs alone (0: --chunk; another one must make them differ)
  int reserve_override = 0;  ///< > 0: admit with this reservation instead of the computed one (--reserve-blocks)
  std::vector<double> keeps{0.3, 0.2};
  std::vector<std::string> policies{"uniform", "optimal"};
  std::string scorer = "snapkv";
  Protection protection{4, 16};
  int obs_window = 16, kernel = 7;
};

/// One serving mode: no eviction, or a policy at a keep ratio under the chunked schedule.
struct Mode {
  bool evict = false;
  AllocationPolicy policy = AllocationPolicy::kUniform;
  double keep = 1.0;
  std::string name() const {
    if (!evict) return "none";
    std::ostringstream os;
    os << to_string(policy) << "@" << keep;
    return os.str();
  }
};

/// The figures of one mode.
struct Row {
  Mode mode;
  int pool_blocks = 0, reservation = 0, max_active = 0, completed = 0, steps = 0;
  double mean_active = 0;
  int peak_blocks = 0;         ///< pool blocks in use, largest (after each forward, before its eviction)
  int peak_seq_blocks = 0;     ///< largest blocks held by one request
  int over_reservation = 0;    ///< requests that held more than their reservation (must be 0)
  int exhausted = 0;           ///< appends that found the pool short (must be 0)
  long long prefill_tokens = 0, decode_tokens = 0;
  double wall_s = 0;
  double schedule_s = 0;       ///< inside after_chunk / after_decode_step (scoring, allocation, eviction)
  double kl = 0, kl_se = 0, top1 = 0;
  int quality_requests = 0;
  int alone_differ = 0;        ///< quality requests whose tokens or logits differ from the request run alone (must be 0)
  double alone_dlogit = 0;     ///< largest |logit difference| to the runs alone, over the row's largest |logit|
  std::vector<int> final_budgets;  ///< per-layer budgets of the last eviction of request 0
};

/// Token sum B(seen) the schedule evicts to (eviction_schedule.hpp: global_budget).
long long schedule_budget(double keep, int layers, long long seen, long long held_per_layer, Protection p) {
  const long long b = std::llround(keep * static_cast<double>(seen) * static_cast<double>(layers));
  return std::max(b, static_cast<long long>(layers) * std::min<long long>(held_per_layer, p.n_sink + p.n_recent));
}

/// The request's guaranteed peak block count (file comment).
int reservation_blocks(const Mode& m, const Settings& s, int layers) {
  const int bs = s.block_size;
  const long long max_len = s.context + s.gen - 1;  // the last generated token is not fed back
  if (!m.evict) return static_cast<int>(layers * ((max_len + bs - 1) / bs));
  long long sum = 0, seen = 0, pending = 0;  // guaranteed token sum over the layers, as the schedule counts
  int peak = 0;
  auto append = [&](int n) {
    sum += static_cast<long long>(layers) * n;
    seen += n;
    pending += n;
    const long long full = static_cast<long long>(layers) * ((seen + bs - 1) / bs);  // never above no eviction
    peak = std::max(peak, static_cast<int>(std::min(full, (sum + static_cast<long long>(layers) * (bs - 1)) / bs)));
    const long long b = schedule_budget(m.keep, layers, seen, std::min(seen, sum), s.protection);
    if (pending >= s.interval && sum > b) {  // the schedule evicts to exactly B
      sum = b;
      pending = 0;
    }
  };
  for (int c0 = 0; c0 < s.context; c0 += s.chunk) append(std::min(s.chunk, s.context - c0));
  for (int t = 1; t < s.gen; ++t) append(1);
  return peak;
}

/// Blocks the next forward of n tokens takes from the pool.
int blocks_for(const KVCache<PagedLayer<float>>& cache, int n) {
  int need = 0;
  for (int l = 0; l < cache.n_layers(); ++l) need += cache.layer(l).blocks_for_tokens(n);
  return need;
}

int blocks_held(const KVCache<PagedLayer<float>>& cache) {
  int n = 0;
  for (int l = 0; l < cache.n_layers(); ++l) n += cache.layer(l).num_blocks_held();
  return n;
}

using PagedCache = KVCache<PagedLayer<float>>;

/// An empty cache of the model's shape whose layers take their blocks from `pool`.
PagedCache paged_cache(BlockPool<float>& pool, const LlamaConfig& c) {
  PagedCache cache;
  for (int l = 0; l < c.n_layers; ++l) cache.add_layer(PagedLayer<float>(pool, c.n_kv_heads, c.head_dim));
  return cache;
}

/// The positions `cache` holds, per layer and KV head (row l * heads + h).
std::vector<std::vector<std::int32_t>> kept_positions(const PagedCache& cache) {
  std::vector<std::vector<std::int32_t>> out;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h)
      out.emplace_back(cache.layer(l).positions(h), cache.layer(l).positions(h) + cache.layer(l).size(h));
  return out;
}

/// One request in flight: the library's driver over its paged cache.
struct Seq {
  int id = 0;
  std::unique_ptr<PrunedGeneration<PagedCache>> gen;
  int pos = 0;  // tokens fed
  int next = 0; // the token to feed next (decoding)
  std::vector<int> generated;
  std::vector<Eigen::VectorXf> logits;  // that chose each generated token (quality requests)
  std::vector<std::vector<std::int32_t>> kept;  // positions held at the end, per layer and KV head (quality requests)
  int peak_blocks = 0;
};

int argmax(const Eigen::Ref<const Eigen::RowVectorXf>& r) {
  Eigen::Index i = 0;
  r.maxCoeff(&i);
  return static_cast<int>(i);
}

/// Blocks one request holds with no eviction: every layer holds context + gen - 1 tokens.
int blocks_per_seq(const Settings& s, int layers) {
  return layers * ((s.context + s.gen - 1 + s.block_size - 1) / s.block_size);
}

/// The mode's pruning: the chunked schedule (evict after every prefill chunk and every interval
/// decoded tokens) with the profile's selection.
PruneSpec prune_spec(const Settings& s, const Mode& m) {
  PruneSpec spec;
  spec.policy = m.policy;
  spec.budget = Budget::keep(m.keep);
  spec.protection = s.protection;
  spec.scorer = scorer_config(s.scorer);
  spec.scorer.window = s.obs_window;
  spec.scorer.kernel = s.kernel;
  spec.scorer.pooling = Pooling::kMax;
  spec.schedule = {ScheduleMode::kChunked, s.chunk, s.interval};
  return spec;
}

/// What the mode's policy reads from the profile (nothing for the policies that need none).
PolicyCurves mode_curves(const Mode& m, const SensitivityProfile* profile) {
  PolicyCurves curves;
  if (profile && policy_needs_profile(m.policy)) {
    curves.layer = *profile;
    curves.has_layer = true;
  }
  return curves;
}

/// One mode's simulation (file comment): the pool, the queue, the requests in flight and the
/// figures. Holds `this` in its forward options: not to be moved.
class Simulation {
 public:
  Simulation(const LlamaEngine& engine, const std::vector<std::vector<int>>& contexts, const Settings& s, const Mode& m,
             const SensitivityProfile* profile)
      : engine_(engine), contexts_(contexts), s_(s), m_(m), c_(engine.config()),
        pool_(s.pool_seqs * blocks_per_seq(s, c_.n_layers), s.block_size, c_.n_kv_heads, c_.head_dim) {
    row_.mode = m;
    row_.pool_blocks = pool_.num_blocks();
    row_.reservation = s.reserve_override > 0 ? s.reserve_override : reservation_blocks(m, s, c_.n_layers);
    DEPTHKV_CHECK_AS("serve", row_.reservation <= pool_.num_blocks(),
                     "a request needs " << row_.reservation << " blocks, the pool has " << pool_.num_blocks());
    spec_ = prune_spec(s, m);
    curves_ = mode_curves(m, profile);
    run_.chunk_size = s.chunk;
    run_.n_threads = 1;
    for (int i = 0; i < static_cast<int>(contexts.size()); ++i) queue_.push_back(i);
  }
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  /// Serves every request; the figures, less the quality's.
  Row run();
  /// The quality requests, completed (their logits and generated tokens).
  const std::vector<std::unique_ptr<Seq>>& quality_done() const { return quality_done_; }

 private:
  void admit();
  void step(Seq& q);
  void decode(const std::vector<Seq*>& qs);
  bool forward(Seq& q, bool prefill, int n, RowMatrix& lg);
  void took(Seq& q, const Eigen::Ref<const Eigen::RowVectorXf>& logits);
  void release_completed();
  long long progress() const { return row_.prefill_tokens + row_.decode_tokens; }

  const LlamaEngine& engine_;
  const std::vector<std::vector<int>>& contexts_;
  const Settings& s_;
  const Mode m_;
  const LlamaConfig& c_;
  BlockPool<float> pool_;  // before the requests, whose caches hold its blocks
  Row row_;
  PruneSpec spec_;
  PolicyCurves curves_;
  ForwardOptions run_;
  std::deque<int> queue_;
  std::vector<std::unique_ptr<Seq>> active_;
  std::vector<std::unique_ptr<Seq>> quality_done_;
  int reserved_ = 0;
  long long active_sum_ = 0;
};

Row Simulation::run() {
  const auto t0 = Clock::now();
  while (!queue_.empty() || !active_.empty()) {
    admit();
    row_.max_active = std::max(row_.max_active, static_cast<int>(active_.size()));
    active_sum_ += static_cast<long long>(active_.size());
    ++row_.steps;
    const long long progress_before = progress();
    std::vector<Seq*> generating;  // one step: a prefill chunk or a decode token for each
    for (auto& q : active_) {
      if (q->pos < static_cast<int>(contexts_[static_cast<std::size_t>(q->id)].size()) || !s_.batch) step(*q);
      else generating.push_back(q.get());
    }
    if (!generating.empty()) decode(generating);
    release_completed();
    if (progress() == progress_before) break;  // every active request short: stuck
  }
  row_.wall_s = seconds(t0);
  row_.mean_active = row_.steps > 0 ? static_cast<double>(active_sum_) / row_.steps : 0.0;
  for (auto& q : active_) q->gen.reset();  // left by a stuck pool: their blocks go back before the leak check
  DEPTHKV_CHECK_AS("serve", pool_.num_free() == pool_.num_blocks() && pool_.check(), "blocks leaked");
  return row_;
}

/// Admission: the next requests while their reservations fit the pool.
void Simulation::admit() {
  while (!queue_.empty() && reserved_ + row_.reservation <= pool_.num_blocks()) {
    auto q = std::make_unique<Seq>();
    q->id = queue_.front();
    queue_.pop_front();
    ForwardOptions run = run_;
    run.after_chunk = [this, r = q.get()](int, std::int32_t) {  // the peaks after each append, before its eviction
      row_.peak_blocks = std::max(row_.peak_blocks, pool_.num_used());
      r->peak_blocks = std::max(r->peak_blocks, blocks_held(r->gen->cache()));
    };
    q->gen = std::make_unique<PrunedGeneration<PagedCache>>(
        engine_, paged_cache(pool_, c_), m_.evict ? std::optional<PruneSpec>(spec_) : std::nullopt, curves_, nullptr, run);
    reserved_ += row_.reservation;
    active_.push_back(std::move(q));
  }
}

/// One unit of work of a request: a prefill chunk, or a decode token.
void Simulation::step(Seq& q) {
  const int context = static_cast<int>(contexts_[static_cast<std::size_t>(q.id)].size());
  const bool prefill = q.pos < context;
  const int n = prefill ? std::min(s_.chunk, context - q.pos) : 1;
  if (blocks_for(q.gen->cache(), n) > pool_.num_free()) {  // back-pressure: never with correct admission
    ++row_.exhausted;
    return;
  }
  RowMatrix lg;
  const double sched_before = q.gen->report().schedule_ms;
  if (!forward(q, prefill, n, lg)) return;
  row_.schedule_s += (q.gen->report().schedule_ms - sched_before) / 1000.0;
  q.pos += n;
  (prefill ? row_.prefill_tokens : row_.decode_tokens) += n;
  if (q.pos >= context) took(q, lg.row(0));  // else still prefilling
}

/// The next token of request q from the logits of its last position.
void Simulation::took(Seq& q, const Eigen::Ref<const Eigen::RowVectorXf>& logits) {
  q.next = argmax(logits);
  q.generated.push_back(q.next);
  if (q.id < s_.quality) q.logits.push_back(logits.transpose());
}

/// One decode token for each of the generating requests `qs`, in one batched forward.
void Simulation::decode(const std::vector<Seq*>& qs) {
  int need = 0;
  std::vector<PrunedGeneration<PagedCache>*> gens;
  std::vector<int> tokens;
  double sched_before = 0;
  for (Seq* q : qs) {
    need += blocks_for(q->gen->cache(), 1);
    gens.push_back(q->gen.get());
    tokens.push_back(q->next);
    sched_before += q->gen->report().schedule_ms;
  }
  if (need > pool_.num_free()) {  // back-pressure: never with correct admission
    ++row_.exhausted;
    return;
  }
  RowMatrix lg;
  try {
    lg = PrunedGeneration<PagedCache>::step_batch(gens, tokens);
  } catch (const Error& e) {
    if (std::strstr(e.what(), "pool exhausted") == nullptr) throw;
    ++row_.exhausted;
    return;
  }
  double sched_after = 0;
  for (std::size_t i = 0; i < qs.size(); ++i) {
    sched_after += qs[i]->gen->report().schedule_ms;
    qs[i]->pos += 1;
    took(*qs[i], lg.row(static_cast<Eigen::Index>(i)));
  }
  row_.decode_tokens += static_cast<long long>(qs.size());
  row_.schedule_s += (sched_after - sched_before) / 1000.0;
}

/// The forward pass of a step; false (counted as exhausted) when the pool ran short anyway.
bool Simulation::forward(Seq& q, bool prefill, int n, RowMatrix& lg) {
  const std::vector<int>& ctx = contexts_[static_cast<std::size_t>(q.id)];
  try {
    lg = prefill ? q.gen->feed(ctx.data() + q.pos, n) : q.gen->step(q.next);
  } catch (const Error& e) {
    if (std::strstr(e.what(), "pool exhausted") == nullptr) throw;
    ++row_.exhausted;
    return false;
  }
  return true;
}

/// Completion: the requests that generated --gen tokens give their blocks back to the pool.
void Simulation::release_completed() {
  for (std::size_t i = 0; i < active_.size();) {
    Seq& q = *active_[i];
    if (static_cast<int>(q.generated.size()) < s_.gen) {
      ++i;
      continue;
    }
    row_.over_reservation += q.peak_blocks > row_.reservation ? 1 : 0;
    row_.peak_seq_blocks = std::max(row_.peak_seq_blocks, q.peak_blocks);
    if (q.id == 0 && m_.evict) row_.final_budgets = q.gen->report().prune.budgets;
    if (q.id < s_.quality) q.kept = kept_positions(q.gen->cache());
    q.gen.reset();  // its cache's blocks go back to the pool
    reserved_ -= row_.reservation;
    ++row_.completed;
    if (q.id < s_.quality) quality_done_.push_back(std::move(active_[i]));
    active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

/// A quality request against the full cache teacher-forced on its generated tokens.
ContinuationMetrics quality_of(const LlamaEngine& engine, const std::vector<int>& ctx, const Seq& q, const Settings& s) {
  const LlamaConfig& c = engine.config();
  HostCache full = engine.make_cache();
  ForwardOptions opt;
  opt.chunk_size = s.chunk;
  opt.all_logits = false;
  RowMatrix ref(s.gen, c.vocab_size);
  ref.row(0) = engine.forward(ctx, 0, full, opt).row(0);
  const std::vector<int> fed(q.generated.begin(), q.generated.end() - 1);
  if (!fed.empty()) ref.bottomRows(s.gen - 1) = engine.teacher_force(fed, static_cast<std::int32_t>(ctx.size()), full);
  RowMatrix got(s.gen, c.vocab_size);
  for (int i = 0; i < s.gen; ++i) got.row(i) = q.logits[static_cast<std::size_t>(i)].transpose();
  return compare_logits(ref, got, std::vector<int>(static_cast<std::size_t>(s.gen), -1));
}

/// A quality request served beside the others against its run alone: the same spec, curves and
/// engine settings on a pool of its own (the same layer type), its context fed in the same chunks,
/// then one forward per step, teacher-forced on the served tokens. Returns the largest |logit
/// difference| over the row's largest |logit| (0: bit for bit), or infinity when a kept position
/// differs at the end.
double alone_difference(const LlamaEngine& engine, const std::vector<int>& ctx, const Seq& q, const Settings& s,
                        const std::optional<PruneSpec>& spec, const PolicyCurves& curves) {
  const LlamaConfig& c = engine.config();
  BlockPool<float> pool(blocks_per_seq(s, c.n_layers), s.block_size, c.n_kv_heads, c.head_dim);
  const int chunk = s.alone_chunk > 0 ? s.alone_chunk : s.chunk;
  ForwardOptions run;
  run.chunk_size = chunk;
  run.n_threads = 1;
  PrunedGeneration<PagedCache> g(engine, paged_cache(pool, c), spec, curves, nullptr, run);
  RowMatrix lg;
  for (int p0 = 0; p0 < static_cast<int>(ctx.size()); p0 += chunk)
    lg = g.feed(ctx.data() + p0, std::min(chunk, static_cast<int>(ctx.size()) - p0));
  double worst = 0;
  for (std::size_t i = 0; i < q.generated.size(); ++i) {
    if (i > 0) lg = g.step(q.generated[i - 1]);
    const double scale = std::max(1.0, static_cast<double>(q.logits[i].cwiseAbs().maxCoeff()));
    worst = std::max(worst, static_cast<double>((lg.row(0).transpose() - q.logits[i]).cwiseAbs().maxCoeff()) / scale);
  }
  if (kept_positions(g.cache()) != q.kept) return std::numeric_limits<double>::infinity();
  return worst;
}

/// Mean KL with its standard error, and mean top-1 agreement, into the row.
void summarize_quality(const std::vector<double>& kl, const std::vector<double>& top1, Row& row) {
  row.quality_requests = static_cast<int>(kl.size());
  if (kl.empty()) return;
  double sum = 0, sq = 0, t = 0;
  for (std::size_t i = 0; i < kl.size(); ++i) {
    sum += kl[i];
    t += top1[i];
  }
  row.kl = sum / static_cast<double>(kl.size());
  for (double x : kl) sq += (x - row.kl) * (x - row.kl);
  row.kl_se = kl.size() > 1 ? std::sqrt(sq / static_cast<double>(kl.size() - 1) / static_cast<double>(kl.size())) : 0;
  row.top1 = t / static_cast<double>(kl.size());
}

/// One mode served: the simulation, then (not timed) the quality of its first --quality requests.
Row serve(const LlamaEngine& engine, const std::vector<std::vector<int>>& contexts, const Settings& s, const Mode& m,
          const SensitivityProfile* profile) {
  Simulation sim(engine, contexts, s, m, profile);
  Row row = sim.run();
  std::vector<double> kl, top1;
  const std::optional<PruneSpec> spec = m.evict ? std::optional<PruneSpec>(prune_spec(s, m)) : std::nullopt;
  for (const auto& q : sim.quality_done()) {
    const std::vector<int>& ctx = contexts[static_cast<std::size_t>(q->id)];
    const double d = alone_difference(engine, ctx, *q, s, spec, mode_curves(m, profile));
    row.alone_differ += d <= kAloneTolerance ? 0 : 1;
    row.alone_dlogit = std::max(row.alone_dlogit, d);
    const ContinuationMetrics cm = quality_of(engine, ctx, *q, s);
    kl.push_back(cm.loss.kl);
    top1.push_back(1.0 - cm.loss.top1_disagree);
  }
  summarize_quality(kl, top1, row);
  return row;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string budgets_string(const std::vector<int>& b) {
  std::string out;
  for (std::size_t i = 0; i < b.size(); ++i) out += (i ? "," : "") + std::to_string(b[i]);
  return out;
}

/// The command line: the simulation's settings and what to run it on.
struct Options {
  Settings s;
  bool json = false;
  int reps = 1;
  std::string data = depthkv_bench::default_data_dir();
  std::string profile_path, model_path, text_path;
};

/// --keep R,R,...: every ratio a whole real number.
bool parse_keeps(const char* v, std::vector<double>& keeps) {
  keeps.clear();
  for (const std::string& k : split_list(v)) {
    char* end = nullptr;
    keeps.push_back(std::strtod(k.c_str(), &end));
    if (end == k.c_str() || *end) return false;
  }
  return true;
}

/// The counts that must be >= 1.
bool counts_valid(const Settings& s, int reps) {
  const int counts[] = {s.pool_seqs, s.block_size, s.requests, s.context, s.gen, s.chunk, s.interval, reps};
  return std::all_of(std::begin(counts), std::end(counts), [](int n) { return n >= 1; });
}

bool settings_valid(const Settings& s, int reps) {
  const bool keeps_ok = std::all_of(s.keeps.begin(), s.keeps.end(), [](double k) { return k > 0 && k <= 1; });
  return counts_valid(s, reps) && s.quality >= 0 && s.skip >= 0 && keeps_ok && s.reserve_override >= 0 &&
         s.alone_chunk >= 0;
}

/// Parses and checks the options (the defaults: stories260K on TinyStories, its profile); prints
/// what is wrong and returns false.
bool parse_options(int argc, char** argv, Options& o) {
  Settings& s = o.s;
  depthkv_bench::Args args("serving_bench");
  args.option("--model", o.model_path).option("--text", o.text_path);
  args.option("--pool-seqs", s.pool_seqs).option("--block-size", s.block_size).option("--requests", s.requests);
  args.option("--context", s.context).option("--gen", s.gen).option("--chunk", s.chunk).option("--interval", s.interval);
  args.option("--keep", "R,R,...", [&s](const char* v) { return parse_keeps(v, s.keeps); });
  args.option("--policies", "uniform,optimal", [&s](const char* v) {
    s.policies = split_list(v);
    return true;
  });
  args.option("--scorer", s.scorer).option("--quality", s.quality).option("--skip", s.skip).option("--reps", o.reps);
  args.option("--profile", o.profile_path).option("--data", o.data).flag("--json", o.json);
  args.option("--reserve-blocks", s.reserve_override).flag("--mixed", s.mixed).option("--alone-chunk", s.alone_chunk);
  args.flag("--no-batch", s.batch, false);
  if (!args.parse(argc, argv)) return false;
  if (!settings_valid(s, o.reps)) {
    std::fprintf(stderr, "serving_bench: --pool-seqs, --block-size, --requests, --context, --gen, --chunk, --interval "
                         "--reps must be >= 1, --quality, --skip, --reserve-blocks, --alone-chunk >= 0, --keep in (0, 1]\n");
    return false;
  }
  const bool stories = o.model_path.empty();
  if (stories) o.model_path = o.data + "/models/stories260K/stories260K.bin";
  if (stories && o.profile_path.empty())
    o.profile_path = std::string(DEPTHKV_SOURCE_DIR) + "/docs/results/stories260K.profile.json";
  return true;
}

/// The requests' contexts: the first --context tokens of each window of --context + --gen tokens.
std::vector<std::vector<int>> request_contexts(const OpenedModel& om, const Options& o) {
  const Settings& s = o.s;
  // --text: the whole file as one document; else TinyStories split into stories
  const std::vector<int> ids =
      o.text_path.empty() ? encode_stories(*om.tokenizer,
                                           split_documents(read_text_file(o.data + "/text/tinystories_valid.txt")))
                          : om.tokenizer->encode(read_text_file(o.text_path), /*bos=*/true, /*eos=*/false);
  const auto windows = token_windows(ids, s.context + s.gen, s.skip, s.requests);
  DEPTHKV_CHECK_AS("main", static_cast<int>(windows.size()) == s.requests,
                   "the text has " << windows.size() << " windows after skipping " << s.skip << ", need " << s.requests);
  std::vector<std::vector<int>> contexts;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const int n = s.mixed ? std::max(1, s.context * (4 - static_cast<int>(i % 4)) / 4) : s.context;
    contexts.emplace_back(windows[i].begin(), windows[i].begin() + n);
  }
  return contexts;
}

/// The profile's curves for --scorer (empty without --profile, which only uniform may lack).
SensitivityProfile load_curves(const Options& o) {
  const std::vector<std::string>& p = o.s.policies;
  const bool curves = std::find(p.begin(), p.end(), "uniform") == p.end() || p.size() > 1;
  DEPTHKV_CHECK_AS("main", !curves || !o.profile_path.empty(), "policies other than uniform need --profile with --model");
  SensitivityProfile profile;
  if (!o.profile_path.empty()) profile = load_profile(o.profile_path, o.model_path).profile(o.s.scorer);
  return profile;
}

/// No eviction, then every --policies policy at every --keep ratio.
std::vector<Mode> modes_of(const Settings& s) {
  std::vector<Mode> modes{Mode{}};
  for (double k : s.keeps)
    for (const std::string& p : s.policies) modes.push_back(Mode{true, parse_allocation_policy(p), k});
  return modes;
}

/// One mode served --reps times: the first run's figures with the fastest run's wall time.
Row serve_fastest(const LlamaEngine& engine, const std::vector<std::vector<int>>& contexts, const Settings& s,
                  const Mode& m, const SensitivityProfile* profile, int reps) {
  Row row = serve(engine, contexts, s, m, profile);
  Settings again = s;
  again.quality = 0;  // the simulation is deterministic: only the wall time differs
  for (int rep = 1; rep < reps; ++rep) {
    const Row t = serve(engine, contexts, again, m, profile);
    if (t.wall_s < row.wall_s) {
      row.wall_s = t.wall_s;
      row.schedule_s = t.schedule_s;
    }
  }
  return row;
}

double tokens_per_s(const Row& r) { return static_cast<double>(r.prefill_tokens + r.decode_tokens) / r.wall_s; }
/// Requests in flight at most, against no eviction's.
double concurrency_vs_none(const Row& r, const Row& none) { return static_cast<double>(r.max_active) / none.max_active; }

void print_header(const Options& o, const LlamaConfig& c) {
  const Settings& s = o.s;
  const std::string& m = o.model_path;
  std::printf("serving_bench: %s (%d layers, %d KV heads of %d), one pool for all layers of %d x %d-token "
              "sequences, blocks of %d; %d requests of %d context + %d generated (%s windows %d..%d); "
              "prefill chunks of %d, schedule interval %d, scorer %s, sinks %d + recent %d; decode %s; quality over "
              "the first %d requests\n",
              m.substr(m.find_last_of('/') + 1).c_str(), c.n_layers, c.n_kv_heads, c.head_dim, s.pool_seqs,
              s.context + s.gen, s.block_size, s.requests, s.context, s.gen,
              o.text_path.empty() ? "TinyStories" : o.text_path.c_str(), s.skip, s.skip + s.requests - 1, s.chunk,
              s.interval, s.scorer.c_str(), s.protection.n_sink, s.protection.n_recent,
              s.batch ? "batched (one forward for all generating requests)" : "one forward per request",
              std::min(s.quality, s.requests));
}

/// One line of the table (after its column names, before the first line).
void print_table_row(const Row& r, const Row& none, const Settings& s, bool first) {
  if (first)
    std::printf("%-14s %7s %8s %7s %5s %6s %11s %7s %8s %7s %5s %4s %5s %8s %8s %8s %7s %6s %s\n", "mode", "reserve",
                "req-peak", "x-none", "max", "mean", "peak-blocks", "peak-%", "tok/s", "done", "short", "over",
                "alone", "dlogit", "KL", "+-se", "top1", "sched%", "budgets(req 0, last eviction)");
  std::printf("%-14s %7d %8d %6.2fx %5d %6.2f %11d %6.1f%% %8.0f %3d/%-3d %5d %4d %5d %8.1e %8.5f %8.5f %7.4f %5.1f%% %s\n",
              r.mode.name().c_str(), r.reservation, r.peak_seq_blocks, concurrency_vs_none(r, none), r.max_active,
              r.mean_active, r.peak_blocks, 100.0 * r.peak_blocks / r.pool_blocks, tokens_per_s(r), r.completed,
              s.requests, r.exhausted, r.over_reservation, r.alone_differ, r.alone_dlogit, r.kl, r.kl_se, r.top1,
              100.0 * r.schedule_s / r.wall_s,
              budgets_string(r.final_budgets).c_str());
  std::fflush(stdout);
}

/// --json: one object per mode.
void print_json(const std::vector<Row>& rows, const Settings& s) {
  std::printf("[\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("  {\"mode\": \"%s\", \"policy\": \"%s\", \"scorer\": \"%s\", \"keep\": %.4g, \"interval\": %d, "
                "\"chunk\": %d, \"block_size\": %d, \"pool_blocks\": %d, \"pool_seqs\": %d, "
                "\"reservation_blocks\": %d, \"max_active\": %d, \"mean_active\": %.4f, "
                "\"concurrency_vs_none\": %.4f, \"peak_blocks\": %d, \"peak_pool_fraction\": %.4f, "
                "\"peak_request_blocks\": %d, \"over_reservation\": %d, \"exhausted\": %d, "
                "\"prefill_tokens\": %lld, \"decode_tokens\": %lld, \"wall_s\": %.4f, \"schedule_s\": %.4f, "
                "\"tokens_per_s\": %.1f, "
                "\"steps\": %d, \"completed\": %d, \"requests\": %d, \"quality_requests\": %d, \"alone_differ\": %d, "
                "\"alone_dlogit\": %.3g, \"batched_decode\": %s, \"kl\": %.6g, "
                "\"kl_se\": %.6g, \"top1\": %.6g, \"final_budgets\": [%s]}%s\n",
                r.mode.name().c_str(), r.mode.evict ? to_string(r.mode.policy).c_str() : "none",
                r.mode.evict ? s.scorer.c_str() : "none", r.mode.keep, s.interval, s.chunk, s.block_size,
                r.pool_blocks, s.pool_seqs, r.reservation, r.max_active, r.mean_active,
                concurrency_vs_none(r, rows.front()), r.peak_blocks,
                static_cast<double>(r.peak_blocks) / r.pool_blocks, r.peak_seq_blocks, r.over_reservation,
                r.exhausted, r.prefill_tokens, r.decode_tokens, r.wall_s, r.schedule_s, tokens_per_s(r), r.steps,
                r.completed, s.requests, r.quality_requests, r.alone_differ, r.alone_dlogit, s.batch ? "true" : "false",
                r.kl, r.kl_se, r.top1,
                budgets_string(r.final_budgets).c_str(), i + 1 < rows.size() ? "," : "");
  }
  std::printf("]\n");
}

/// The claims the table rests on: no request held more than its reservation, no append found the
/// pool short, every request completed, and every quality request generated what it generates
/// alone. Any breach is a failure of the run, not a column: each is
/// named on stderr; returns their number.
int report_failures(const std::vector<Row>& rows, const Settings& s) {
  int failures = 0;
  for (const Row& r : rows) {
    if (r.over_reservation == 0 && r.exhausted == 0 && r.completed == s.requests && r.alone_differ == 0) continue;
    ++failures;
    std::fprintf(stderr,
                 "serving_bench: FAIL %s: %d request(s) over their reservation, %d append(s) found the pool short, "
                 "%d/%d requests completed, %d of %d quality request(s) differ from their run alone\n",
                 r.mode.name().c_str(), r.over_reservation, r.exhausted, r.completed, s.requests, r.alone_differ,
                 r.quality_requests);
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  const Settings& s = o.s;
  try {
    OpenModelOptions mo;
    mo.need_tokenizer = true;
    const OpenedModel om = open_model(o.model_path, mo);
    const LlamaEngine engine(om.model);
    const LlamaConfig& c = om.model.config;
    DEPTHKV_CHECK(s.context + s.gen - 1 <= c.seq_len,
                  "context + gen - 1 = " << s.context + s.gen - 1 << " exceeds the model's " << c.seq_len);
    const std::vector<std::vector<int>> contexts = request_contexts(om, o);
    const SensitivityProfile profile = load_curves(o);
    const SensitivityProfile* curves = o.profile_path.empty() ? nullptr : &profile;
    const std::vector<Mode> modes = modes_of(s);
    if (!o.json) print_header(o, c);
    std::vector<Row> rows;
    for (const Mode& m : modes) {
      rows.push_back(serve_fastest(engine, contexts, s, m, curves, o.reps));
      if (!o.json) print_table_row(rows.back(), rows.front(), s, rows.size() == 1);
    }
    if (o.json) print_json(rows, s);
    if (report_failures(rows, s) > 0) return 1;
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "serving_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
