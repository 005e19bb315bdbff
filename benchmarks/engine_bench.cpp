// engine_bench: speed of the reference engine (depthkv/llama/engine.hpp).
//
// Reports, for the real stories260K model and for a synthetic model of TinyLlama-1.1B shape
// (random F32 weights; dim 2048, hidden 5632, 32 heads, 4 KV heads, vocab 32000, 22 layers by
// default or fewer with --layers):
//   - prefill tokens/s (batched, chunked) and decode tokens/s;
//   - the share of forward time in the matrix products, in attention, and in the rest;
//   - the cost of profiling stories260K (every layer at 6 keep ratios, windows of 384 + 128
//     tokens) with PruningEvaluator's activation reuse, against one full evaluation pass and
//     against recomputing every run;
//   - the GFLOP/s reached by the prefill's matrix products against a measured Eigen GEMM rate of
//     the same shape on this machine (same run), and decode's weight traffic against a measured
//     memcpy bandwidth (decode reads every weight once per token).
//
// --threads T runs every forward call on T threads (0: all cores); --f16 stores the synthetic
// model's matrices as F16 rows (QuantWeight, as a GGUF F16 file holds them) instead of F32;
// --skip-stories leaves out stories260K and its profiling.
//
// Usage: engine_bench [--layers N] [--prompt N] [--decode N] [--chunk N] [--windows N] [--threads T]
//                     [--f16] [--skip-synthetic] [--skip-stories] [--data DIR]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "bench_args.hpp"
#include "synthetic_models.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif

using namespace depthkv::llama;
using Clock = std::chrono::steady_clock;
using depthkv_bench::rand_matrix;
using depthkv_bench::synthetic_tinyllama;

namespace {

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Weights of the matrix products (what decode reads per token, and 2x this = FLOPs per token).
double linear_params(const LlamaConfig& c) {
  const double qd = static_cast<double>(c.n_heads) * c.head_dim, kd = static_cast<double>(c.n_kv_heads) * c.head_dim;
  const double per_layer = c.dim * (qd + 2 * kd) + qd * c.dim + 3.0 * c.dim * c.hidden_dim;
  return per_layer * c.n_layers + static_cast<double>(c.vocab_size) * c.dim;
}

/// Attention FLOPs of a causal prefill of T tokens from an empty cache (QK^T and PV, each
/// 2 * hd per visible pair, T(T+1)/2 pairs per query head and layer).
double prefill_attention_flops(const LlamaConfig& c, int T) {
  return 4.0 * c.head_dim * (static_cast<double>(T) * (T + 1) / 2) * c.n_heads * c.n_layers;
}

/// Best-of-3 GFLOP/s of Y = X W^T with X [m x k], W [n x k] (the prefill's product form).
double gemm_gflops(int m, int n, int k) {
  std::uint64_t s = 42;
  const RowMatrix X = rand_matrix(m, k, 1.0f, s), W = rand_matrix(n, k, 1.0f, s);
  RowMatrix Y(m, n);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    Y.noalias() = X * W.transpose();
    best = std::min(best, seconds(t0));
  }
  return 2.0 * m * n * k / best / 1e9;
}

/// Best-of-3 memcpy bandwidth in GB/s (bytes read + written) over `bytes`.
double memcpy_gbs(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, seconds(t0));
  }
  return 2.0 * static_cast<double>(bytes) / best / 1e9;
}

void print_stats(const char* what, const EngineStats& st) {
  const double t = st.total();
  std::printf("    %-8s time split: matmul %5.1f%%  attention %5.1f%%  other %5.1f%%\n", what, 100 * st.matmul_s / t,
              100 * st.attention_s / t, 100 * st.other_s / t);
}

void bench_model(const char* name, const LlamaModel& model, int prompt, int decode, int chunk, double gemm_rate,
                 double mem_rate, int threads) {
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  std::vector<int> tokens(static_cast<std::size_t>(prompt));
  for (int i = 0; i < prompt; ++i) tokens[static_cast<std::size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
  // warm-up (allocations, thread pool)
  {
    HostCache w = engine.make_cache();
    engine.prefill(std::vector<int>(tokens.begin(), tokens.begin() + std::min(prompt, 16)), 0, w);
  }
  HostCache cache = engine.make_cache();
  EngineStats pst;
  ForwardOptions opt;
  opt.chunk_size = chunk;
  opt.all_logits = false;  // a prefill needs only the last logits
  opt.stats = &pst;
  opt.n_threads = threads;
  auto t0 = Clock::now();
  const RowMatrix last = engine.prefill(tokens, 0, cache, opt);
  const double prefill_s = seconds(t0);
  EngineStats dst;
  Eigen::Index next = 0;
  last.row(0).maxCoeff(&next);
  t0 = Clock::now();
  for (int i = 0; i < decode; ++i) {
    const Eigen::VectorXf lg = engine.decode(static_cast<int>(next), prompt + i, cache, &dst, depthkv::CpuOptions{threads, 2});
    lg.maxCoeff(&next);
  }
  const double decode_s = seconds(t0);

  const double params = linear_params(c);
  // all_logits = false: the classifier runs for one row only
  const double mm_flops = 2.0 * (params - static_cast<double>(c.vocab_size) * c.dim) * prompt + 2.0 * c.vocab_size * c.dim;
  const double att_flops = prefill_attention_flops(c, prompt);
  std::printf("\n%s: dim %d, hidden %d, %d layers, %d heads / %d KV heads, vocab %d (%.1f M matmul weights, %.1f MB F32)\n",
              name, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, params / 1e6, 4 * params / 1e6);
  std::printf("  prefill %d tokens (chunk %d): %.3f s = %.1f tokens/s\n", prompt, chunk, prefill_s, prompt / prefill_s);
  std::printf("    matmul %.2f GFLOP in %.3f s = %.1f GFLOP/s (%.0f%% of the measured GEMM rate %.1f GFLOP/s)\n",
              mm_flops / 1e9, pst.matmul_s, mm_flops / pst.matmul_s / 1e9, 100 * mm_flops / pst.matmul_s / 1e9 / gemm_rate,
              gemm_rate);
  std::printf("    attention %.2f GFLOP in %.3f s = %.1f GFLOP/s\n", att_flops / 1e9, pst.attention_s,
              att_flops / pst.attention_s / 1e9);
  std::printf("    whole prefill: %.1f GFLOP/s\n", (mm_flops + att_flops) / prefill_s / 1e9);
  print_stats("prefill", pst);
  if (decode > 0) {
    const double bytes = 4.0 * params;  // every weight read once per token
    std::printf("  decode %d tokens (cache %d..%d): %.3f s = %.1f tokens/s; weights %.1f MB/token = %.2f GB/s (%.0f%% of memcpy %.1f GB/s)\n",
                decode, prompt, prompt + decode, decode_s, decode / decode_s, bytes / 1e6, bytes * decode / decode_s / 1e9,
                100 * bytes * decode / decode_s / 1e9 / mem_rate, mem_rate);
    print_stats("decode", dst);
  }
  std::fflush(stdout);
}

/// Profiling cost on stories260K: full passes (the evaluator's constructor), then the profile
/// with activation reuse, then a few runs without reuse to extrapolate the naive cost.
void bench_profiling(const LlamaModel& model, const std::string& data, int n_windows) {
  using namespace depthkv;
  const Tokenizer tok(data + "/models/stories260K/tok512.bin", model.config.vocab_size);
  const auto ids = encode_stories(tok, split_stories(read_text_file(data + "/text/tinystories_valid.txt")));
  const auto windows = split_windows(token_windows(ids, 512, 0, n_windows), 384);
  const LlamaEngine engine(model);
  EvalConfig cfg;
  cfg.spec.protection = Protection{4, 0};
  auto t0 = Clock::now();
  const PruningEvaluator ev(engine, windows, cfg);
  const double full_s = seconds(t0);
  SensitivityProfiler prof(model.config.n_layers);
  t0 = Clock::now();
  prof.run_batched(ev.layer_function());
  const double reuse_s = seconds(t0);
  const int runs = prof.total_runs();
  // naive: a few single-layer runs recomputed from scratch (full + pruned pass each), same threads
  EvalConfig ncfg = cfg;
  ncfg.reuse = false;
  const PruningEvaluator naive(engine, windows, ncfg);
  const int probe = 3;
  t0 = Clock::now();
  for (int l = 0; l < probe; ++l) {
    std::vector<double> plan(static_cast<std::size_t>(model.config.n_layers), 1.0);
    plan[static_cast<std::size_t>(l)] = 0.2;
    naive.evaluate_plan(plan);
  }
  const double naive_s = seconds(t0) / probe * runs;
  std::printf("\nprofiling stories260K: %d layers x %zu ratios = %d runs over %d windows (384 + 128 tokens), H2O\n",
              model.config.n_layers, prof.options().keep_ratios.size(), runs, n_windows);
  std::printf("  one full evaluation pass (all windows): %.3f s\n", full_s);
  std::printf("  profile with activation reuse: %.3f s = %.2f full passes (%.3f per run)\n", reuse_s, reuse_s / full_s,
              reuse_s / full_s / runs);
  std::printf("  recomputing every run (extrapolated from %d runs): %.3f s = %.1f full passes\n",
              probe, naive_s, naive_s / full_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 22, prompt = 512, decode = 32, chunk = 1024, windows = 16, threads = 0;
  bool synthetic = true, stories_too = true, f16 = false;
  std::string data = depthkv_bench::default_data_dir();
  depthkv_bench::Args args("engine_bench");
  args.option("--layers", layers).option("--prompt", prompt).option("--decode", decode).option("--chunk", chunk);
  args.option("--windows", windows).flag("--skip-synthetic", synthetic, false).option("--data", data);
  args.option("--threads", threads).flag("--f16", f16).flag("--skip-stories", stories_too, false);
  if (!args.parse(argc, argv)) return 2;
  if (layers < 1 || prompt < 1 || decode < 0 || chunk < 1 || windows < 1 || threads < 0) {
    std::fprintf(stderr, "engine_bench: --layers, --prompt, --chunk, --windows must be >= 1, --decode and --threads >= 0\n");
    return 2;
  }
  try {
#ifdef _OPENMP
    std::printf("Eigen %d.%d.%d, OpenMP on, %d threads; SIMD: %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
                EIGEN_MINOR_VERSION, Eigen::nbThreads(), Eigen::SimdInstructionSetsInUse());
#else
    std::printf("Eigen %d.%d.%d, no OpenMP (single thread); SIMD: %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
                EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse());
#endif
    const double gemm_small = gemm_gflops(std::min(prompt, 512), 512, 64);
    const double gemm_big = gemm_gflops(std::min(prompt, 1024), 2048, 2048);
    const double mem = memcpy_gbs(std::size_t(256) << 20);
    std::printf("measured ceilings: Eigen GEMM [%d x 2048] x [2048 x 2048]: %.1f GFLOP/s; [%d x 64] x [64 x 512]: %.1f GFLOP/s; "
                "memcpy (256 MiB): %.1f GB/s\n",
                std::min(prompt, 1024), gemm_big, std::min(prompt, 512), gemm_small, mem);

    std::printf("forward calls on %d threads (0: all cores)\n", threads);
    if (stories_too) {
      const LlamaModel stories = load_llama2c(data + "/models/stories260K/stories260K.bin");
      bench_model("stories260K", stories, std::min(prompt, stories.config.seq_len - decode), decode, chunk, gemm_small,
                  mem, threads);
      bench_profiling(stories, data, windows);
    }
    if (synthetic) {
      const auto t0 = Clock::now();
      LlamaModel tl = synthetic_tinyllama(layers);
      if (f16) depthkv_bench::store_as_f16(tl);
      std::printf("\n(synthetic weights built in %.1f s)", seconds(t0));
      char name[96];
      std::snprintf(name, sizeof name, "synthetic TinyLlama-1.1B shape, %d of 22 layers, %s weights", layers,
                    f16 ? "F16" : "F32");
      bench_model(name, tl, prompt, decode, chunk, gemm_big, mem, threads);
    }
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
