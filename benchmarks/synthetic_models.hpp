#pragma once
// Synthetic models of real shapes for the benchmarks (random weights, deterministic): float32
// (synthetic_tinyllama), or stored ggml blocks in memory of a named shape and file type
// (synthetic_model), so that a benchmark needs no file.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/quant/dequantize.hpp"

namespace depthkv_bench {

using depthkv::llama::LlamaConfig;
using depthkv::llama::LlamaLayerWeights;
using depthkv::llama::LlamaModel;
using depthkv::llama::QuantWeight;
using depthkv::llama::GgmlType;
using depthkv::llama::RowMatrix;

/// Fast deterministic fill (xorshift), uniform in [-scale, scale].
inline void fill(float* p, std::size_t n, float scale, std::uint64_t& s) {
  for (std::size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
  }
}
inline RowMatrix rand_matrix(int r, int c, float scale, std::uint64_t& s) {
  RowMatrix m(r, c);
  fill(m.data(), static_cast<std::size_t>(m.size()), scale, s);
  return m;
}

/// TinyLlama-1.1B's shape (llama: dim 2048, hidden 5632, 32 heads, 4 KV heads of 64, vocab 32000,
/// 22 layers, or fewer) with random weights of scale 1/sqrt(fan-in) and unit norms.
inline LlamaModel synthetic_tinyllama(int n_layers) {
  LlamaModel m;
  LlamaConfig& c = m.config;
  c.dim = 2048;
  c.hidden_dim = 5632;
  c.n_layers = n_layers;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.vocab_size = 32000;
  c.seq_len = 2048;
  c.head_dim = 64;
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  const float a = 1.0f / std::sqrt(2048.0f), b = 1.0f / std::sqrt(5632.0f);
  m.token_embedding = rand_matrix(c.vocab_size, c.dim, 1.0f, s);
  for (int l = 0; l < n_layers; ++l) {
    LlamaLayerWeights w;
    w.attn_norm = Eigen::VectorXf::Ones(c.dim);
    w.ffn_norm = Eigen::VectorXf::Ones(c.dim);
    w.wq = rand_matrix(2048, 2048, a, s);
    w.wk = rand_matrix(256, 2048, a, s);
    w.wv = rand_matrix(256, 2048, a, s);
    w.wo = rand_matrix(2048, 2048, a, s);
    w.w1 = rand_matrix(5632, 2048, a, s);
    w.w3 = rand_matrix(5632, 2048, a, s);
    w.w2 = rand_matrix(2048, 5632, b, s);
    m.layers.push_back(std::move(w));
  }
  m.final_norm = Eigen::VectorXf::Ones(c.dim);
  m.classifier = rand_matrix(c.vocab_size, c.dim, a, s);
  return m;
}

/// The hyper-parameters of a real model (from its config.json), without weights.
struct SyntheticShape {
  const char* name;          ///< e.g. "qwen2.5-0.5b"
  const char* architecture;  ///< "llama" or "qwen2"
  int n_layers, dim, hidden_dim, n_heads, n_kv_heads, head_dim, vocab_size, seq_len;
  float rope_theta, rms_eps;
  bool rope_neox, tied, qkv_bias;
};

/// The shapes `synthetic_model` builds. Llama-3.2-1B's RoPE frequency factors are left out (they
/// change no cost).
inline const std::vector<SyntheticShape>& synthetic_shapes() {
  static const std::vector<SyntheticShape> shapes = {
      {"llama-3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 500000.0f, 1e-5f, false, true, false},
      {"qwen2.5-0.5b", "qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, 1000000.0f, 1e-6f, true, true, true},
      {"tinyllama-1.1b", "llama", 22, 2048, 5632, 32, 4, 64, 32000, 2048, 10000.0f, 1e-5f, false, false, false},
  };
  return shapes;
}

/// The file types `synthetic_model` builds.
inline std::vector<std::string> synthetic_types() { return {"F32", "F16", "Q8_0", "Q4_K_M"}; }

namespace detail {

/// Where a block type keeps its fp16 scales, and each scale's value as a multiple of the
/// largest weight magnitude `a` (so that random bytes give |w| <= about a).
struct BlockScales {
  GgmlType type;
  std::size_t block_bytes;
  int n;
  std::size_t offset[2];
  double per_a[2];
};

inline const BlockScales& block_scales(GgmlType t) {
  static const BlockScales table[] = {
      {GgmlType::kQ8_0, 34, 1, {0, 0}, {1.0 / 127, 0}},                 // d * int8
      {GgmlType::kQ5_0, 22, 1, {0, 0}, {1.0 / 16, 0}},                  // d * (5-bit - 16)
      {GgmlType::kQ4_K, 144, 2, {0, 2}, {1.0 / 945, 1.0 / 189}},        // d * 6-bit scale * 4-bit - dmin * 6-bit min
      {GgmlType::kQ6_K, 210, 1, {208, 0}, {1.0 / (128.0 * 32), 0}},     // d * int8 scale * (6-bit - 32)
  };
  for (const BlockScales& b : table)
    if (b.type == t) return b;
  throw depthkv::Error("synthetic_model: no block layout for " + depthkv::llama::ggml_type_name(t));
}

inline std::uint16_t fp16_bits(float x) {
  const Eigen::half h(x);
  std::uint16_t b = 0;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

inline std::uint64_t next_random(std::uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

/// A `rows x cols` weight of type `t` with random contents of magnitude up to `a`, owned by the
/// returned `QuantWeight` (`keep_alive`).
inline QuantWeight random_weight(GgmlType t, std::int64_t rows, std::int64_t cols, double a, std::uint64_t& s) {
  QuantWeight w;
  w.type = t;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = depthkv::llama::ggml_row_bytes(t, cols);
  auto bytes = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(w.n_bytes()));
  std::uint8_t* p = bytes->data();
  const std::size_t n = bytes->size();
  if (t == GgmlType::kF16) {
    for (std::size_t i = 0; i + 1 < n; i += 2) {
      const float x = static_cast<float>(a * (static_cast<double>(next_random(s) >> 11) / 4503599627370496.0 - 1.0));
      const std::uint16_t b = fp16_bits(x);
      std::memcpy(p + i, &b, 2);
    }
  } else {
    for (std::size_t i = 0; i < n; i += 8) {
      const std::uint64_t r = next_random(s);
      std::memcpy(p + i, &r, std::min<std::size_t>(8, n - i));
    }
    const BlockScales& b = block_scales(t);
    for (std::size_t blk = 0; blk < n / b.block_bytes; ++blk)
      for (int k = 0; k < b.n; ++k) {
        const std::uint16_t d = fp16_bits(static_cast<float>(a * b.per_a[k]));
        std::memcpy(p + blk * b.block_bytes + b.offset[k], &d, 2);
      }
  }
  w.data = p;
  w.keep_alive = std::shared_ptr<const void>(bytes, bytes->data());
  return w;
}

/// llama.cpp's fallback for rows that do not hold whole 256-value blocks (Q4_K -> Q5_0,
/// Q6_K -> Q8_0), as its quantizer does for such tensors.
inline GgmlType fit_type(GgmlType t, std::int64_t cols) {
  if (cols % 256 == 0) return t;
  if (t == GgmlType::kQ4_K) return GgmlType::kQ5_0;
  if (t == GgmlType::kQ6_K) return GgmlType::kQ8_0;
  return t;
}

/// The stored type of one tensor for file type `type` (empty `role` = a layer matrix; "v" and
/// "down" = attn_v / ffn_down of layer `l` of `n`; "output" = the classifier, or the tied
/// embedding). Q4_K_M follows llama.cpp's rule: Q4_K, with Q6_K for the output and for attn_v /
/// ffn_down of the first and last eighth of the layers and every third one between.
inline GgmlType tensor_type(const std::string& type, const std::string& role, int l, int n, std::int64_t cols) {
  if (type == "F16") return GgmlType::kF16;
  if (type == "Q8_0") return GgmlType::kQ8_0;
  const bool more_bits = l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
  const bool q6 = role == "output" || ((role == "v" || role == "down") && more_bits);
  return fit_type(q6 ? GgmlType::kQ6_K : GgmlType::kQ4_K, cols);
}

/// Sets one weight of a layer or the model: float32 `m` for "F32", else the stored form `q`.
inline void set_weight(depthkv::llama::RowMatrix& m, QuantWeight& q, const std::string& type, const std::string& role,
                       int l, int n, int rows, int cols, std::uint64_t& s, std::uint64_t& bytes) {
  const double a = std::sqrt(3.0 / cols);  // uniform with standard deviation 1/sqrt(fan-in)
  if (type == "F32") {
    m = rand_matrix(rows, cols, static_cast<float>(a), s);
    bytes += 4ull * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
    return;
  }
  q = random_weight(tensor_type(type, role, l, n, cols), rows, cols, a, s);
  bytes += q.n_bytes();
}

inline LlamaConfig shape_config(const SyntheticShape& sh, int n_layers) {
  LlamaConfig c;
  c.dim = sh.dim;
  c.hidden_dim = sh.hidden_dim;
  c.n_layers = n_layers;
  c.n_heads = sh.n_heads;
  c.n_kv_heads = sh.n_kv_heads;
  c.vocab_size = sh.vocab_size;
  c.seq_len = sh.seq_len;
  c.head_dim = sh.head_dim;
  c.rope_theta = sh.rope_theta;
  c.rms_eps = sh.rms_eps;
  c.rope_neox = sh.rope_neox;
  c.architecture = sh.architecture;
  return c;
}

}  // namespace detail

/// A model of a real shape with random weights of a file type, built in memory (no file):
/// "F32" (float matrices), "F16" (every matrix F16), "Q8_0" (every matrix Q8_0) or "Q4_K_M"
/// (`detail::tensor_type`); norms 1, qwen2's q/k/v biases random. `file_size` is the bytes of
/// the weight matrices (what a file of that type holds, less the norms and its header).
/// @param shape a name of `synthetic_shapes()`
/// @param type a name of `synthetic_types()`
/// @param n_layers layers to build (0: the shape's)
/// @throws depthkv::Error on an unknown shape or type, or n_layers outside [0, the shape's]
inline LlamaModel synthetic_model(const std::string& shape, const std::string& type, int n_layers = 0) {
  const SyntheticShape* sh = nullptr;
  for (const SyntheticShape& x : synthetic_shapes())
    if (shape == x.name) sh = &x;
  DEPTHKV_CHECK(sh != nullptr, "unknown shape '" << shape << "' (expected llama-3.2-1b, qwen2.5-0.5b or tinyllama-1.1b)");
  const std::vector<std::string> types = synthetic_types();
  DEPTHKV_CHECK(std::find(types.begin(), types.end(), type) != types.end(),
                "unknown type '" << type << "' (expected F32, F16, Q8_0 or Q4_K_M)");
  DEPTHKV_CHECK(n_layers >= 0 && n_layers <= sh->n_layers, "layers must be in [0, " << sh->n_layers << "], got " << n_layers);
  const int n = n_layers == 0 ? sh->n_layers : n_layers;
  LlamaModel m;
  m.config = detail::shape_config(*sh, n);
  const LlamaConfig& c = m.config;
  std::uint64_t s = 0x9E3779B97F4A7C15ull, bytes = 0;
  const int qd = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  for (int l = 0; l < n; ++l) {
    LlamaLayerWeights w;
    w.attn_norm = w.ffn_norm = Eigen::VectorXf::Ones(c.dim);
    detail::set_weight(w.wq, w.wq_quant, type, "", l, n, qd, c.dim, s, bytes);
    detail::set_weight(w.wk, w.wk_quant, type, "", l, n, kd, c.dim, s, bytes);
    detail::set_weight(w.wv, w.wv_quant, type, "v", l, n, kd, c.dim, s, bytes);
    detail::set_weight(w.wo, w.wo_quant, type, "", l, n, c.dim, qd, s, bytes);
    detail::set_weight(w.w1, w.w1_quant, type, "", l, n, c.hidden_dim, c.dim, s, bytes);
    detail::set_weight(w.w2, w.w2_quant, type, "down", l, n, c.dim, c.hidden_dim, s, bytes);
    detail::set_weight(w.w3, w.w3_quant, type, "", l, n, c.hidden_dim, c.dim, s, bytes);
    if (sh->qkv_bias) {
      for (Eigen::VectorXf* b : {&w.bq, &w.bk, &w.bv}) {
        b->resize(b == &w.bq ? qd : kd);
        fill(b->data(), static_cast<std::size_t>(b->size()), 0.02f, s);
      }
    }
    m.layers.push_back(std::move(w));
  }
  m.final_norm = Eigen::VectorXf::Ones(c.dim);
  detail::set_weight(m.token_embedding, m.token_embedding_quant, type, sh->tied ? "output" : "", 0, n, c.vocab_size, c.dim,
                     s, bytes);
  if (sh->tied) {
    m.classifier = m.token_embedding;
    m.classifier_quant = m.token_embedding_quant;
  } else {
    detail::set_weight(m.classifier, m.classifier_quant, type, "output", 0, n, c.vocab_size, c.dim, s, bytes);
  }
  m.source_path = "synthetic " + shape + " " + type;
  m.file_size = bytes;
  return m;
}

/// Moves the float matrix `w` into F16 rows (`q`, owning its bytes), as a GGUF F16 file holds it.
inline void to_f16_weight(RowMatrix& w, QuantWeight& q) {
  auto bytes = std::make_shared<std::vector<Eigen::half>>(static_cast<std::size_t>(w.size()));
  for (Eigen::Index i = 0; i < w.size(); ++i) (*bytes)[static_cast<std::size_t>(i)] = Eigen::half(w.data()[i]);
  q.type = GgmlType::kF16;
  q.data = reinterpret_cast<const std::uint8_t*>(bytes->data());
  q.rows = w.rows();
  q.cols = w.cols();
  q.row_bytes = static_cast<std::uint64_t>(w.cols()) * 2;
  q.keep_alive = bytes;
  w.resize(0, 0);
}

/// Stores every matrix of `m` (projections and classifier) as F16 rows instead of float32.
inline void store_as_f16(LlamaModel& m) {
  for (LlamaLayerWeights& w : m.layers) {
    to_f16_weight(w.wq, w.wq_quant);
    to_f16_weight(w.wk, w.wk_quant);
    to_f16_weight(w.wv, w.wv_quant);
    to_f16_weight(w.wo, w.wo_quant);
    to_f16_weight(w.w1, w.w1_quant);
    to_f16_weight(w.w2, w.w2_quant);
    to_f16_weight(w.w3, w.w3_quant);
  }
  to_f16_weight(m.classifier, m.classifier_quant);
}

}  // namespace depthkv_bench
