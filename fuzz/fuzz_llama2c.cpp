// libFuzzer target for the llama2.c checkpoint loader. Only depthkv::Error may come out.
//
// Two modes, chosen by the first byte:
//  - raw: the rest of the input is the checkpoint;
//  - sized (odd first byte): the next 28 bytes are the header; when it is valid and implies at
//    most 256 KiB, the checkpoint is built at exactly that size (the input's remaining bytes
//    repeated as weights), so that the weight-reading path is exercised too, and it must then
//    either load with the header's shapes or fail with an Error (non-finite weights).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "depthkv/llama/llama2c_loader.hpp"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_model(const depthkv::llama::LlamaModel& m, std::size_t size) {
  const auto& c = m.config;
  check(c.dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.vocab_size > 0);
  check(c.head_dim * c.n_heads == c.dim && c.n_heads % c.n_kv_heads == 0);
  check(m.layers.size() == static_cast<std::size_t>(c.n_layers));
  check(m.token_embedding.rows() == c.vocab_size && m.token_embedding.cols() == c.dim);
  check(m.classifier.rows() == c.vocab_size && m.classifier.cols() == c.dim);
  check(m.layers.back().w2.rows() == c.dim && m.layers.back().w2.cols() == c.hidden_dim);
  check(m.layers.back().wk.rows() == c.head_dim * c.n_kv_heads);
  check(m.file_size == size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool sized = (data[0] & 1) != 0;
  ++data;
  --size;
  try {
    if (!sized) {
      check_model(depthkv::llama::load_llama2c_from_memory(data, size, "fuzz"), size);
      return 0;
    }
    if (size < 28) return 0;
    depthkv::llama::Llama2cHeader h;
    std::memcpy(&h, data, 28);
    const std::uint64_t expected = depthkv::llama::detail::llama2c_expected_size(h, "fuzz");
    if (expected > (std::uint64_t{256} << 10)) return 0;
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(expected));
    std::memcpy(buf.data(), data, 28);
    const std::size_t rest = size - 28;
    for (std::size_t i = 28; i < buf.size(); ++i) buf[i] = rest ? data[28 + (i - 28) % rest] : 0;
    check_model(depthkv::llama::load_llama2c_from_memory(buf.data(), buf.size(), "fuzz"), buf.size());
  } catch (const depthkv::Error&) {
  }
  return 0;
}
