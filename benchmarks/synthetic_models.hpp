#pragma once
// Synthetic models of real shapes for the benchmarks (random F32 weights, deterministic).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/llama/model.hpp"

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
