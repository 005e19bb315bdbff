#pragma once
// A small Llama model with random weights for the engine, evaluator and probe tests. Every weight
// is drawn from one std::mt19937 in a fixed order (token embedding; per layer the two norms, wq,
// wk, wv, wo, w1, w3, w2 and the optional biases; final norm, classifier; optional RoPE
// frequency factors; optional per-layer q/k norms), so a spec and its seed always give the same
// model.

#include <Eigen/Core>
#include <cmath>
#include <random>
#include <vector>

#include "depthkv/llama/model.hpp"
#include "depthkv/llama/text_windows.hpp"

namespace depthkv_test {

struct RandomSpec {
  int dim = 32, hidden = 48, layers = 3, heads = 4, kv_heads = 2, vocab = 50, seq_len = 256;
  bool neox = false, freq_factors = false, biases = false;
  bool qk_norm = false;          ///< per-head q/k RMSNorm weights (qwen3), drawn after everything else
  float theta = 10000.0f;
  float rope_freq_scale = 1.0f;  ///< linear RoPE scaling (positions times this)
  float qk_gain = 2.0f;          ///< wq, wk: N(0, 1) * qk_gain / sqrt(dim) (sharper attention when larger)
  float w2_gain = 0.0f;          ///< w2: N(0, 1) * w2_gain / sqrt(dim); 0: 1 / sqrt(hidden)
  float classifier_gain = 1.0f;  ///< classifier: N(0, 1) * classifier_gain / sqrt(dim)
  unsigned seed = 7;
  /// Gemma 3's block (drawn after everything else): post-attention and post-FFN norms, GeGLU
  /// (tanh), embeddings times sqrt(dim), per-head q/k norms, NeoX RoPE, and `window` on every
  /// layer but the last (global, as the last of Gemma's groups of six), local RoPE base 10000.
  bool gemma3 = false;
  int window = 6;
};


inline depthkv::llama::LlamaModel random_model(const RandomSpec& s) {
  using depthkv::llama::RowMatrix;
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto mat = [&](int r, int c, float scale) {
    RowMatrix m(r, c);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * nd(rng);
    return m;
  };
  auto vec = [&](int n, float mean, float scale) {
    Eigen::VectorXf v(n);
    for (int i = 0; i < n; ++i) v[i] = mean + scale * nd(rng);
    return v;
  };
  depthkv::llama::LlamaModel m;
  depthkv::llama::LlamaConfig& c = m.config;
  c.dim = s.dim;
  c.hidden_dim = s.hidden;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.vocab_size = s.vocab;
  c.seq_len = s.seq_len;
  c.head_dim = s.dim / s.heads;
  c.rope_theta = s.theta;
  c.rope_neox = s.neox;
  const int hd = c.head_dim;
  const float sc = 1.0f / std::sqrt(static_cast<float>(s.dim));
  const float w2_scale = s.w2_gain > 0.0f ? s.w2_gain * sc : 1.0f / std::sqrt(static_cast<float>(s.hidden));
  m.token_embedding = mat(s.vocab, s.dim, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    depthkv::llama::LlamaLayerWeights w;
    w.attn_norm = vec(s.dim, 1.0f, 0.1f);
    w.ffn_norm = vec(s.dim, 1.0f, 0.1f);
    w.wq = mat(s.heads * hd, s.dim, s.qk_gain * sc);
    w.wk = mat(s.kv_heads * hd, s.dim, s.qk_gain * sc);
    w.wv = mat(s.kv_heads * hd, s.dim, sc);
    w.wo = mat(s.dim, s.heads * hd, sc);
    w.w1 = mat(s.hidden, s.dim, sc);
    w.w3 = mat(s.hidden, s.dim, sc);
    w.w2 = mat(s.dim, s.hidden, w2_scale);
    if (s.biases) {
      w.bq = vec(s.heads * hd, 0.0f, 0.1f);
      w.bk = vec(s.kv_heads * hd, 0.0f, 0.1f);
      w.bv = vec(s.kv_heads * hd, 0.0f, 0.1f);
    }
    m.layers.push_back(w);
  }
  m.final_norm = vec(s.dim, 1.0f, 0.1f);
  m.classifier = mat(s.vocab, s.dim, s.classifier_gain * sc);
  if (s.freq_factors) m.rope_freq_factors = vec(hd / 2, 2.0f, 0.5f).cwiseAbs();
  c.rope_freq_scale = s.rope_freq_scale;
  if (s.qk_norm || s.gemma3)
    for (auto& w : m.layers) {
      w.q_norm = vec(hd, 1.0f, 0.3f);
      w.k_norm = vec(hd, 1.0f, 0.3f);
    }
  if (s.gemma3) {
    for (auto& w : m.layers) {
      w.attn_post_norm = vec(s.dim, 1.0f, 0.1f);
      w.ffn_post_norm = vec(s.dim, 1.0f, 0.1f);
    }
    c.rope_neox = true;
    c.ffn_activation = depthkv::llama::FfnActivation::kGeluTanh;
    c.embedding_scale = std::sqrt(static_cast<float>(s.dim)) / 4.0f;  // embeddings are N(0, 1) here
    c.layer_window.assign(static_cast<std::size_t>(s.layers), s.window);
    c.layer_window.back() = 0;
    c.rope_theta_local = 10000.0f;
    c.architecture = "gemma3";
  }
  return m;
}

/// `n` token ids drawn uniformly from [0, vocab) with a fixed seed.
inline std::vector<int> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int> t(static_cast<std::size_t>(n));
  for (int& x : t) x = u(rng);
  return t;
}

/// The evaluator tests' model shape: 4 heads (2 KV heads) of 8 dimensions, ffn 64, vocabulary 40,
/// 512 positions, sharper attention (qk gain 3) than the engine tests' default.
inline RandomSpec eval_spec(unsigned seed, int layers) {
  RandomSpec s;
  s.seed = seed;
  s.layers = layers;
  s.hidden = 64;
  s.vocab = 40;
  s.seq_len = 512;
  s.qk_gain = 3.0f;
  return s;
}

/// `n` windows of `ctx` context and `cont` continuation ids uniform in [0, vocab), drawn in order
/// from one generator seeded with `seed`.
inline std::vector<depthkv::llama::EvalWindow> random_windows(int n, int ctx, int cont, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<depthkv::llama::EvalWindow> w(static_cast<std::size_t>(n));
  for (auto& x : w) {
    for (int i = 0; i < ctx; ++i) x.context.push_back(u(rng));
    for (int i = 0; i < cont; ++i) x.continuation.push_back(u(rng));
  }
  return w;
}

}  // namespace depthkv_test
