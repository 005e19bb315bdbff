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

// Offsets of the fp16 fields (scales, mins) in one block of `type`; none for a type not listed.
const std::vector<int>& fp16_fields(GgmlType type) {
  struct Fields {
    GgmlType type;
    std::vector<int> offsets;
  };
  static const Fields table[] = {
      {GgmlType::kF16, {0}},     {GgmlType::kQ4_0, {0}},   {GgmlType::kQ5_0, {0}},      {GgmlType::kQ8_0, {0}},
      {GgmlType::kIQ4_NL, {0}},  {GgmlType::kIQ4_XS, {0}}, {GgmlType::kQ4_1, {0, 2}},   {GgmlType::kQ5_1, {0, 2}},
      {GgmlType::kQ4_K, {0, 2}}, {GgmlType::kQ5_K, {0, 2}}, {GgmlType::kQ2_K, {80, 82}}, {GgmlType::kQ3_K, {108}},
      {GgmlType::kQ6_K, {208}},
  };
  static const std::vector<int> none;
  for (const Fields& f : table)
    if (f.type == type) return f.offsets;
  return none;
}

// Every 2-byte value a small finite bf16.
void fill_bf16(std::vector<std::uint8_t>& b, std::mt19937& rng) {
  for (std::size_t i = 0; i < b.size(); i += 2) {
    const std::uint16_t h = static_cast<std::uint16_t>(((rng() & 1) << 15) | ((120 + rng() % 4) << 7) | (rng() & 127));
    std::memcpy(&b[i], &h, 2);
  }
}

// Every 4-byte value a float in [-0.05, 0.05).
void fill_f32(std::vector<std::uint8_t>& b, std::mt19937& rng) {
  for (std::size_t i = 0; i < b.size(); i += 4) {
    const float f = std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng);
    std::memcpy(&b[i], &f, 4);
  }
}

// Random stored bytes of a rows x cols matrix of `type`; every fp16 field a small finite half.
std::vector<std::uint8_t> random_matrix(GgmlType type, std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  const std::size_t n = depthkv::llama::ggml_row_bytes(type, cols) * static_cast<std::size_t>(rows);
  std::vector<std::uint8_t> b(n);
  for (auto& v : b) v = static_cast<std::uint8_t>(rng());
  if (type == GgmlType::kBF16) {
    fill_bf16(b, rng);
    return b;
  }
  if (type == GgmlType::kF32) {
    fill_f32(b, rng);
    return b;
  }
  auto half = [&] { return static_cast<std::uint16_t>(((rng() & 1) << 15) | ((8 + rng() % 4) << 10) | (rng() & 1023)); };
  depthkv::llama::GgmlTypeInfo info{};
  depthkv::llama::ggml_type_info(type, info);
  const std::vector<int>& fields = fp16_fields(type);
  for (std::size_t blk = 0; blk < n; blk += info.type_size)
    for (int f : fields) {
      const std::uint16_t h = half();
      std::memcpy(&b[blk + static_cast<std::size_t>(f)], &h, 2);
    }
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

struct Settings {
  int threads = 2;
  std::int64_t tokens = 512;
  bool matmul = true;
  std::vector<std::string> type_names = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"};
};

// Parses the options; prints the usage line and returns false on anything else.
bool parse_settings(int argc, char** argv, Settings& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--threads" && has_value) s.threads = std::atoi(argv[++i]);
    else if (a == "--tokens" && has_value) s.tokens = std::atoll(argv[++i]);
    else if (a == "--no-matmul") s.matmul = false;
    else if (a == "--types" && has_value) {
      s.type_names.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) s.type_names.push_back(t);
    } else {
      std::fprintf(stderr, "usage: quant_bench [--threads N] [--tokens N] [--types A,B] [--no-matmul]\n");
      return false;
    }
  }
  return true;
}

// The ggml type named `name` (false when unknown or not dequantizable).
bool find_type(const std::string& name, GgmlType& type) {
  bool found = false;
  for (std::uint32_t id = 0; id < 40; ++id) {
    if (depthkv::llama::ggml_type_name(id) == name) {
      type = static_cast<GgmlType>(id);
      found = true;
    }
  }
  return found && depthkv::llama::ggml_type_dequantizable(static_cast<std::uint32_t>(type));
}

struct Kernel {
  QuantKernel kernel;
  const char* name;
};

// The quantized kernels of a type: dequantize, q8_act (not the float types), q8k_act (Q4_K, Q5_K, Q6_K).
std::vector<Kernel> kernels_of(GgmlType type) {
  std::vector<Kernel> k{{QuantKernel::kDequantize, "dequantize"}};
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16)
    k.push_back({QuantKernel::kQ8Activations, "q8_act"});
  if (depthkv::llama::detail::q8k_type(type)) k.push_back({QuantKernel::kQ8KActivations, "q8k_act"});
  return k;
}

// One random weight matrix of a type and shape, its float32 twin, the operands of its products,
// and the table's lines.
struct Case {
  Case(const std::string& type_name, GgmlType type, std::int64_t rows, std::int64_t cols, std::int64_t tokens, double bw,
       std::mt19937& rng)
      : type_name(type_name), type(type), rows(rows), cols(cols), bw(bw), w(random_matrix(type, rows, cols, rng)),
        wf(rows, cols), x(Eigen::VectorXf::Random(cols)), y(rows), X(RowMat::Random(tokens, cols)), Y(tokens, rows) {
    depthkv::llama::dequantize_row(type, w.data(), wf.data(), rows * cols);
    std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(rows), static_cast<long long>(cols));
  }

  // One line of the table: `t` seconds for a product of `n` columns reading `bytes` of weights.
  void report(const char* product, const char* kernel, double t, double n, double bytes) const {
    const double gflops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols) * n / t / 1e9;
    std::printf("%-7s %-10s %-9s %-11s %9.3f %8.2f %7.2f %6.2f\n", type_name.c_str(), shape, product, kernel, t * 1e3, gflops,
                bytes / t / 1e9, bytes / t / 1e9 / bw);
    std::fflush(stdout);
  }
  double stored_bytes() const { return static_cast<double>(w.size()); }
  double float_bytes() const { return static_cast<double>(wf.size()) * 4; }

  std::string type_name;
  GgmlType type;
  std::int64_t rows, cols;
  double bw;  // memcpy GB/s
  std::vector<std::uint8_t> w;
  RowMat wf;
  Eigen::VectorXf x, y;
  RowMat X, Y;
  char shape[32];
};

// Matrix-vector product (decode): Eigen's float32 product, then every kernel of the type.
void bench_matvec(Case& c, depthkv::llama::QuantProductOptions opt) {
  const double t_f32 = best_time([&] { c.y.noalias() = c.wf * c.x; }, 10, 0.5);
  c.report("matvec", "eigen_f32", t_f32, 1, c.float_bytes());
  for (const Kernel& k : kernels_of(c.type)) {
    opt.kernel = k.kernel;
    const double t = best_time(
        [&] { depthkv::llama::quant_matvec(c.type, c.w.data(), c.rows, c.cols, c.x.data(), c.y.data(), opt); }, 10, 0.5);
    c.report("matvec", k.name, t, 1, c.stored_bytes());
  }
}

// Matrix product of `tokens` activations (prefill): Eigen's float32 product, then every kernel of the type.
void bench_matmul(Case& c, std::int64_t tokens, depthkv::llama::QuantProductOptions opt) {
  const double n = static_cast<double>(tokens);
  const double t_f32 = best_time([&] { c.Y.noalias() = c.X * c.wf.transpose(); }, 2, 0.0);
  c.report("matmul", "eigen_f32", t_f32, n, c.float_bytes());
  for (const Kernel& k : kernels_of(c.type)) {
    opt.kernel = k.kernel;
    const double t = best_time(
        [&] { depthkv::llama::quant_matmul(c.type, c.w.data(), c.rows, c.cols, c.X.data(), tokens, c.Y.data(), opt); },
        2, 0.0);
    c.report("matmul", k.name, t, n, c.stored_bytes());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!parse_settings(argc, argv, s)) return 2;
#ifdef _OPENMP
  omp_set_num_threads(s.threads);
#endif
  Eigen::setNbThreads(s.threads);
  const double bw = memcpy_gbs(s.threads);
  std::printf("quant_bench: %d threads, AVX2 kernels %s, AVX-512 VNNI panels %s, memcpy %.1f GB/s\n", s.threads,
              depthkv::llama::detail::quant_simd_level() >= 2 ? "on" : "off",
              depthkv::cpu_simd_level() >= 3 ? "on" : "off", bw);
  std::printf("%-7s %-10s %-9s %-11s %9s %8s %7s %6s\n", "type", "shape", "product", "kernel", "ms", "GFLOP/s", "GB/s",
              "of_bw");
  const std::int64_t shapes[3][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  std::mt19937 rng(7);
  depthkv::llama::QuantProductOptions opt;
  opt.n_threads = s.threads;
  for (const std::string& tn : s.type_names) {
    GgmlType type = GgmlType::kF32;
    if (!find_type(tn, type)) {
      std::fprintf(stderr, "unknown type %s\n", tn.c_str());
      return 2;
    }
    for (const auto& sh : shapes) {
      Case c(tn, type, sh[0], sh[1], s.tokens, bw, rng);
      bench_matvec(c, opt);
      if (s.matmul) bench_matmul(c, s.tokens, opt);
    }
  }
  return 0;
}
