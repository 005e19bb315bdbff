#pragma once
/// @file llama/model.hpp
/// @brief The reference engine's model: hyper-parameters and weights of a Llama-family
/// transformer, as filled by the llama2.c and GGUF loaders.
///
/// All matrices are row-major `[out][in]` (as in llama2.c and GGUF), so `y = W x` is
/// `W * x` with `W` an `Eigen::Matrix<float, Dynamic, Dynamic, RowMajor>`.
///
/// Each weight matrix has two forms: a float32 `RowMatrix`, or a `QuantWeight` (the stored
/// ggml blocks or F16/BF16 rows in place in a memory-mapped GGUF file, e.g. Q4_K or F16).
/// Exactly one is set: when the `QuantWeight` is present the `RowMatrix` is empty, and the
/// engine multiplies the stored rows (quant/products.hpp) instead.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "depthkv/llama/quant/ggml_type.hpp"

namespace depthkv {
namespace llama {

/// Row-major float matrix, `[rows = out][cols = in]`.
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The gate activation of the gated FFN `down(act(gate x) * up x)`.
enum class FfnActivation {
  kSilu,      ///< x / (1 + e^-x) (SwiGLU: Llama, Qwen)
  kGeluTanh,  ///< 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GeGLU: Gemma 3)
};

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
  /// true = NeoX halves (i, i + head_dim/2), as GGUF `qwen2` (`Architecture::rope`, architecture.hpp).
  bool rope_neox = false;
  /// Positions are multiplied by this before RoPE (linear RoPE scaling: 1 / rope.scaling.factor).
  float rope_freq_scale = 1.0f;
  std::string architecture = "llama";  ///< a name of `architectures()` (architecture.hpp); "llama" for llama2.c checkpoints
  FfnActivation ffn_activation = FfnActivation::kSilu;  ///< the FFN's gate activation
  /// Token embeddings are multiplied by this before the first layer (Gemma: sqrt(dim)).
  float embedding_scale = 1.0f;
  /// Attention scores are `attention_scale * q.k`; 0: `1 / sqrt(head_dim)`.
  float attention_scale = 0.0f;
  /// Per layer: 0 for a global layer (attends to every slot it holds), or W > 0 for a
  /// sliding-window (local) layer: the query at position p attends only to keys at positions
  /// `p - W + 1 .. p`. Empty: every layer global.
  std::vector<int> layer_window;
  /// RoPE base and position scale of the local layers (global layers: `rope_theta`, `rope_freq_scale`).
  float rope_theta_local = 10000.0f;
  float rope_freq_scale_local = 1.0f;

  /// @return layer l's window (0: a global layer)
  int window(int l) const {
    return l >= 0 && static_cast<std::size_t>(l) < layer_window.size() ? layer_window[static_cast<std::size_t>(l)] : 0;
  }
  /// @return every layer's window, one per layer (0: a global layer), whatever `layer_window` holds
  std::vector<int> windows() const {
    std::vector<int> w;
    for (int l = 0; l < n_layers; ++l) w.push_back(window(l));
    return w;
  }
  /// @return whether layer l is a sliding-window layer
  bool is_local(int l) const { return window(l) > 0; }
  /// @return whether any layer is a sliding-window layer
  bool has_local_layers() const {
    for (int w : layer_window)
      if (w > 0) return true;
    return false;
  }
};

/// A weight matrix kept in its stored ggml type (no float copy): `rows` rows of `cols` values,
/// row `r` at `data + r * row_bytes` (block layouts in quant/dequantize.hpp). `keep_alive` owns
/// the bytes (the file mapping), so the pointer stays valid as long as any copy of this lives.
/// Empty (`data == nullptr`) when the matrix is held as float32 instead.
///
/// @code
/// const QuantWeight& w = model.layers[0].w1_quant;   // e.g. Q4_K [hidden_dim][dim]
/// if (!w.empty()) depthkv::llama::quant_matvec(w.type, w.data, w.rows, w.cols, x, y, {1});
/// @endcode
struct QuantWeight {
  GgmlType type = GgmlType::kF32;       ///< the stored type (F16, BF16 or a block type: Q4_0 ... Q6_K, IQ4_*)
  const std::uint8_t* data = nullptr;   ///< first byte of row 0 (no alignment implied)
  std::int64_t rows = 0;                ///< output size
  std::int64_t cols = 0;                ///< input size (a multiple of the type's block size)
  std::uint64_t row_bytes = 0;          ///< bytes of one row
  std::shared_ptr<const void> keep_alive;  ///< owner of the bytes (mapped file)
  /// @return true when no quantized form is held (the float RowMatrix is used)
  bool empty() const { return data == nullptr; }
  /// @return the bytes of all rows
  std::uint64_t n_bytes() const { return static_cast<std::uint64_t>(rows) * row_bytes; }
};

/// Weights of one transformer layer. Each matrix is either the float32 `RowMatrix` or its
/// `*_quant` form (then the RowMatrix is empty).
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
  /// Optional RMSNorm weights `[dim]` of the attention output and of the FFN output, applied
  /// before each is added to the residual stream (Gemma 3); empty when absent.
  Eigen::VectorXf attn_post_norm, ffn_post_norm;
  RowMatrix w1;               ///< gate [hidden_dim][dim]
  RowMatrix w2;               ///< down [dim][hidden_dim]
  RowMatrix w3;               ///< up   [hidden_dim][dim]
  /// Quantized forms of wq, wk, wv, wo, w1, w2, w3 (same shapes); empty when float.
  QuantWeight wq_quant, wk_quant, wv_quant, wo_quant, w1_quant, w2_quant, w3_quant;
};

/// Hyper-parameters and weights of a whole model.
struct LlamaModel {
  LlamaConfig config;
  RowMatrix token_embedding;          ///< [vocab_size][dim]
  std::vector<LlamaLayerWeights> layers;
  Eigen::VectorXf final_norm;         ///< [dim]
  RowMatrix classifier;               ///< [vocab_size][dim] (a copy of the embedding when shared)
  QuantWeight token_embedding_quant;  ///< quantized form of token_embedding (rows dequantized on lookup); empty when float
  QuantWeight classifier_quant;       ///< quantized form of classifier (shares the embedding's bytes when tied); empty when float
  Eigen::VectorXf rope_freq_factors;  ///< optional [head_dim/2] divisors of the RoPE frequencies (Llama 3 `rope_freqs.weight`); empty when absent
  std::string source_path;            ///< file it was loaded from
  std::uint64_t file_size = 0;        ///< its size in bytes
  std::uint64_t header_hash = 0;      ///< FNV-1a 64 of the file's first min(size, 1 MiB) bytes (model identity)
};

}  // namespace llama
}  // namespace depthkv
