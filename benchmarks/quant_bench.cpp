// Quantized matrix products (llama/quant/products.hpp) at the TinyLlama-1.1B shapes: matvec
// (decode) and a 512-token matmul (prefill) per ggml type and kernel, against Eigen's float32
// product of the dequantized matrix. Weights are random blocks with valid fp16 scales. Kernels:
// eigen_f32, dequantize, q8_act (int8 activations per 32 values), q8k_act (per 256 values; Q4_K,
// Q5_K, Q6_K).
//
//   quant_bench [--threads 2] [--tokens 512] [--types Q4_0,Q4_K,...] [--no-matmul]
//
// Reports per product: milliseconds (best of the runs), GFLOP/s (2 * rows * cols * n / time), the
// weight bytes read per second, and that as a fraction of the memcpy bandwidth measured on the
// same threads (the ceiling of a bandwidth-bound matvec).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/products.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using depthkv::llama::GgmlType;
using depthkv::llama::QuantKernel;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best wall time of fn over at least `min_runs` runs and `min_s` seconds.
template <class Fn>
double best_time(Fn&& fn, int min_runs, double min_s) {
  double best = 1e30, start = now_s();
  for (int r = 0; r < min_runs || now_s() - start < min_s; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

// Random stored bytes of a rows x cols matrix of `type`; every fp16 field a small finite half.
std::vector<std::uint8_t> random_matrix(GgmlType type, std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  const std::size_t n = depthkv::llama::ggml_row_bytes(type, cols) * static_cast<std::size_t>(rows);
  std::vector<std::uint8_t> b(n);
  for (auto& v : b) v = static_cast<std::uint8_t>(rng());
  auto half = [&] { return static_cast<std::uint16_t>(((rng() & 1) << 15) | ((8 + rng() % 4) << 10) | (rng() & 1023)); };
  auto put_half = [&](std::size_t off) {
    const std::uint16_t h = half();
    std::memcpy(&b[off], &h, 2);
  };
  depthkv::llama::GgmlTypeInfo info{};
  depthkv::llama::ggml_type_info(type, info);
  std::vector<int> fields;  // fp16 fields of a block
  switch (type) {
    case GgmlType::kF16: fields = {0}; break;
    case GgmlType::kBF16:
      for (std::size_t i = 0; i < n; i += 2) {
        const std::uint16_t h = static_cast<std::uint16_t>(((rng() & 1) << 15) | ((120 + rng() % 4) << 7) | (rng() & 127));
        std::memcpy(&b[i], &h, 2);
      }
      return b;
    case GgmlType::kF32:
      for (std::size_t i = 0; i < n; i += 4) {
        const float f = std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng);
        std::memcpy(&b[i], &f, 4);
      }
      return b;
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0: case GgmlType::kIQ4_NL: case GgmlType::kIQ4_XS:
      fields = {0}; break;
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K: fields = {0, 2}; break;
    case GgmlType::kQ2_K: fields = {80, 82}; break;
    case GgmlType::kQ3_K: fields = {108}; break;
    case GgmlType::kQ6_K: fields = {208}; break;
    default: break;
  }
  for (std::size_t blk = 0; blk < n; blk += info.type_size)
    for (int f : fields) put_half(blk + static_cast<std::size_t>(f));
  return b;
}

double memcpy_gbs(int threads) {
  const std::size_t n = std::size_t(128) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  const double t = best_time(
      [&] {
        std::vector<std::thread> th;
        const std::size_t chunk = n / static_cast<std::size_t>(threads);
        for (int i = 0; i < threads; ++i)
          th.emplace_back([&, i] { std::memcpy(b.data() + i * chunk, a.data() + i * chunk, chunk); });
        for (auto& x : th) x.join();
      },
      3, 0.3);
  return static_cast<double>(n) / t / 1e9;  // bytes copied (read once, written once) per second
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::int64_t tokens = 512;
  bool matmul = true;
  std::vector<std::string> type_names = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (a == "--no-matmul") matmul = false;
    else if (a == "--types" && i + 1 < argc) {
      type_names.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) type_names.push_back(t);
    } else {
      std::fprintf(stderr, "usage: quant_bench [--threads N] [--tokens N] [--types A,B] [--no-matmul]\n");
      return 2;
    }
  }
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);
  const double bw = memcpy_gbs(threads);
  std::printf("quant_bench: %d threads, AVX2 kernels %s, AVX-512 VNNI panels %s, memcpy %.1f GB/s\n", threads,
              depthkv::llama::detail::quant_simd_level() >= 2 ? "on" : "off",
              depthkv::cpu_simd_level() >= 3 ? "on" : "off", bw);
  std::printf("%-7s %-10s %-9s %-11s %9s %8s %7s %6s\n", "type", "shape", "product", "kernel", "ms", "GFLOP/s", "GB/s",
              "of_bw");
  const std::int64_t shapes[3][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  std::mt19937 rng(7);
  for (const std::string& tn : type_names) {
    GgmlType type = GgmlType::kF32;
    bool found = false;
    for (std::uint32_t id = 0; id < 40; ++id) {
      if (depthkv::llama::ggml_type_name(id) == tn) {
        type = static_cast<GgmlType>(id);
        found = true;
      }
    }
    if (!found || !depthkv::llama::ggml_type_dequantizable(static_cast<std::uint32_t>(type))) {
      std::fprintf(stderr, "unknown type %s\n", tn.c_str());
      return 2;
    }
    for (const auto& sh : shapes) {
      const std::int64_t rows = sh[0], cols = sh[1];
      const std::vector<std::uint8_t> w = random_matrix(type, rows, cols, rng);
      RowMat wf(rows, cols);
      depthkv::llama::dequantize_row(type, w.data(), wf.data(), rows * cols);
      Eigen::VectorXf x = Eigen::VectorXf::Random(cols), y(rows);
      RowMat X = RowMat::Random(tokens, cols), Y(tokens, rows);
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(rows), static_cast<long long>(cols));
      const double wbytes = static_cast<double>(w.size());
      auto report = [&](const char* product, const char* kernel, double t, double n, double bytes) {
        const double gflops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols) * n / t / 1e9;
        std::printf("%-7s %-10s %-9s %-11s %9.3f %8.2f %7.2f %6.2f\n", tn.c_str(), shape, product, kernel, t * 1e3, gflops,
                    bytes / t / 1e9, bytes / t / 1e9 / bw);
        std::fflush(stdout);
      };
      // matvec
      const double t_f32 = best_time([&] { y.noalias() = wf * x; }, 10, 0.5);
      report("matvec", "eigen_f32", t_f32, 1, static_cast<double>(wf.size()) * 4);
      depthkv::llama::QuantProductOptions opt;
      opt.n_threads = threads;
      opt.kernel = QuantKernel::kDequantize;
      const double t_deq = best_time([&] { depthkv::llama::quant_matvec(type, w.data(), rows, cols, x.data(), y.data(), opt); }, 10, 0.5);
      report("matvec", "dequantize", t_deq, 1, wbytes);
      const bool q8 = type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16;
      if (q8) {
        opt.kernel = QuantKernel::kQ8Activations;
        const double t_q8 = best_time([&] { depthkv::llama::quant_matvec(type, w.data(), rows, cols, x.data(), y.data(), opt); }, 10, 0.5);
        report("matvec", "q8_act", t_q8, 1, wbytes);
      }
      const bool q8k = depthkv::llama::detail::q8k_type(type);
      if (q8k) {
        opt.kernel = QuantKernel::kQ8KActivations;
        const double t_q8k = best_time([&] { depthkv::llama::quant_matvec(type, w.data(), rows, cols, x.data(), y.data(), opt); }, 10, 0.5);
        report("matvec", "q8k_act", t_q8k, 1, wbytes);
      }
      if (!matmul) continue;
      const double n = static_cast<double>(tokens);
      const double tm_f32 = best_time([&] { Y.noalias() = X * wf.transpose(); }, 2, 0.0);
      report("matmul", "eigen_f32", tm_f32, n, static_cast<double>(wf.size()) * 4);
      opt.kernel = QuantKernel::kDequantize;
      const double tm_deq = best_time([&] { depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), tokens, Y.data(), opt); }, 2, 0.0);
      report("matmul", "dequantize", tm_deq, n, wbytes);
      if (q8) {
        opt.kernel = QuantKernel::kQ8Activations;
        const double tm_q8 = best_time([&] { depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), tokens, Y.data(), opt); }, 2, 0.0);
        report("matmul", "q8_act", tm_q8, n, wbytes);
      }
      if (q8k) {
        opt.kernel = QuantKernel::kQ8KActivations;
        const double tm_q8k = best_time([&] { depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), tokens, Y.data(), opt); }, 2, 0.0);
        report("matmul", "q8k_act", tm_q8k, n, wbytes);
      }
    }
  }
  return 0;
}
