#pragma once
/// @file llama/model.hpp
/// @brief The reference engine's model: hyper-parameters and float32 weights of a Llama-family
/// transformer, as filled by the llama2.c and GGUF loaders.
///
/// All matrices are row-major `[out][in]` (as in llama2.c and GGUF), so `y = W x` is
/// `W * x` with `W` an `Eigen::Matrix<float, Dynamic, Dynamic, RowMajor>`.

#include <cstdint>
#include <string>
#include <vector>

#include <Eigen/Core>

namespace depthkv {
namespace llama {

/// Row-major float matrix, `[rows = out][cols = in]`.
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Hyper-parameters of a Llama-family model.
struct LlamaConfig {
  int dim = 0;          ///< model width
  int hidden_dim = 0;   ///< SwiGLU hidden width
  int n_layers = 0;
  int n_heads = 0;      ///< query heads
  int n_kv_heads = 0;   ///< key/value heads (GQA when < n_heads)
  int vocab_size = 0;
  int seq_len = 0;      ///< trained context length
  int head_dim = 0;     ///< dim / n_heads unless the file says otherwise
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  /// RoPE pairing: false = adjacent pairs (2i, 2i+1) as llama2.c and GGUF `llama`;
  /// true = NeoX halves (i, i + head_dim/2), as GGUF `qwen2`.
  bool rope_neox = false;
  /// Positions are multiplied by this before RoPE (linear RoPE scaling: 1 / rope.scaling.factor).
  float rope_freq_scale = 1.0f;
  std::string architecture = "llama";  ///< "llama", "qwen2" or "qwen3"
};

/// Weights of one transformer layer.
struct LlamaLayerWeights {
  Eigen::VectorXf attn_norm;  ///< [dim]
  RowMatrix wq;               ///< [n_heads * head_dim][dim]
  RowMatrix wk;               ///< [n_kv_heads * head_dim][dim]
  RowMatrix wv;               ///< [n_kv_heads * head_dim][dim]
  RowMatrix wo;               ///< [dim][n_heads * head_dim]
  Eigen::VectorXf bq, bk, bv; ///< optional biases (empty when absent; present in qwen2)
  /// Optional per-head RMSNorm weights `[head_dim]` of q and k, applied to every head's segment
  /// after the biases and before RoPE (qwen3); empty when absent.
  Eigen::VectorXf q_norm, k_norm;
  Eigen::VectorXf ffn_norm;   ///< [dim]
  RowMatrix w1;               ///< gate [hidden_dim][dim]
  RowMatrix w2;               ///< down [dim][hidden_dim]
  RowMatrix w3;               ///< up   [hidden_dim][dim]
};

/// Hyper-parameters and float32 weights of a whole model.
struct LlamaModel {
  LlamaConfig config;
  RowMatrix token_embedding;          ///< [vocab_size][dim]
  std::vector<LlamaLayerWeights> layers;
  Eigen::VectorXf final_norm;         ///< [dim]
  RowMatrix classifier;               ///< [vocab_size][dim] (a copy of the embedding when shared)
  Eigen::VectorXf rope_freq_factors;  ///< optional [head_dim/2] divisors of the RoPE frequencies (Llama 3 `rope_freqs.weight`); empty when absent
  std::string source_path;            ///< file it was loaded from
  std::uint64_t file_size = 0;        ///< its size in bytes
  std::uint64_t header_hash = 0;      ///< FNV-1a 64 of the file's first min(size, 1 MiB) bytes (model identity)
};

}  // namespace llama
}  // namespace depthkv
