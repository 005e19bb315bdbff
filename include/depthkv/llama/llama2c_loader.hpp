#pragma once
/// @file llama/llama2c_loader.hpp
/// @brief Loader for llama2.c "v0" checkpoints (karpathy/llama2.c `run.c` format).
///
/// Layout: a header of 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
/// vocab_size, seq_len; a negative vocab_size means the classifier is stored separately), then
/// float32 tensors in this order: token_embedding [vocab][dim], rms_att [L][dim],
/// wq [L][dim][dim], wk [L][kv_dim][dim], wv [L][kv_dim][dim], wo [L][dim][dim],
/// rms_ffn [L][dim], w1 [L][hidden][dim], w2 [L][dim][hidden], w3 [L][hidden][dim],
/// rms_final [dim], the legacy RoPE tables freq_cis_real and freq_cis_imag
/// ([seq_len][head_size/2] each; skipped), then wcls [vocab][dim] when unshared.
///
/// Every header field is validated (positive, below sane upper bounds, dim divisible by
/// n_heads, n_heads divisible by n_kv_heads, even head size) and the exact byte size implied by
/// the header is compared with the file size before any weight is read. Non-finite weights are
/// rejected.
///
/// @code
/// depthkv::llama::LlamaModel m = depthkv::llama::load_llama2c("stories260K.bin");
/// // m.config.dim == 64, m.layers.size() == 5, m.classifier == m.token_embedding
/// @endcode

#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "depthkv/error.hpp"
#include "depthkv/llama/detail/mapped_file.hpp"
#include "depthkv/llama/model.hpp"

namespace depthkv {
namespace llama {

/// The 7-field header of a llama2.c v0 checkpoint, as stored.
struct Llama2cHeader {
  std::int32_t dim = 0;
  std::int32_t hidden_dim = 0;
  std::int32_t n_layers = 0;
  std::int32_t n_heads = 0;
  std::int32_t n_kv_heads = 0;
  std::int32_t vocab_size = 0;  ///< negative: separate classifier weights follow the RoPE tables
  std::int32_t seq_len = 0;
};

/// Upper bounds a llama2.c header must respect (far above any real model, low enough that the
/// byte-size arithmetic cannot overflow).
struct Llama2cLimits {
  static constexpr std::int64_t kMaxDim = 1 << 16;
  static constexpr std::int64_t kMaxHiddenDim = 1 << 20;
  static constexpr std::int64_t kMaxLayers = 1 << 10;
  static constexpr std::int64_t kMaxHeads = 1 << 10;
  static constexpr std::int64_t kMaxVocab = 1 << 24;
  static constexpr std::int64_t kMaxSeqLen = 1 << 24;
};

namespace detail {

/// Validates `h` and returns the exact file size in bytes it implies.
/// @param h the header
/// @param source file name for messages
/// @return expected total file size (header included)
/// @throws Error naming the first invalid field
inline std::uint64_t llama2c_expected_size(const Llama2cHeader& h, const std::string& source) {
  using L = Llama2cLimits;
  auto in_range = [&](const char* name, std::int64_t v, std::int64_t hi) {
    DEPTHKV_CHECK(v >= 1 && v <= hi, source << ": llama2.c header field " << name << " = " << v
                                            << " is out of range [1, " << hi << "]");
  };
  const std::int64_t vocab = h.vocab_size < 0 ? -static_cast<std::int64_t>(h.vocab_size) : h.vocab_size;
  in_range("dim", h.dim, L::kMaxDim);
  in_range("hidden_dim", h.hidden_dim, L::kMaxHiddenDim);
  in_range("n_layers", h.n_layers, L::kMaxLayers);
  in_range("n_heads", h.n_heads, L::kMaxHeads);
  in_range("n_kv_heads", h.n_kv_heads, L::kMaxHeads);
  in_range("|vocab_size|", vocab, L::kMaxVocab);
  in_range("seq_len", h.seq_len, L::kMaxSeqLen);
  DEPTHKV_CHECK(h.dim % h.n_heads == 0,
                source << ": llama2.c header: dim " << h.dim << " is not divisible by n_heads " << h.n_heads);
  DEPTHKV_CHECK(h.n_kv_heads <= h.n_heads && h.n_heads % h.n_kv_heads == 0,
                source << ": llama2.c header: n_heads " << h.n_heads << " is not a multiple of n_kv_heads "
                       << h.n_kv_heads);
  const std::uint64_t head_size = static_cast<std::uint64_t>(h.dim / h.n_heads);
  DEPTHKV_CHECK(head_size % 2 == 0,
                source << ": llama2.c header: head size dim/n_heads = " << head_size << " must be even (RoPE pairs)");
  const std::uint64_t dim = static_cast<std::uint64_t>(h.dim);
  const std::uint64_t hidden = static_cast<std::uint64_t>(h.hidden_dim);
  const std::uint64_t layers = static_cast<std::uint64_t>(h.n_layers);
  const std::uint64_t kv_dim = head_size * static_cast<std::uint64_t>(h.n_kv_heads);
  const std::uint64_t v = static_cast<std::uint64_t>(vocab);
  const std::uint64_t seq = static_cast<std::uint64_t>(h.seq_len);
  // With the bounds above every product is < 2^62: no overflow is possible.
  std::uint64_t floats = v * dim;                       // token_embedding
  floats += layers * dim;                               // rms_att
  floats += layers * dim * dim;                         // wq
  floats += 2 * layers * kv_dim * dim;                  // wk, wv
  floats += layers * dim * dim;                         // wo
  floats += layers * dim;                               // rms_ffn
  floats += 3 * layers * hidden * dim;                  // w1, w2, w3
  floats += dim;                                        // rms_final
  floats += 2 * seq * (head_size / 2);                  // freq_cis_real, freq_cis_imag
  if (h.vocab_size < 0) floats += v * dim;              // wcls
  return 7 * sizeof(std::int32_t) + floats * sizeof(float);
}

/// Copies `rows * cols` float32 values from `in` into a row-major matrix, rejecting non-finite values.
inline void llama2c_read_matrix(ByteReader& in, RowMatrix& m, std::int64_t rows, std::int64_t cols,
                                const std::string& name) {
  m.resize(rows, cols);
  const std::uint64_t n = static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
  const std::uint8_t* p = in.take(n * sizeof(float), name.c_str());
  if (n > 0) std::memcpy(m.data(), p, n * sizeof(float));
  for (std::uint64_t i = 0; i < n; ++i) {
    DEPTHKV_CHECK(std::isfinite(m.data()[i]),
                  in.source() << ": tensor " << name << " has a non-finite value at element " << i);
  }
}

/// Vector variant of `llama2c_read_matrix`.
inline void llama2c_read_vector(ByteReader& in, Eigen::VectorXf& v, std::int64_t n, const std::string& name) {
  RowMatrix m;
  llama2c_read_matrix(in, m, 1, n, name);
  v = Eigen::Map<const Eigen::VectorXf>(m.data(), n);
}

}  // namespace detail

/// Reads and validates the header of an in-memory llama2.c checkpoint.
/// @param data the checkpoint bytes
/// @param size their number
/// @param source name for error messages
/// @return the header
/// @throws Error when the data is shorter than the header or any field is invalid, or when
///   `size` differs from the size the header implies
inline Llama2cHeader read_llama2c_header(const std::uint8_t* data, std::size_t size,
                                         const std::string& source = "<memory>") {
  DEPTHKV_CHECK(detail::host_is_little_endian(), "llama2.c checkpoints can only be read on little-endian hosts");
  detail::ByteReader in(data, size, source);
  Llama2cHeader h;
  h.dim = in.read<std::int32_t>("llama2.c header");
  h.hidden_dim = in.read<std::int32_t>("llama2.c header");
  h.n_layers = in.read<std::int32_t>("llama2.c header");
  h.n_heads = in.read<std::int32_t>("llama2.c header");
  h.n_kv_heads = in.read<std::int32_t>("llama2.c header");
  h.vocab_size = in.read<std::int32_t>("llama2.c header");
  h.seq_len = in.read<std::int32_t>("llama2.c header");
  const std::uint64_t expected = detail::llama2c_expected_size(h, source);
  DEPTHKV_CHECK(expected == size, source << ": llama2.c checkpoint size mismatch: the header (dim " << h.dim
                                         << ", hidden_dim " << h.hidden_dim << ", n_layers " << h.n_layers
                                         << ", n_heads " << h.n_heads << ", n_kv_heads " << h.n_kv_heads
                                         << ", vocab_size " << h.vocab_size << ", seq_len " << h.seq_len
                                         << ") implies " << expected << " bytes, the file has " << size
                                         << (expected > size ? " (truncated?)" : " (trailing data or not a v0 checkpoint?)"));
  return h;
}

/// Loads a llama2.c v0 checkpoint from memory (the bytes are copied into the model).
/// @param data the checkpoint bytes (may be nullptr when size == 0)
/// @param size their number
/// @param source name recorded in `LlamaModel::source_path` and used in error messages
/// @return the model: config (head_dim = dim / n_heads, rope_theta 10000, rms_eps 1e-5,
///   architecture "llama", adjacent RoPE pairs) and float32 weights; `classifier` is a copy of
///   `token_embedding` when the checkpoint shares them
/// @throws Error on any invalid header field, size mismatch or non-finite weight
inline LlamaModel load_llama2c_from_memory(const std::uint8_t* data, std::size_t size,
                                           const std::string& source = "<memory>") {
  const Llama2cHeader h = read_llama2c_header(data, size, source);
  detail::ByteReader in(data, size, source);
  in.seek(7 * sizeof(std::int32_t));

  LlamaModel m;
  LlamaConfig& c = m.config;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.vocab_size = h.vocab_size < 0 ? -h.vocab_size : h.vocab_size;
  c.seq_len = h.seq_len;
  c.head_dim = h.dim / h.n_heads;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.rope_neox = false;
  c.architecture = "llama";
  const bool shared = h.vocab_size > 0;
  const std::int64_t kv_dim = static_cast<std::int64_t>(c.head_dim) * c.n_kv_heads;
  const std::int64_t L = c.n_layers;

  detail::llama2c_read_matrix(in, m.token_embedding, c.vocab_size, c.dim, "token_embedding");
  m.layers.resize(static_cast<std::size_t>(L));
  auto name = [](const char* base, std::int64_t l) { return std::string(base) + "[" + std::to_string(l) + "]"; };
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_vector(in, m.layers[l].attn_norm, c.dim, name("rms_att", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].wq, c.dim, c.dim, name("wq", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].wk, kv_dim, c.dim, name("wk", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].wv, kv_dim, c.dim, name("wv", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].wo, c.dim, c.dim, name("wo", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_vector(in, m.layers[l].ffn_norm, c.dim, name("rms_ffn", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].w1, c.hidden_dim, c.dim, name("w1", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].w2, c.dim, c.hidden_dim, name("w2", l));
  for (std::int64_t l = 0; l < L; ++l) detail::llama2c_read_matrix(in, m.layers[l].w3, c.hidden_dim, c.dim, name("w3", l));
  detail::llama2c_read_vector(in, m.final_norm, c.dim, "rms_final");
  // Legacy RoPE tables (freq_cis_real, freq_cis_imag): recomputed by the engine, skipped here.
  const std::uint64_t rope_floats = static_cast<std::uint64_t>(c.seq_len) * static_cast<std::uint64_t>(c.head_dim / 2);
  in.skip(2 * rope_floats * sizeof(float), "freq_cis tables");
  if (shared) {
    m.classifier = m.token_embedding;
  } else {
    detail::llama2c_read_matrix(in, m.classifier, c.vocab_size, c.dim, "wcls");
  }
  assert(in.remaining() == 0);

  m.source_path = source;
  m.file_size = size;
  m.header_hash = detail::model_header_hash(data, size);
  return m;
}

/// Loads a llama2.c v0 checkpoint file (memory-mapped while reading).
/// @param path the `.bin` checkpoint
/// @return the model (see `load_llama2c_from_memory`)
/// @throws Error when the file cannot be read or is invalid
inline LlamaModel load_llama2c(const std::string& path) {
  const detail::MappedFile file(path);
  return load_llama2c_from_memory(file.data(), file.size(), path);
}

}  // namespace llama
}  // namespace depthkv
