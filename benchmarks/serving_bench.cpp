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
// Continuous batching: one step gives every active request one unit of work, round robin: a
// prefill chunk of --chunk tokens (64; the schedule's after_chunk after each) for a request still
// in its context, one decode token (after_decode_step after each) for a generating one. A request
// that has generated --gen tokens releases its blocks (its layers are cleared) and the next
// requests are admitted before the next step. Forward passes are single-threaded (the reference
// engine runs one sequence per call: no batched matrix products).
//
// Modes: none (full cache); uniform and optimal (profile docs/results/stories260K.profile.json,
// --scorer snapkv or h2o, sinks 4 + recent 16, observation window 16, kernel 7, max pooling: the
// profile's selection) at every --keep ratio, with the chunked EvictionSchedule (evicts after every
// prefill chunk and every --interval decoded tokens).
//
// Quality: for the first --quality requests (16), the logits that chose each generated token are
// kept, and the same request is run again on a full host cache, teacher-forced on the generated
// tokens: mean KL(full || pruned) over the --gen distributions, and the share of tokens whose
// argmax the full cache would have chosen too (top-1 agreement). Not timed.
//
// Usage: serving_bench [--pool-seqs N] [--block-size N] [--requests N] [--context N] [--gen N]
//                      [--chunk N] [--interval M] [--keep R,R,...] [--policies uniform,optimal]
//                      [--scorer snapkv|h2o] [--quality N] [--skip N] [--reps N] [--profile FILE]
//                      [--data DIR] [--json] [--reserve-blocks N] [--model FILE [--text FILE]]
// --model: another model (GGUF or llama2.c) instead of stories260K, with --text as one document
// (default TinyStories); --profile is then needed by the policies other than uniform.
// --reps N repeats each mode's simulation N times and reports the fastest wall time (tokens/s).
// --reserve-blocks N admits every request with a reservation of N blocks instead of the computed one
// (to check the checks: a reservation below the peak must make the run fail).
// Exit status: 0 when every mode completed every request with no request over its reservation and
// no append finding the pool short; 1 otherwise (each breach named on stderr), or on an error.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
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

struct Settings {
  int pool_seqs = 8, block_size = 16, requests = 64, context = 384, gen = 128, chunk = 64, interval = 16;
  int quality = 16, skip = 24;
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

/// One request in flight: the library's driver over its paged cache.
struct Seq {
  int id = 0;
  std::unique_ptr<PrunedGeneration<PagedCache>> gen;
  int pos = 0;  // tokens fed
  int next = 0; // the token to feed next (decoding)
  std::vector<int> generated;
  std::vector<Eigen::VectorXf> logits;  // that chose each generated token (quality requests)
  int peak_blocks = 0;
};

int argmax(const Eigen::Ref<const Eigen::RowVectorXf>& r) {
  Eigen::Index i = 0;
  r.maxCoeff(&i);
  return static_cast<int>(i);
}

Row serve(const LlamaEngine& engine, const std::vector<std::vector<int>>& contexts, const Settings& s, const Mode& m,
          const SensitivityProfile* profile) {
  const LlamaConfig& c = engine.config();
  const int per_seq = c.n_layers * ((s.context + s.gen - 1 + s.block_size - 1) / s.block_size);
  BlockPool<float> pool(s.pool_seqs * per_seq, s.block_size, c.n_kv_heads, c.head_dim);
  Row row;
  row.mode = m;
  row.pool_blocks = pool.num_blocks();
  row.reservation = s.reserve_override > 0 ? s.reserve_override : reservation_blocks(m, s, c.n_layers);
  DEPTHKV_CHECK(row.reservation <= pool.num_blocks(),
                "a request needs " << row.reservation << " blocks, the pool has " << pool.num_blocks());
  PruneSpec spec;  // a chunked schedule: evict after every prefill chunk and every interval decoded tokens
  spec.policy = m.policy;
  spec.budget = Budget::keep(m.keep);
  spec.protection = s.protection;
  spec.scorer = scorer_config(s.scorer);
  spec.scorer.window = s.obs_window;
  spec.scorer.kernel = s.kernel;
  spec.scorer.pooling = Pooling::kMax;
  spec.schedule = {ScheduleMode::kChunked, s.chunk, s.interval};
  PolicyCurves curves;
  if (profile && policy_needs_profile(m.policy)) {
    curves.layer = *profile;
    curves.has_layer = true;
  }
  ForwardOptions run;
  run.chunk_size = s.chunk;
  run.n_threads = 1;
  Seq* current = nullptr;  // the request being stepped: its peaks after each append, before its eviction
  run.after_chunk = [&](int, std::int32_t) {
    row.peak_blocks = std::max(row.peak_blocks, pool.num_used());
    current->peak_blocks = std::max(current->peak_blocks, blocks_held(current->gen->cache()));
  };

  std::deque<int> queue;
  for (int i = 0; i < static_cast<int>(contexts.size()); ++i) queue.push_back(i);
  std::vector<std::unique_ptr<Seq>> active;
  std::vector<std::unique_ptr<Seq>> quality_done;
  int reserved = 0;
  long long active_sum = 0;
  const auto t0 = Clock::now();
  while (!queue.empty() || !active.empty()) {
    while (!queue.empty() && reserved + row.reservation <= pool.num_blocks()) {  // admission
      auto q = std::make_unique<Seq>();
      q->id = queue.front();
      queue.pop_front();
      PagedCache cache;
      for (int l = 0; l < c.n_layers; ++l) cache.add_layer(PagedLayer<float>(pool, c.n_kv_heads, c.head_dim));
      q->gen = std::make_unique<PrunedGeneration<PagedCache>>(
          engine, std::move(cache), m.evict ? std::optional<PruneSpec>(spec) : std::nullopt, curves, nullptr, run);
      reserved += row.reservation;
      active.push_back(std::move(q));
    }
    row.max_active = std::max(row.max_active, static_cast<int>(active.size()));
    active_sum += static_cast<long long>(active.size());
    ++row.steps;
    const long long progress_before = row.prefill_tokens + row.decode_tokens;
    for (auto& q : active) {  // one step: a prefill chunk or a decode token for each
      const std::vector<int>& ctx = contexts[static_cast<std::size_t>(q->id)];
      const bool prefill = q->pos < s.context;
      const int n = prefill ? std::min(s.chunk, s.context - q->pos) : 1;
      if (blocks_for(q->gen->cache(), n) > pool.num_free()) {  // back-pressure: never with correct admission
        ++row.exhausted;
        continue;
      }
      RowMatrix lg;
      const double sched_before = q->gen->report().schedule_ms;
      current = q.get();
      try {
        lg = prefill ? q->gen->feed(ctx.data() + q->pos, n) : q->gen->step(q->next);
      } catch (const Error& e) {
        if (std::strstr(e.what(), "pool exhausted") == nullptr) throw;
        ++row.exhausted;
        continue;
      }
      row.schedule_s += (q->gen->report().schedule_ms - sched_before) / 1000.0;
      q->pos += n;
      (prefill ? row.prefill_tokens : row.decode_tokens) += n;
      if (q->pos < s.context) continue;  // still prefilling
      q->next = argmax(lg.row(0));
      q->generated.push_back(q->next);
      if (q->id < s.quality) q->logits.push_back(lg.row(0).transpose());
    }
    for (std::size_t i = 0; i < active.size();) {  // completion: blocks back to the pool
      Seq& q = *active[i];
      if (static_cast<int>(q.generated.size()) < s.gen) {
        ++i;
        continue;
      }
      row.over_reservation += q.peak_blocks > row.reservation ? 1 : 0;
      row.peak_seq_blocks = std::max(row.peak_seq_blocks, q.peak_blocks);
      if (q.id == 0 && m.evict) row.final_budgets = q.gen->report().prune.budgets;
      q.gen.reset();  // its cache's blocks go back to the pool
      reserved -= row.reservation;
      ++row.completed;
      if (q.id < s.quality) quality_done.push_back(std::move(active[i]));
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (row.prefill_tokens + row.decode_tokens == progress_before) break;  // every active request short: stuck
  }
  row.wall_s = seconds(t0);
  row.mean_active = row.steps > 0 ? static_cast<double>(active_sum) / row.steps : 0.0;
  for (auto& q : active) q->gen.reset();  // left by a stuck pool: their blocks go back before the leak check
  DEPTHKV_CHECK(pool.num_free() == pool.num_blocks() && pool.check(), "blocks leaked");

  // quality: the full cache teacher-forced on the generated tokens
  std::vector<double> kl, top1;
  for (const auto& q : quality_done) {
    const std::vector<int>& ctx = contexts[static_cast<std::size_t>(q->id)];
    HostCache full = engine.make_cache();
    ForwardOptions opt;
    opt.chunk_size = s.chunk;
    opt.all_logits = false;
    RowMatrix ref(s.gen, c.vocab_size);
    ref.row(0) = engine.forward(ctx, 0, full, opt).row(0);
    const std::vector<int> fed(q->generated.begin(), q->generated.end() - 1);
    if (!fed.empty()) ref.bottomRows(s.gen - 1) = engine.teacher_force(fed, s.context, full);
    RowMatrix got(s.gen, c.vocab_size);
    for (int i = 0; i < s.gen; ++i) got.row(i) = q->logits[static_cast<std::size_t>(i)].transpose();
    const ContinuationMetrics cm = compare_logits(ref, got, std::vector<int>(static_cast<std::size_t>(s.gen), -1));
    kl.push_back(cm.loss.kl);
    top1.push_back(1.0 - cm.loss.top1_disagree);
  }
  row.quality_requests = static_cast<int>(kl.size());
  if (!kl.empty()) {
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

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  bool json = false;
  int reps = 1;
  std::string data = depthkv_bench::default_data_dir();
  std::string profile_path, model_path, text_path;
  depthkv_bench::Args args("serving_bench");
  args.option("--model", model_path).option("--text", text_path);
  args.option("--pool-seqs", s.pool_seqs).option("--block-size", s.block_size).option("--requests", s.requests);
  args.option("--context", s.context).option("--gen", s.gen).option("--chunk", s.chunk).option("--interval", s.interval);
  args.option("--keep", "R,R,...", [&](const char* v) {
    s.keeps.clear();
    for (const std::string& k : split_list(v)) {
      char* end = nullptr;
      s.keeps.push_back(std::strtod(k.c_str(), &end));
      if (end == k.c_str() || *end) return false;
    }
    return true;
  });
  args.option("--policies", "uniform,optimal", [&](const char* v) {
    s.policies = split_list(v);
    return true;
  });
  args.option("--scorer", s.scorer).option("--quality", s.quality).option("--skip", s.skip).option("--reps", reps);
  args.option("--profile", profile_path).option("--data", data).flag("--json", json);
  args.option("--reserve-blocks", s.reserve_override);
  if (!args.parse(argc, argv)) return 2;
  bool keeps_ok = true;
  for (double k : s.keeps) keeps_ok = keeps_ok && k > 0 && k <= 1;
  if (s.pool_seqs < 1 || s.block_size < 1 || s.requests < 1 || s.context < 1 || s.gen < 1 || s.chunk < 1 ||
      s.interval < 1 || s.quality < 0 || s.skip < 0 || reps < 1 || !keeps_ok || s.reserve_override < 0) {
    std::fprintf(stderr, "serving_bench: --pool-seqs, --block-size, --requests, --context, --gen, --chunk, --interval "
                         "--reps must be >= 1, --quality, --skip, --reserve-blocks >= 0, --keep in (0, 1]\n");
    return 2;
  }
  const bool stories = model_path.empty();  // the default: stories260K on TinyStories, its profile
  if (stories) model_path = data + "/models/stories260K/stories260K.bin";
  if (stories && profile_path.empty())
    profile_path = std::string(DEPTHKV_SOURCE_DIR) + "/docs/results/stories260K.profile.json";
  try {
    OpenModelOptions mo;
    mo.need_tokenizer = true;
    const OpenedModel om = open_model(model_path, mo);
    const LlamaModel& model = om.model;
    const LlamaEngine engine(model);
    const LlamaConfig& c = model.config;
    DEPTHKV_CHECK(s.context + s.gen - 1 <= c.seq_len,
                  "context + gen - 1 = " << s.context + s.gen - 1 << " exceeds the model's " << c.seq_len);
    // --text: the whole file as one document; else TinyStories split into stories
    const std::vector<int> ids =
        text_path.empty() ? encode_stories(*om.tokenizer,
                                           split_documents(read_text_file(data + "/text/tinystories_valid.txt")))
                          : om.tokenizer->encode(read_text_file(text_path), /*bos=*/true, /*eos=*/false);
    const auto windows = token_windows(ids, s.context + s.gen, s.skip, s.requests);
    DEPTHKV_CHECK(static_cast<int>(windows.size()) == s.requests,
                  "the text has " << windows.size() << " windows after skipping " << s.skip << ", need " << s.requests);
    std::vector<std::vector<int>> contexts;
    for (const auto& w : windows) contexts.emplace_back(w.begin(), w.begin() + s.context);
    SensitivityProfile profile;
    const bool curves = std::find(s.policies.begin(), s.policies.end(), "uniform") == s.policies.end() ||
                        s.policies.size() > 1;
    DEPTHKV_CHECK(!curves || !profile_path.empty(), "policies other than uniform need --profile with --model");
    if (!profile_path.empty()) profile = load_profile(profile_path, model_path).profile(s.scorer);

    std::vector<Mode> modes{Mode{}};
    for (double k : s.keeps)
      for (const std::string& p : s.policies) modes.push_back(Mode{true, parse_allocation_policy(p), k});
    std::vector<Row> rows;
    if (!json)
      std::printf("serving_bench: %s (%d layers, %d KV heads of %d), one pool for all layers of %d x %d-token "
                  "sequences, blocks of %d; %d requests of %d context + %d generated (%s windows %d..%d); "
                  "prefill chunks of %d, schedule interval %d, scorer %s, sinks %d + recent %d; quality over the "
                  "first %d requests\n",
                  model_path.substr(model_path.find_last_of('/') + 1).c_str(), c.n_layers, c.n_kv_heads, c.head_dim,
                  s.pool_seqs, s.context + s.gen, s.block_size, s.requests, s.context, s.gen,
                  text_path.empty() ? "TinyStories" : text_path.c_str(), s.skip, s.skip + s.requests - 1, s.chunk, s.interval, s.scorer.c_str(),
                  s.protection.n_sink, s.protection.n_recent, std::min(s.quality, s.requests));
    for (const Mode& m : modes) {
      rows.push_back(serve(engine, contexts, s, m, profile_path.empty() ? nullptr : &profile));
      Settings again = s;
      again.quality = 0;  // the simulation is deterministic: only the wall time differs
      for (int rep = 1; rep < reps; ++rep)
      {
        const Row t = serve(engine, contexts, again, m, profile_path.empty() ? nullptr : &profile);
        if (t.wall_s < rows.back().wall_s) {
          rows.back().wall_s = t.wall_s;
          rows.back().schedule_s = t.schedule_s;
        }
      }
      const Row& r = rows.back();
      if (!json) {
        if (rows.size() == 1)
          std::printf("%-14s %7s %8s %7s %5s %6s %11s %7s %8s %7s %5s %4s %8s %8s %7s %6s %s\n", "mode", "reserve",
                      "req-peak", "x-none", "max", "mean", "peak-blocks", "peak-%", "tok/s", "done", "short", "over",
                      "KL", "+-se", "top1", "sched%", "budgets(req 0, last eviction)");
        const double x = static_cast<double>(r.max_active) / rows.front().max_active;
        std::printf("%-14s %7d %8d %6.2fx %5d %6.2f %11d %6.1f%% %8.0f %3d/%-3d %5d %4d %8.5f %8.5f %7.4f %5.1f%% %s\n",
                    r.mode.name().c_str(), r.reservation, r.peak_seq_blocks, x, r.max_active, r.mean_active,
                    r.peak_blocks, 100.0 * r.peak_blocks / r.pool_blocks,
                    static_cast<double>(r.prefill_tokens + r.decode_tokens) / r.wall_s, r.completed, s.requests,
                    r.exhausted, r.over_reservation, r.kl, r.kl_se, r.top1, 100.0 * r.schedule_s / r.wall_s, budgets_string(r.final_budgets).c_str());
        std::fflush(stdout);
      }
    }
    if (json) {
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
                    "\"steps\": %d, \"completed\": %d, \"requests\": %d, \"quality_requests\": %d, \"kl\": %.6g, "
                    "\"kl_se\": %.6g, \"top1\": %.6g, \"final_budgets\": [%s]}%s\n",
                    r.mode.name().c_str(), r.mode.evict ? to_string(r.mode.policy).c_str() : "none",
                    r.mode.evict ? s.scorer.c_str() : "none", r.mode.keep, s.interval, s.chunk, s.block_size,
                    r.pool_blocks, s.pool_seqs, r.reservation, r.max_active, r.mean_active,
                    static_cast<double>(r.max_active) / rows.front().max_active, r.peak_blocks,
                    static_cast<double>(r.peak_blocks) / r.pool_blocks, r.peak_seq_blocks, r.over_reservation,
                    r.exhausted, r.prefill_tokens, r.decode_tokens, r.wall_s, r.schedule_s,
                    static_cast<double>(r.prefill_tokens + r.decode_tokens) / r.wall_s, r.steps, r.completed,
                    s.requests, r.quality_requests, r.kl, r.kl_se, r.top1, budgets_string(r.final_budgets).c_str(),
                    i + 1 < rows.size() ? "," : "");
      }
      std::printf("]\n");
    }
    // The claims the table rests on: no request held more than its reservation, no append found the
    // pool short, every request completed. Any breach is a failure of the run, not a column.
    int failures = 0;
    for (const Row& r : rows) {
      if (r.over_reservation == 0 && r.exhausted == 0 && r.completed == s.requests) continue;
      ++failures;
      std::fprintf(stderr,
                   "serving_bench: FAIL %s: %d request(s) over their reservation, %d append(s) found the pool short, "
                   "%d/%d requests completed\n",
                   r.mode.name().c_str(), r.over_reservation, r.exhausted, r.completed, s.requests);
    }
    if (failures > 0) return 1;
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "serving_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
