#pragma once
/// @file llama/architecture.hpp
/// @brief The Llama-family architectures the GGUF loader reads, as data: for each
/// `general.architecture` value, the metadata keys of its hyper-parameters (`<arch>.` + key),
/// its tensor names, its RoPE pairing and which optional tensors it has or needs.
///
/// `load_gguf` (gguf.hpp) reads any architecture of this table with one code path; a new
/// Llama-like architecture is one more entry in `architectures()`. The engine's forward pass
/// varies only through the model it is given: `LlamaConfig` (RoPE pairing from
/// `Architecture::rope`, the FFN activation, the embedding scale, the attention scale, each
/// layer's sliding window and the local layers' RoPE base) and the optional per-layer tensors of
/// `LlamaLayerWeights` (biases, q/k RMSNorm, post-attention and post-FFN norms: applied when
/// non-empty).
///
/// @code
/// const depthkv::llama::Architecture& a = depthkv::llama::architecture("qwen2");
/// std::string key = a.key(a.keys.embedding_length);   // "qwen2.embedding_length"
/// bool neox = a.rope == depthkv::llama::RopeStyle::kNeox;  // true
/// @endcode

#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/model.hpp"

namespace depthkv {
namespace llama {

/// How RoPE pairs the dimensions of a head of size `head_dim`.
enum class RopeStyle {
  kAdjacent,  ///< pairs (2i, 2i+1), as llama2.c and GGUF `llama`
  kNeox,      ///< pairs (i, i + head_dim/2), as GGUF `qwen2` and `qwen3`
};

/// Whether an architecture has a tensor (or a group of tensors).
enum class TensorUse {
  kNone,      ///< never: a file holding it is refused as having an unexpected tensor
  kOptional,  ///< loaded when the file holds it (for a group: when it holds any member, then all)
  kRequired,  ///< always: a file without it is refused as having a missing tensor
};

/// Metadata keys of the hyper-parameters, without the `<arch>.` prefix (llama.cpp's names).
struct GgufHparamKeys {
  std::string embedding_length = "embedding_length";            ///< dim (required)
  std::string feed_forward_length = "feed_forward_length";      ///< hidden_dim (required)
  std::string block_count = "block_count";                      ///< n_layers (required)
  std::string head_count = "attention.head_count";              ///< n_heads (required)
  std::string head_count_kv = "attention.head_count_kv";        ///< n_kv_heads (default: n_heads)
  std::string key_length = "attention.key_length";              ///< head_dim (default: dim / n_heads)
  std::string value_length = "attention.value_length";          ///< must equal head_dim when present
  std::string rope_dimension_count = "rope.dimension_count";    ///< must equal head_dim when present
  std::string rope_freq_base = "rope.freq_base";                ///< rope_theta (default 10000)
  std::string rope_scaling_type = "rope.scaling.type";          ///< "none" (default) or "linear"
  std::string rope_scaling_factor = "rope.scaling.factor";      ///< linear factor (positions divided by it)
  std::string rope_scale_linear = "rope.scale_linear";          ///< older form of the linear factor
  std::string rms_epsilon = "attention.layer_norm_rms_epsilon"; ///< rms_eps (default 1e-5)
  std::string context_length = "context_length";                ///< seq_len (required)
  std::string expert_count = "expert_count";                    ///< must be absent or 0 (no mixture of experts)
  std::string sliding_window = "attention.sliding_window";      ///< the local layers' window (when the architecture has them)
  std::string sliding_window_pattern = "attention.sliding_window_pattern";  ///< optional per-layer bools: true = local
  std::string rope_freq_base_swa = "rope.freq_base_swa";        ///< local layers' RoPE base (default `Architecture::rope_theta_local`)
};

/// Tensor names (llama.cpp's). Per-layer names follow `block_prefix` + layer index + ".".
struct GgufTensorNames {
  std::string token_embd = "token_embd.weight";    ///< [vocab_size][dim]
  std::string output_norm = "output_norm.weight";  ///< [dim]
  std::string output = "output.weight";            ///< classifier [vocab_size][dim]
  std::string rope_freqs = "rope_freqs.weight";    ///< [head_dim/2] RoPE frequency divisors
  std::string block_prefix = "blk.";               ///< per-layer names: "blk.N." + name
  std::string attn_norm = "attn_norm.weight";      ///< [dim]
  std::string attn_q = "attn_q.weight";            ///< [n_heads * head_dim][dim]
  std::string attn_k = "attn_k.weight";            ///< [n_kv_heads * head_dim][dim]
  std::string attn_v = "attn_v.weight";            ///< [n_kv_heads * head_dim][dim]
  std::string attn_output = "attn_output.weight";  ///< [dim][n_heads * head_dim]
  std::string attn_q_bias = "attn_q.bias";         ///< [n_heads * head_dim]
  std::string attn_k_bias = "attn_k.bias";         ///< [n_kv_heads * head_dim]
  std::string attn_v_bias = "attn_v.bias";         ///< [n_kv_heads * head_dim]
  std::string attn_q_norm = "attn_q_norm.weight";  ///< [head_dim], per-head RMSNorm of q
  std::string attn_k_norm = "attn_k_norm.weight";  ///< [head_dim], per-head RMSNorm of k
  std::string ffn_norm = "ffn_norm.weight";        ///< [dim]
  std::string attn_post_norm = "post_attention_norm.weight";  ///< [dim], RMSNorm of the attention output
  std::string ffn_post_norm = "post_ffw_norm.weight";         ///< [dim], RMSNorm of the FFN output
  std::string ffn_gate = "ffn_gate.weight";        ///< w1 [hidden_dim][dim]
  std::string ffn_down = "ffn_down.weight";        ///< w2 [dim][hidden_dim]
  std::string ffn_up = "ffn_up.weight";            ///< w3 [hidden_dim][dim]
  std::string attn_rot_embd = "attn_rot_embd.weight";  ///< legacy RoPE table of old conversions: accepted, ignored
};

/// One architecture: its name, hyper-parameter keys, tensor names, RoPE pairing and which
/// optional tensors it has.
struct Architecture {
  std::string name;                          ///< `general.architecture`, also the key prefix
  RopeStyle rope = RopeStyle::kAdjacent;     ///< RoPE pairing (`LlamaConfig::rope_neox`)
  TensorUse qkv_bias = TensorUse::kOptional; ///< the group attn_q.bias, attn_k.bias, attn_v.bias
  TensorUse qk_norm = TensorUse::kNone;      ///< the group attn_q_norm, attn_k_norm (per-head RMSNorm)
  TensorUse output = TensorUse::kOptional;   ///< the classifier; absent: tied to token_embd
  TensorUse rope_freqs = TensorUse::kOptional;  ///< RoPE frequency divisors (Llama 3)
  TensorUse post_norms = TensorUse::kNone;   ///< the group post_attention_norm, post_ffw_norm
  FfnActivation activation = FfnActivation::kSilu;  ///< the FFN's gate activation
  bool scale_embedding = false;              ///< embeddings multiplied by sqrt(dim)
  /// Sliding-window layers when > 0: the window is read from `keys.sliding_window`, and without
  /// a `keys.sliding_window_pattern` array layer l is local unless `(l + 1) % swa_period == 0`
  /// (llama.cpp's pattern for Gemma 3: five local layers, then one global).
  int swa_period = 0;
  float rope_theta_local = 10000.0f;         ///< local layers' RoPE base when the file has no `rope_freq_base_swa`
  GgufHparamKeys keys;                       ///< hyper-parameter keys (after the prefix)
  GgufTensorNames tensors;                   ///< tensor names

  /// @param suffix a key of `keys`
  /// @return the full metadata key `name + "." + suffix`
  std::string key(const std::string& suffix) const { return name + "." + suffix; }
  /// @param layer a layer index
  /// @param tensor a per-layer name of `tensors`
  /// @return the full tensor name, e.g. "blk.3.attn_q.weight"
  std::string layer_tensor(int layer, const std::string& tensor) const {
    return tensors.block_prefix + std::to_string(layer) + "." + tensor;
  }
};

namespace detail {
inline Architecture make_architecture(const char* name, RopeStyle rope, TensorUse qkv_bias, TensorUse qk_norm) {
  Architecture a;
  a.name = name;
  a.rope = rope;
  a.qkv_bias = qkv_bias;
  a.qk_norm = qk_norm;
  return a;
}

// Gemma 3: NeoX RoPE, per-head q/k RMSNorm, post-attention and post-FFN norms, GeGLU (tanh),
// embeddings scaled by sqrt(dim), output tied to the embedding, 5 local layers of every 6.
inline Architecture make_gemma3() {
  Architecture a = make_architecture("gemma3", RopeStyle::kNeox, TensorUse::kNone, TensorUse::kRequired);
  a.post_norms = TensorUse::kRequired;
  a.rope_freqs = TensorUse::kNone;
  a.activation = FfnActivation::kGeluTanh;
  a.scale_embedding = true;
  a.swa_period = 6;
  a.rope_theta_local = 10000.0f;
  return a;
}
}  // namespace detail

/// The supported architectures:
/// - `llama`: adjacent RoPE pairs, optional q/k/v biases;
/// - `qwen2`: NeoX RoPE, q/k/v biases required;
/// - `qwen3`: NeoX RoPE, optional q/k/v biases, per-head q/k RMSNorm required;
/// - `gemma3`: NeoX RoPE, per-head q/k RMSNorm and post-attention/post-FFN norms required, GeGLU
///   (tanh) FFN, embeddings scaled by sqrt(dim), sliding-window layers (window from the file,
///   five local layers then one global, local RoPE base 10000), no `rope_freqs`.
/// All: optional `output` (absent: tied to the embedding).
/// @return the table, in this order
inline const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table = {
      detail::make_architecture("llama", RopeStyle::kAdjacent, TensorUse::kOptional, TensorUse::kNone),
      detail::make_architecture("qwen2", RopeStyle::kNeox, TensorUse::kRequired, TensorUse::kNone),
      detail::make_architecture("qwen3", RopeStyle::kNeox, TensorUse::kOptional, TensorUse::kRequired),
      detail::make_gemma3(),
  };
  return table;
}

/// @param name a `general.architecture` value
/// @return its table entry, or nullptr when it is not supported
inline const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : architectures()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

/// @return the supported names, comma-separated in table order ("llama, qwen2, qwen3")
inline std::string supported_architectures() {
  std::string out;
  for (const Architecture& a : architectures()) out += (out.empty() ? "" : ", ") + a.name;
  return out;
}

/// @param name a `general.architecture` value
/// @param source file name for the message
/// @return its table entry
/// @throws Error "unsupported architecture 'name'" listing the supported ones
inline const Architecture& architecture(const std::string& name, const std::string& source = "<memory>") {
  const Architecture* a = find_architecture(name);
  DEPTHKV_CHECK(a != nullptr, source << ": unsupported architecture '" << name
                                     << "' (depthkv's engine supports: " << supported_architectures() << ")");
  return *a;
}

}  // namespace llama
}  // namespace depthkv
