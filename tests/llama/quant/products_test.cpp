// Quantized products against dequantize_row followed by a double-precision product, for every
// type, every kernel, scalar and AVX2, on odd shapes.
//
// Tolerances (the file comment of products.hpp): kDequantize within 1e-5 * sum_k |w_k x_k| (float
// rounding in another summation order); kQ8Activations additionally within the activation
// rounding, sum over blocks of 32 values of sum_k |w_k| * (max_k |x_k| / 127) / 2, and
// kQ8KActivations (Q4_K, Q5_K, Q6_K) the same over blocks of 256 values. 11 tokens and 70 rows
// leave tails of the token tiles (4 for kQ8Activations, kQ8KTokens = 8) and of the row tile (16)
// of quant_matmul.
#include "depthkv/llama/quant/products.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "support/simd_guard.hpp"

using depthkv::llama::GgmlType;
using depthkv::llama::QuantKernel;
using depthkv::llama::QuantProductOptions;

namespace {

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,  GgmlType::kQ4_1,
                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K,  GgmlType::kQ3_K,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

// Random stored bytes of a rows x cols matrix; every fp16 / bf16 / f32 field finite and small.
std::vector<std::uint8_t> random_matrix(GgmlType type, std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  const std::size_t n = depthkv::llama::ggml_row_bytes(type, cols) * static_cast<std::size_t>(rows);
  std::vector<std::uint8_t> b(n);
  for (auto& v : b) v = static_cast<std::uint8_t>(rng());
  auto half = [&] { return static_cast<std::uint16_t>(((rng() & 1) << 15) | ((8 + rng() % 6) << 10) | (rng() & 1023)); };
  std::vector<int> fields;
  std::size_t stride = 0;
  switch (type) {
    case GgmlType::kF32:
      for (std::size_t i = 0; i < n; i += 4) {
        const float f = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
        std::memcpy(&b[i], &f, 4);
      }
      return b;
    case GgmlType::kBF16:
      for (std::size_t i = 0; i < n; i += 2) {
        const auto h = static_cast<std::uint16_t>(((rng() & 1) << 15) | ((120 + rng() % 8) << 7) | (rng() & 127));
        std::memcpy(&b[i], &h, 2);
      }
      return b;
    case GgmlType::kF16: fields = {0}; stride = 2; break;
    case GgmlType::kQ4_0: case GgmlType::kIQ4_NL: fields = {0}; stride = 18; break;
    case GgmlType::kQ5_0: fields = {0}; stride = 22; break;
    case GgmlType::kQ8_0: fields = {0}; stride = 34; break;
    case GgmlType::kQ4_1: fields = {0, 2}; stride = 20; break;
    case GgmlType::kQ5_1: fields = {0, 2}; stride = 24; break;
    case GgmlType::kQ2_K: fields = {80, 82}; stride = 84; break;
    case GgmlType::kQ3_K: fields = {108}; stride = 110; break;
    case GgmlType::kQ4_K: fields = {0, 2}; stride = 144; break;
    case GgmlType::kQ5_K: fields = {0, 2}; stride = 176; break;
    case GgmlType::kQ6_K: fields = {208}; stride = 210; break;
    case GgmlType::kIQ4_XS: fields = {0}; stride = 136; break;
    default: FAIL("type"); break;
  }
  for (std::size_t blk = 0; blk < n; blk += stride) {
    for (int f : fields) {
      const std::uint16_t h = half();
      std::memcpy(&b[blk + static_cast<std::size_t>(f)], &h, 2);
    }
  }
  return b;
}

std::int64_t block_of(GgmlType t) {
  depthkv::llama::GgmlTypeInfo info{};
  depthkv::llama::ggml_type_info(t, info);
  return info.block_size;
}

// Reference y = W x in double on the dequantized matrix, and the error bound of each row.
// act_block: 0 (float activations), 32 (kQ8Activations) or 256 (kQ8KActivations).
void reference(GgmlType type, const std::vector<float>& wf, std::int64_t rows, std::int64_t cols, const float* x,
               int act_block, std::vector<double>& y, std::vector<double>& tol) {
  y.assign(static_cast<std::size_t>(rows), 0.0);
  tol.assign(static_cast<std::size_t>(rows), 0.0);
  (void)type;
  for (std::int64_t r = 0; r < rows; ++r) {
    double s = 0, a = 0, act = 0;
    for (std::int64_t k = 0; k < cols; ++k) {
      const double w = wf[static_cast<std::size_t>(r * cols + k)];
      s += w * x[k];
      a += std::fabs(w * x[k]);
    }
    if (act_block > 0) {
      for (std::int64_t b0 = 0; b0 < cols; b0 += act_block) {
        double amax = 0, wsum = 0;
        for (std::int64_t k = b0; k < b0 + act_block; ++k) {
          amax = std::max(amax, static_cast<double>(std::fabs(x[k])));
          wsum += std::fabs(wf[static_cast<std::size_t>(r * cols + k)]);
        }
        act += wsum * amax / 127.0 / 2.0 * 1.0001;
      }
    }
    y[static_cast<std::size_t>(r)] = s;
    tol[static_cast<std::size_t>(r)] = 1e-5 * a + act + 1e-30;
  }
}

// quant_matvec and quant_matmul of the stored matrix w (dequantized: wf) with the rows of X, against
// the double reference of each row with its activation-rounding tolerance.
void check_products_against_reference(GgmlType type, const std::vector<std::uint8_t>& w, const std::vector<float>& wf,
                                      std::int64_t rows, std::int64_t cols, const std::vector<float>& X, std::int64_t n,
                                      QuantKernel kernel, int threads, int level) {
  const bool q8_ok = block_of(type) > 1;
  const bool q8k_ok = depthkv::llama::detail::q8k_type(type);
  QuantProductOptions opt;
  opt.n_threads = threads;
  opt.max_simd_level = level;
  opt.kernel = kernel;
  // kAuto: per-256 int8 activations for Q4_K, Q5_K, Q6_K, per-32 for the other block types
  std::vector<double> ref, tol;
  const int act = kernel == QuantKernel::kQ8KActivations || (kernel == QuantKernel::kAuto && q8k_ok) ? 256
                  : kernel == QuantKernel::kQ8Activations || (kernel == QuantKernel::kAuto && q8_ok) ? 32
                                                                                                   : 0;
  reference(type, wf, rows, cols, X.data(), act, ref, tol);
  std::vector<float> y(static_cast<std::size_t>(rows), NAN);
  depthkv::llama::quant_matvec(type, w.data(), rows, cols, X.data(), y.data(), opt);
  for (std::int64_t r = 0; r < rows; ++r) {
    INFO("row " << r << " got " << y[r] << " want " << ref[r] << " tol " << tol[r]);
    REQUIRE(std::fabs(y[r] - ref[r]) <= tol[r]);
  }
  // matmul
  std::vector<float> Y(static_cast<std::size_t>(n * rows), NAN);
  depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), n, Y.data(), opt);
  for (std::int64_t t = 0; t < n; ++t) {
    reference(type, wf, rows, cols, X.data() + t * cols, act, ref, tol);
    for (std::int64_t r = 0; r < rows; ++r) {
      INFO("token " << t << " row " << r << " got " << Y[t * rows + r] << " want " << ref[r]);
      REQUIRE(std::fabs(Y[t * rows + r] - ref[r]) <= tol[r]);
    }
  }
}

// A random stored rows x cols matrix of `type` (w), its dequantized floats (wf) and n x cols
// standard normal activations (X), drawn in that order.
struct RandomProduct {
  std::vector<std::uint8_t> w;
  std::vector<float> wf, X;
};
RandomProduct random_product(GgmlType type, std::int64_t rows, std::int64_t cols, std::int64_t n, std::mt19937& rng) {
  RandomProduct p;
  p.w = random_matrix(type, rows, cols, rng);
  p.wf.resize(static_cast<std::size_t>(rows * cols));
  depthkv::llama::dequantize_row(type, p.w.data(), p.wf.data(), rows * cols);
  p.X.resize(static_cast<std::size_t>(n * cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : p.X) v = nd(rng);
  return p;
}

}  // namespace

TEST_CASE("quant_matvec and quant_matmul match dequantize-then-float for every type", "[llama][quant]") {
  std::mt19937 rng(14);
  for (const int level : depthkv_test::available_simd_levels()) {  // through the options: no global cap
    for (const GgmlType type : kTypes) {
      const std::int64_t bs = block_of(type);
      const std::int64_t col_blocks[] = {1, 3, bs == 1 ? 37 : 8};
      for (const std::int64_t cb : col_blocks) {
        const std::int64_t cols = cb * (bs == 1 ? 1 : bs);
        for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{7}, std::int64_t{70}}) {
          INFO("level " << level << " type " << depthkv::llama::ggml_type_name(type) << " " << rows << "x" << cols);
          const std::vector<std::uint8_t> w = random_matrix(type, rows, cols, rng);
          std::vector<float> wf(static_cast<std::size_t>(rows * cols));
          depthkv::llama::dequantize_row(type, w.data(), wf.data(), rows * cols);
          const std::int64_t n = 11;
          std::vector<float> X(static_cast<std::size_t>(n * cols));
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (float& v : X) v = nd(rng);
          const bool q8_ok = block_of(type) > 1;
          const bool q8k_ok = depthkv::llama::detail::q8k_type(type);
          for (const QuantKernel kernel : {QuantKernel::kAuto, QuantKernel::kDequantize, QuantKernel::kQ8Activations,
                                           QuantKernel::kQ8KActivations}) {
            if (kernel == QuantKernel::kQ8Activations && !q8_ok) continue;
            if (kernel == QuantKernel::kQ8KActivations && !q8k_ok) continue;
            for (const int threads : {1, 3}) {
              INFO("kernel " << static_cast<int>(kernel) << " threads " << threads);
              check_products_against_reference(type, w, wf, rows, cols, X, n, kernel, threads, level);
            }
          }
          // quant_row_dot is the kDequantize row of matvec.
          std::vector<double> ref, tol;
          reference(type, wf, 1, cols, X.data(), 0, ref, tol);
          CHECK(std::fabs(depthkv::llama::quant_row_dot(type, w.data(), X.data(), cols, depthkv::CpuOptions{1, level}) -
                          ref[0]) <= tol[0]);
        }
      }
    }
  }
}

TEST_CASE("quantized products: scalar and AVX2 agree, and an odd address works", "[llama][quant]") {
  const std::vector<int> levels = depthkv_test::available_simd_levels();
  if (levels.back() < 2) SUCCEED("no AVX2 on this CPU / build: only the scalar path runs");
  std::mt19937 rng(5);
  for (const GgmlType type : kTypes) {
    INFO("type " << depthkv::llama::ggml_type_name(type));
    const std::int64_t rows = 9, cols = 512;
    const std::vector<std::uint8_t> w = random_matrix(type, rows, cols, rng);
    std::vector<std::uint8_t> shifted(w.size() + 1);
    std::memcpy(shifted.data() + 1, w.data(), w.size());
    std::vector<float> x(static_cast<std::size_t>(cols));
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    std::vector<float> y0(rows), y2(rows);
    QuantProductOptions scalar;
    scalar.max_simd_level = 0;
    depthkv::llama::quant_matvec(type, shifted.data() + 1, rows, cols, x.data(), y0.data(), scalar);
    depthkv::llama::quant_matvec(type, w.data(), rows, cols, x.data(), y2.data());
    for (std::int64_t r = 0; r < rows; ++r) CHECK(y0[r] == Approx(y2[r]).epsilon(1e-4).margin(1e-4));
    // matmul, every int8 kernel of the type: both levels quantize the activations alike, so they
    // differ by float rounding only (far inside the activation-rounding tolerance of the test above)
    const std::int64_t n = 11;  // a full 8-token tile and a tail
    std::vector<float> X(static_cast<std::size_t>(n * cols));
    for (float& v : X) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    for (const QuantKernel kernel : {QuantKernel::kAuto, QuantKernel::kQ8Activations, QuantKernel::kQ8KActivations}) {
      if (block_of(type) == 1 && kernel != QuantKernel::kAuto) continue;
      if (kernel == QuantKernel::kQ8KActivations && !depthkv::llama::detail::q8k_type(type)) continue;
      INFO("kernel " << static_cast<int>(kernel));
      QuantProductOptions opt;
      opt.kernel = kernel;
      std::vector<float> Y0(static_cast<std::size_t>(n * rows)), Y2(static_cast<std::size_t>(n * rows));
      QuantProductOptions opt0 = opt;
      opt0.max_simd_level = 0;
      depthkv::llama::quant_matmul(type, shifted.data() + 1, rows, cols, X.data(), n, Y0.data(), opt0);
      depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), n, Y2.data(), opt);
      for (std::int64_t i = 0; i < n * rows; ++i) CHECK(Y0[i] == Approx(Y2[i]).epsilon(1e-4).margin(1e-4));
    }
  }
}

TEST_CASE("quant_matmul: the AVX-512 VNNI panels match the reference and the AVX2 kernels", "[llama][quant]") {
  // kVnniMinTokens or more tokens take the panel kernel (vnni_panels.hpp) at level 3; 37 tokens and
  // 70 rows leave tails of its 4-token tiles and 16-row panels
  depthkv_test::require_simd_level(3, "AVX-512 VNNI");
  std::mt19937 rng(31);
  const std::int64_t rows = 70, n = depthkv::llama::detail::kVnniMinTokens + 5;
  for (const GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kQ4_0,
                              GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    for (const std::int64_t cols : {std::int64_t{256}, std::int64_t{768}}) {
      INFO("type " << depthkv::llama::ggml_type_name(type) << " cols " << cols);
      const RandomProduct p = random_product(type, rows, cols, n, rng);
      const std::vector<std::uint8_t>& w = p.w;
      const std::vector<float>&wf = p.wf, &X = p.X;
      for (const int threads : {1, 3}) check_products_against_reference(type, w, wf, rows, cols, X, n, QuantKernel::kAuto, threads, 3);
      // the AVX2 kernel: the same integer sums, so float rounding apart only (within 1e-5 of
      // sum_k |w_k x_k|: the terms cancel)
      std::vector<float> Y2(static_cast<std::size_t>(n * rows)), Y3(Y2.size());
      depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), n, Y2.data(),
                                   QuantProductOptions(depthkv::CpuOptions{1, 2}));
      depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), n, Y3.data(),
                                   QuantProductOptions(depthkv::CpuOptions{1, 3}));
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t r = 0; r < rows; ++r) {
          double mag = 0;
          for (std::int64_t k = 0; k < cols; ++k)
            mag += std::fabs(static_cast<double>(wf[static_cast<std::size_t>(r * cols + k)]) * X[static_cast<std::size_t>(t * cols + k)]);
          const std::size_t i = static_cast<std::size_t>(t * rows + r);
          INFO("token " << t << " row " << r << " VNNI " << Y3[i] << " AVX2 " << Y2[i] << " sum |w x| " << mag);
          REQUIRE(std::fabs(static_cast<double>(Y3[i]) - Y2[i]) <= 1e-5 * mag);
        }
      }
    }
  }
}

TEST_CASE("quant_matmul: the float panels of kDequantize match the reference", "[llama][quant]") {
  // kFloatPanelMinTokens or more tokens take the interleaved 16-row panels (AVX2); 23 tokens and
  // 70 rows leave tails of its 6-token tiles and of the panels, 37 columns a tail of its transposes
  std::mt19937 rng(19);
  const std::int64_t rows = 70, n = depthkv::llama::kFloatPanelMinTokens + 7;
  for (const GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0}) {
    const std::int64_t cols = block_of(type) == 1 ? 37 : 96;
    INFO("type " << depthkv::llama::ggml_type_name(type));
    const RandomProduct p = random_product(type, rows, cols, n, rng);
    for (const int level : depthkv_test::available_simd_levels())
      for (const int threads : {1, 3})
        check_products_against_reference(type, p.w, p.wf, rows, cols, p.X, n, QuantKernel::kDequantize, threads, level);
  }
}

TEST_CASE("quant_matvec_many: the bytes of quant_matvec on each matrix, errors before any output", "[llama][quant]") {
  std::mt19937 rng(23);
  const std::int64_t cols = 512;
  const GgmlType types[] = {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kQ6_K};
  const std::int64_t rows[] = {70, 33, 5, 40};
  std::vector<std::vector<std::uint8_t>> w;
  for (int i = 0; i < 4; ++i) w.push_back(random_matrix(types[i], rows[i], cols, rng));
  std::vector<float> x(static_cast<std::size_t>(cols));
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (const int level : depthkv_test::available_simd_levels()) {
    for (const int threads : {1, 3}) {
      INFO("level " << level << " threads " << threads);
      const QuantProductOptions opt(depthkv::CpuOptions{threads, level});
      std::vector<std::vector<float>> one(4), many(4);
      std::vector<depthkv::llama::QuantMatvecTarget> targets;
      for (int i = 0; i < 4; ++i) {
        one[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(rows[i]), NAN);
        many[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(rows[i]), NAN);
        depthkv::llama::quant_matvec(types[i], w[static_cast<std::size_t>(i)].data(), rows[i], cols, x.data(),
                                     one[static_cast<std::size_t>(i)].data(), opt);
        targets.push_back({types[i], w[static_cast<std::size_t>(i)].data(), rows[i], many[static_cast<std::size_t>(i)].data()});
      }
      depthkv::llama::quant_matvec_many(targets.data(), 4, cols, x.data(), opt);
      for (int i = 0; i < 4; ++i)
        REQUIRE(std::memcmp(one[static_cast<std::size_t>(i)].data(), many[static_cast<std::size_t>(i)].data(),
                            sizeof(float) * static_cast<std::size_t>(rows[i])) == 0);
    }
  }
  // a bad last target: nothing is written, not even to the good ones before it
  std::vector<float> y0(static_cast<std::size_t>(rows[0]), 7.0f), y1(static_cast<std::size_t>(rows[1]), 7.0f);
  const depthkv::llama::QuantMatvecTarget bad[] = {{types[0], w[0].data(), rows[0], y0.data()},
                                                   {GgmlType::kIQ2_XXS, w[1].data(), rows[1], y1.data()}};
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec_many(bad, 2, cols, x.data()), Catch::Contains("IQ2_XXS"));
  CHECK(y0[0] == 7.0f);
  CHECK(y1[0] == 7.0f);
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec_many(bad, -1, cols, x.data()), Catch::Contains("negative number of matrices"));
}

TEST_CASE("int8 activations: the AVX2 quantizers give the scalar bytes", "[llama][quant]") {
  depthkv_test::require_simd_level(2, "AVX2");  // level 2 needs DEPTHKV_AVX2_DISPATCH
#if defined(DEPTHKV_AVX2_DISPATCH)
  namespace qd = depthkv::llama::detail;
  std::mt19937 rng(8);
  const std::int64_t n = 768;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int trial = 0; trial < 40; ++trial) {
    std::normal_distribution<float> nd(0.0f, trial % 4 == 0 ? 1e-3f : 3.0f);
    for (float& v : x) v = nd(rng);
    if (trial % 5 == 1) {  // exact halves of the step: ties, rounded to even by both
      for (std::size_t j = 0; j < x.size(); ++j) x[j] = 0.5f * static_cast<float>(static_cast<int>(j % 255) - 127);
    }
    if (trial % 7 == 3) std::fill(x.begin(), x.begin() + 256, 0.0f);  // a zero block: d = 0
    std::vector<qd::ActQ8> a(static_cast<std::size_t>(n / 32)), b(a.size());
    qd::quantize_act_q8(x.data(), n, a.data());
    qd::quantize_act_q8_avx2(x.data(), n, b.data());
    REQUIRE(std::memcmp(a.data(), b.data(), sizeof(qd::ActQ8) * a.size()) == 0);
    std::vector<qd::ActQ8K> c(static_cast<std::size_t>(n / 256)), e(c.size());
    std::memset(static_cast<void*>(c.data()), 0, sizeof(qd::ActQ8K) * c.size());
    std::memset(static_cast<void*>(e.data()), 0, sizeof(qd::ActQ8K) * e.size());
    qd::quantize_act_q8k(x.data(), n, c.data());
    qd::quantize_act_q8k_avx2(x.data(), n, e.data());
    for (std::size_t i = 0; i < c.size(); ++i) {
      INFO("trial " << trial << " block " << i);
      REQUIRE(std::memcmp(c[i].qs, e[i].qs, sizeof(c[i].qs)) == 0);
      REQUIRE(std::memcmp(c[i].bsums, e[i].bsums, sizeof(c[i].bsums)) == 0);
      REQUIRE(std::memcmp(&c[i].d, &e[i].d, sizeof(float)) == 0);
    }
  }
#endif
}

TEST_CASE("quantized products: empty shapes and invalid input", "[llama][quant]") {
  std::vector<std::uint8_t> w(144 * 4);
  std::vector<float> x(512), y(4, 7.0f);
  depthkv::llama::quant_matvec(GgmlType::kQ4_K, w.data(), 0, 256, x.data(), y.data());
  depthkv::llama::quant_matmul(GgmlType::kQ4_K, w.data(), 4, 256, x.data(), 0, y.data());
  CHECK(y[0] == 7.0f);  // nothing written
  depthkv::llama::quant_matvec(GgmlType::kF32, nullptr, 4, 0, nullptr, y.data());
  CHECK(y[0] == 0.0f);  // zero columns: zero sums
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec(GgmlType::kQ4_K, w.data(), 2, 100, x.data(), y.data()),
                    Catch::Contains("Q4_K") && Catch::Contains("256"));
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec(GgmlType::kIQ2_XXS, w.data(), 2, 256, x.data(), y.data()),
                    Catch::Contains("IQ2_XXS"));
  QuantProductOptions opt;
  opt.kernel = QuantKernel::kQ8Activations;
  CHECK_THROWS_WITH(depthkv::llama::quant_matmul(GgmlType::kF16, w.data(), 2, 256, x.data(), 1, y.data(), opt),
                    Catch::Contains("F16"));
  opt.kernel = QuantKernel::kQ8KActivations;  // Q4_K, Q5_K, Q6_K only
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec(GgmlType::kQ4_0, w.data(), 2, 256, x.data(), y.data(), opt),
                    Catch::Contains("Q4_0"));
  CHECK_THROWS_WITH(depthkv::llama::quant_matmul(GgmlType::kQ2_K, w.data(), 2, 256, x.data(), 1, y.data(), opt),
                    Catch::Contains("Q2_K"));
}

TEST_CASE("quantized products: the same bytes for every thread count and on a ThreadPool, levels through the options", "[llama][quant]") {
  std::mt19937 rng(77);
  depthkv::ThreadPool pool;
  const std::int64_t rows = 70, cols = 512, n = 13;  // 16-row tasks, 8- and 4-token tiles with tails
  std::vector<float> X(static_cast<std::size_t>(n * cols));
  for (float& v : X) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (const GgmlType type : kTypes) {
    const std::vector<std::uint8_t> w = random_matrix(type, rows, cols, rng);
    for (const int level : depthkv_test::available_simd_levels()) {
      for (const QuantKernel kernel : {QuantKernel::kAuto, QuantKernel::kDequantize}) {
        INFO("type " << depthkv::llama::ggml_type_name(type) << " level " << level << " kernel " << static_cast<int>(kernel));
        std::vector<float> y1(static_cast<std::size_t>(rows)), Y1(static_cast<std::size_t>(n * rows));
        for (const int threads : {1, 2, 5, -2, -5}) {  // negative: that many on a ThreadPool
          const QuantProductOptions opt(depthkv::CpuOptions{std::abs(threads), level, threads < 0 ? &pool : nullptr},
                                        kernel);
          std::vector<float> y(static_cast<std::size_t>(rows)), Y(static_cast<std::size_t>(n * rows));
          depthkv::llama::quant_matvec(type, w.data(), rows, cols, X.data(), y.data(), opt);
          depthkv::llama::quant_matmul(type, w.data(), rows, cols, X.data(), n, Y.data(), opt);
          if (threads == 1) {
            y1 = y;
            Y1 = Y;
          }
          INFO("threads " << threads);
          REQUIRE(std::memcmp(y.data(), y1.data(), sizeof(float) * y.size()) == 0);
          REQUIRE(std::memcmp(Y.data(), Y1.data(), sizeof(float) * Y.size()) == 0);
        }
      }
    }
  }
  QuantProductOptions bad;
  bad.max_simd_level = 4;
  std::vector<float> y(static_cast<std::size_t>(rows));
  const std::vector<std::uint8_t> w = random_matrix(GgmlType::kQ8_0, rows, cols, rng);
  CHECK_THROWS_WITH(depthkv::llama::quant_matvec(GgmlType::kQ8_0, w.data(), rows, cols, X.data(), y.data(), bad),
                    Catch::Contains("max_simd_level must be 0, 1, 2 or 3, got 4"));
  bad.max_simd_level = 2;
  bad.n_threads = -1;
  CHECK_THROWS_WITH(depthkv::llama::quant_matmul(GgmlType::kQ8_0, w.data(), rows, cols, X.data(), n, y.data(), bad),
                    Catch::Contains("n_threads must be in [0, 1024]"));
}
