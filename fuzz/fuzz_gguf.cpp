// libFuzzer target for the GGUF reader: parse, query metadata, read every tensor of a
// readable type, read the vocabulary (and build a tokenizer from it), load the model.
// Only depthkv::Error may come out.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/tokenizer.hpp"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace depthkv::llama;
  std::optional<GgufFile> parsed;
  try {
    parsed.emplace(GgufFile::from_memory(data, size, "fuzz"));
  } catch (const depthkv::Error&) {
    return 0;
  }
  const GgufFile& f = *parsed;
  check(f.version() == 2 || f.version() == 3);
  check(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  for (const auto& kv : f.metadata()) {
    check(f.find(kv.first) == &kv.second);
    try {
      (void)f.get_int(kv.first);
    } catch (const depthkv::Error&) {
    }
    try {
      (void)f.get_float(kv.first);
    } catch (const depthkv::Error&) {
    }
    try {
      (void)f.get_string_array(kv.first);
    } catch (const depthkv::Error&) {
    }
  }
  for (const auto& t : f.tensors()) {
    check(f.find_tensor(t.name) == &t);
    GgmlTypeInfo info{};
    if (ggml_type_info(t.type, info)) {
      check(f.data_offset() + t.offset + t.n_bytes <= f.file_size());
    }
    if (ggml_type_readable(t.type) && t.n_elements <= (1u << 22)) {
      const std::vector<float> v = f.read_tensor(t);
      check(v.size() == t.n_elements);
    }
  }
  try {
    const Vocabulary v = read_vocabulary(f);
    check(!v.tokens.empty());
    try {
      const Tokenizer tok(v);
      const std::vector<int> ids = tok.encode("Once upon a time, \xE2\x82\xAC <0x41>", true, true);
      for (std::size_t i = 1; i < ids.size(); ++i) (void)tok.decode(ids[i - 1], ids[i]);
      for (int i = 0; i < tok.vocab_size() && i < 4096; ++i) (void)Tokenizer::safe_piece(tok.decode(1, i));
    } catch (const depthkv::Error&) {
    }
  } catch (const depthkv::Error&) {
  }
  try {
    const LlamaModel m = load_gguf(f);
    const auto& c = m.config;
    check(m.layers.size() == static_cast<std::size_t>(c.n_layers));
    // a weight is float32 or kept in its stored blocks (QuantWeight), never both
    auto rows_of = [&](const depthkv::llama::RowMatrix& w, const depthkv::llama::QuantWeight& q, Eigen::Index cols) {
      if (q.empty()) {
        check(w.cols() == cols);
        return static_cast<std::int64_t>(w.rows());
      }
      check(w.size() == 0 && q.cols == cols && q.row_bytes == depthkv::llama::ggml_row_bytes(q.type, q.cols));
      return q.rows;
    };
    check(rows_of(m.token_embedding, m.token_embedding_quant, c.dim) == c.vocab_size);
    check(rows_of(m.classifier, m.classifier_quant, c.dim) == c.vocab_size);
    check(rows_of(m.layers[0].wq, m.layers[0].wq_quant, c.dim) == static_cast<std::int64_t>(c.n_heads) * c.head_dim);
    check(rows_of(m.layers[0].wk, m.layers[0].wk_quant, c.dim) == static_cast<std::int64_t>(c.n_kv_heads) * c.head_dim);
    check(c.n_heads % c.n_kv_heads == 0 && c.head_dim % 2 == 0);
    check(m.token_embedding.allFinite() && m.classifier.allFinite() && m.final_norm.allFinite());
    bool valid = true;  // the engine accepts what the loader built
    try {
      depthkv::llama::LlamaEngine::validate(m);
    } catch (const depthkv::Error&) {
      valid = false;
    }
    check(valid);
  } catch (const depthkv::Error&) {
  }
  return 0;
}
