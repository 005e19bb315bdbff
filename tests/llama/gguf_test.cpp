#include "depthkv/llama/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "depthkv/llama/architecture.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/perplexity.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "llama/file_util.hpp"
#include "llama/gguf_writer.hpp"
#include "support/test_data.hpp"

using depthkv::Error;
using depthkv::llama::GgufFile;
using depthkv::llama::GgufType;
using depthkv::llama::LlamaModel;
using depthkv::llama::load_gguf;
using depthkv::llama::load_gguf_from_memory;
using depthkv::llama::RowMatrix;
using depthkv_test::Bytes;
using depthkv_test::GgufWriter;
using depthkv_test::half_near;

namespace {

std::string stories_gguf() { return depthkv_test::data_path("models/stories260K/stories260K.gguf"); }

float max_abs_diff(const RowMatrix& a, const RowMatrix& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  return a.size() == 0 ? 0.0f : (a - b).cwiseAbs().maxCoeff();
}
float max_abs_diff(const Eigen::VectorXf& a, const Eigen::VectorXf& b) {
  REQUIRE(a.size() == b.size());
  return a.size() == 0 ? 0.0f : (a - b).cwiseAbs().maxCoeff();
}

// Random tensor data of a given type, with the reference float values computed from the bit
// layouts by depthkv_test::ref_half / ref_bf16 (finite values only). `tame`: values of a
// trainable-looking model instead of the full range (F32 vectors 1 + N(0, 0.1^2), F32 matrices
// N(0, 0.05^2), F16/BF16 matrices the F32 ones' values truncated to the type (|v| >= 6.2e-5 for
// F16); block types' fp16 scales fixed so that |w| <= ~0.15), for forward-pass tests.
Bytes random_tensor(std::uint32_t type, std::size_t n, std::mt19937& rng, std::vector<float>& ref, bool tame = false,
                    bool is_vector = false) {
  Bytes b;
  ref.clear();
  std::uniform_int_distribution<int> bit(0, 1);
  auto half_bits = [&](int emin, int emax) {
    const std::uint16_t e = static_cast<std::uint16_t>(emin + static_cast<int>(rng() % (emax - emin + 1)));
    return static_cast<std::uint16_t>((bit(rng) << 15) | (e << 10) | (rng() & 1023));
  };
  if (type == depthkv_test::kTF32) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      ref.push_back(!tame ? nd(rng) : is_vector ? 1.0f + 0.1f * nd(rng) : 0.05f * nd(rng));
      depthkv_test::put(b, ref.back());
    }
  } else if (tame && (type == depthkv_test::kTF16 || type == depthkv_test::kTBF16)) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const float v = is_vector ? 1.0f + 0.1f * nd(rng) : 0.05f * nd(rng);
      std::uint16_t h = 0;
      if (type == depthkv_test::kTF16) {
        h = static_cast<std::uint16_t>(half_near(std::fabs(v)) | (v < 0 ? 0x8000 : 0));
      } else {
        std::uint32_t u = 0;
        std::memcpy(&u, &v, 4);
        h = static_cast<std::uint16_t>(u >> 16);
      }
      depthkv_test::put(b, h);
      ref.push_back(static_cast<float>(type == depthkv_test::kTF16 ? depthkv_test::ref_half(h) : depthkv_test::ref_bf16(h)));
    }
  } else if (type == depthkv_test::kTF16) {
    for (std::size_t i = 0; i < n; ++i) {
      // exponent 0 (subnormals) included on purpose
      const std::uint16_t h = i % 7 == 0 ? static_cast<std::uint16_t>(rng() & 0x83FF) : half_bits(1, 30);
      depthkv_test::put(b, h);
      ref.push_back(static_cast<float>(depthkv_test::ref_half(h)));
    }
  } else if (type == depthkv_test::kTBF16) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t e = static_cast<std::uint16_t>(100 + rng() % 50);
      const std::uint16_t h = static_cast<std::uint16_t>((bit(rng) << 15) | (e << 7) | (rng() & 127));
      depthkv_test::put(b, h);
      ref.push_back(static_cast<float>(depthkv_test::ref_bf16(h)));
    }
  } else if (type == depthkv_test::kTQ8_0) {
    REQUIRE(n % 32 == 0);
    for (std::size_t blk = 0; blk < n / 32; ++blk) {
      const std::uint16_t d = tame ? half_near(0.15f / 128.0f) : half_bits(5, 20);
      depthkv_test::put(b, d);
      for (int j = 0; j < 32; ++j) {
        const std::int8_t q = static_cast<std::int8_t>(static_cast<int>(rng() % 256) - 128);
        depthkv_test::put(b, q);
        ref.push_back(static_cast<float>(depthkv_test::ref_half(d) * q));
      }
    }
  } else if (depthkv::llama::ggml_type_dequantizable(type)) {
    // Another block type: random bytes with every fp16 field a finite half; the reference
    // values are the library's dequantize_row (checked against gguf.quants by
    // tests/llama/quant/dequantize_test.cpp).
    depthkv::llama::GgmlTypeInfo info{};
    REQUIRE(depthkv::llama::ggml_type_info(type, info));
    REQUIRE(n % info.block_size == 0);
    std::vector<int> fields;
    switch (type) {
      case 2: case 6: case 20: case 23: fields = {0}; break;  // Q4_0, Q5_0, IQ4_NL, IQ4_XS
      case 3: case 7: case 12: case 13: fields = {0, 2}; break;  // Q4_1, Q5_1, Q4_K, Q5_K
      case 10: fields = {80, 82}; break;  // Q2_K
      case 11: fields = {108}; break;  // Q3_K
      case 14: fields = {208}; break;  // Q6_K
      default: FAIL("random_tensor: no fp16 field table for type " << type);
    }
    for (std::size_t blk = 0; blk < n / info.block_size; ++blk) {
      Bytes block(info.type_size);
      for (auto& v : block) v = static_cast<std::uint8_t>(rng());
      for (std::size_t i = 0; i < fields.size(); ++i) {
        std::uint16_t h = half_bits(5, 14);
        if (tame) {  // largest multiplier of the scale: Q4_0/IQ4 8-127, Q4_K 15*63 (min 63), Q6_K 32*128
          const float mult = type == 12 || type == 13 ? (i == 0 ? 15.0f * 63.0f : 3.0f * 63.0f)
                             : type == 14           ? 32.0f * 128.0f
                             : type == 20 || type == 23 ? 127.0f
                                                        : 16.0f;
          h = half_near(0.15f / mult);
        }
        std::memcpy(&block[static_cast<std::size_t>(fields[i])], &h, 2);
      }
      b.insert(b.end(), block.begin(), block.end());
    }
    ref.resize(n);
    depthkv::llama::dequantize_row(static_cast<depthkv::llama::GgmlType>(type), b.data(), ref.data(),
                                   static_cast<std::int64_t>(n));
  } else {
    FAIL("random_tensor: unsupported type " << type);
  }
  return b;
}

struct Synth {
  int dim = 32, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 8, vocab = 20, ctx = 64;
  std::string arch = "llama";
  bool tied = false, biases = false, rope_freqs = false, qk_norm = false;
  bool post_norms = false;  // post_attention_norm, post_ffw_norm (gemma3)
  int window = 0;           // > 0: writes <arch>.attention.sliding_window
  bool tame = false;  // random_tensor's tame values (a model whose forward pass is well scaled)
  // type per tensor name suffix (default F32)
  std::map<std::string, std::uint32_t> types;
  std::map<std::string, std::vector<float>> ref;  // filled by build()

  GgufWriter writer(std::uint32_t seed = 7) {
    GgufWriter w;
    const std::string p = arch + ".";
    w.kv_str("general.architecture", arch);
    w.kv_u32(p + "embedding_length", static_cast<std::uint32_t>(dim));
    w.kv_u32(p + "feed_forward_length", static_cast<std::uint32_t>(hidden));
    w.kv_u32(p + "block_count", static_cast<std::uint32_t>(layers));
    w.kv_u32(p + "attention.head_count", static_cast<std::uint32_t>(heads));
    w.kv_u32(p + "attention.head_count_kv", static_cast<std::uint32_t>(kv_heads));
    w.kv_u32(p + "context_length", static_cast<std::uint32_t>(ctx));
    w.kv_f32(p + "rope.freq_base", 500000.0f);
    w.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
    if (head_dim * heads != dim) w.kv_u32(p + "attention.key_length", static_cast<std::uint32_t>(head_dim));
    if (window > 0) w.kv_u32(p + "attention.sliding_window", static_cast<std::uint32_t>(window));
    std::mt19937 rng(seed);
    auto add = [&](const std::string& name, std::vector<std::uint64_t> dims) {
      std::size_t n = 1;
      for (auto d : dims) n *= d;
      std::uint32_t type = depthkv_test::kTF32;
      for (const auto& kv : types) {
        if (name.find(kv.first) != std::string::npos) type = kv.second;
      }
      std::vector<float> r;
      w.tensor(name, dims, type, random_tensor(type, n, rng, r, tame, dims.size() == 1));
      ref[name] = r;
    };
    const std::uint64_t D = dim, H = hidden, Q = heads * head_dim, KV = kv_heads * head_dim, V = vocab;
    add("token_embd.weight", {D, V});
    for (int l = 0; l < layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      add(b + "attn_norm.weight", {D});
      add(b + "attn_q.weight", {D, Q});
      add(b + "attn_k.weight", {D, KV});
      add(b + "attn_v.weight", {D, KV});
      add(b + "attn_output.weight", {Q, D});
      if (biases) {
        add(b + "attn_q.bias", {Q});
        add(b + "attn_k.bias", {KV});
        add(b + "attn_v.bias", {KV});
      }
      if (qk_norm) {
        add(b + "attn_q_norm.weight", {static_cast<std::uint64_t>(head_dim)});
        add(b + "attn_k_norm.weight", {static_cast<std::uint64_t>(head_dim)});
      }
      if (post_norms) add(b + "post_attention_norm.weight", {D});
      add(b + "ffn_norm.weight", {D});
      if (post_norms) add(b + "post_ffw_norm.weight", {D});
      add(b + "ffn_gate.weight", {D, H});
      add(b + "ffn_down.weight", {H, D});
      add(b + "ffn_up.weight", {D, H});
    }
    add("output_norm.weight", {D});
    if (!tied) add("output.weight", {D, V});
    if (rope_freqs) {
      std::vector<float> f;
      for (int i = 0; i < head_dim / 2; ++i) f.push_back(1.0f + static_cast<float>(i));
      w.f32_tensor("rope_freqs.weight", {static_cast<std::uint64_t>(head_dim / 2)}, f);
      ref["rope_freqs.weight"] = f;
    }
    return w;
  }
};

// Reference [rows][cols] matrix of a tensor stored with GGUF dims [cols, rows].
RowMatrix ref_matrix(const std::vector<float>& v, Eigen::Index rows, Eigen::Index cols) {
  REQUIRE(static_cast<Eigen::Index>(v.size()) == rows * cols);
  return Eigen::Map<const RowMatrix>(v.data(), rows, cols);
}
Eigen::VectorXf ref_vector(const std::vector<float>& v) {
  return Eigen::Map<const Eigen::VectorXf>(v.data(), static_cast<Eigen::Index>(v.size()));
}

// The float values of a weight held either as float32 or in place as stored blocks.
RowMatrix weight_values(const RowMatrix& w, const depthkv::llama::QuantWeight& q) {
  if (q.empty()) return w;
  CHECK(w.size() == 0);
  RowMatrix out(q.rows, q.cols);
  for (std::int64_t r = 0; r < q.rows; ++r)
    depthkv::llama::dequantize_row(q.type, q.data + static_cast<std::size_t>(r) * q.row_bytes, out.row(r).data(), q.cols);
  return out;
}

void check_synth(const LlamaModel& m, Synth& s) {
  const int Q = s.heads * s.head_dim, KV = s.kv_heads * s.head_dim;
  CHECK(max_abs_diff(weight_values(m.token_embedding, m.token_embedding_quant),
                     ref_matrix(s.ref["token_embd.weight"], s.vocab, s.dim)) == 0.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const auto& w = m.layers[static_cast<std::size_t>(l)];
    CHECK(max_abs_diff(w.attn_norm, ref_vector(s.ref[b + "attn_norm.weight"])) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.wq, w.wq_quant), ref_matrix(s.ref[b + "attn_q.weight"], Q, s.dim)) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.wk, w.wk_quant), ref_matrix(s.ref[b + "attn_k.weight"], KV, s.dim)) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.wv, w.wv_quant), ref_matrix(s.ref[b + "attn_v.weight"], KV, s.dim)) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.wo, w.wo_quant), ref_matrix(s.ref[b + "attn_output.weight"], s.dim, Q)) == 0.0f);
    CHECK(max_abs_diff(w.ffn_norm, ref_vector(s.ref[b + "ffn_norm.weight"])) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.w1, w.w1_quant), ref_matrix(s.ref[b + "ffn_gate.weight"], s.hidden, s.dim)) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.w2, w.w2_quant), ref_matrix(s.ref[b + "ffn_down.weight"], s.dim, s.hidden)) == 0.0f);
    CHECK(max_abs_diff(weight_values(w.w3, w.w3_quant), ref_matrix(s.ref[b + "ffn_up.weight"], s.hidden, s.dim)) == 0.0f);
    if (s.biases) {
      CHECK(max_abs_diff(w.bq, ref_vector(s.ref[b + "attn_q.bias"])) == 0.0f);
      CHECK(max_abs_diff(w.bk, ref_vector(s.ref[b + "attn_k.bias"])) == 0.0f);
      CHECK(max_abs_diff(w.bv, ref_vector(s.ref[b + "attn_v.bias"])) == 0.0f);
    } else {
      CHECK(w.bq.size() == 0);
    }
    if (s.qk_norm) {
      CHECK(max_abs_diff(w.q_norm, ref_vector(s.ref[b + "attn_q_norm.weight"])) == 0.0f);
      CHECK(max_abs_diff(w.k_norm, ref_vector(s.ref[b + "attn_k_norm.weight"])) == 0.0f);
    } else {
      CHECK(w.q_norm.size() == 0);
      CHECK(w.k_norm.size() == 0);
    }
  }
  CHECK(max_abs_diff(m.final_norm, ref_vector(s.ref["output_norm.weight"])) == 0.0f);
  if (s.tied) {
    CHECK(m.classifier == m.token_embedding);
    CHECK(m.classifier_quant.data == m.token_embedding_quant.data);  // tied: the same bytes, no copy
  } else {
    CHECK(max_abs_diff(weight_values(m.classifier, m.classifier_quant), ref_matrix(s.ref["output.weight"], s.vocab, s.dim)) ==
          0.0f);
  }
  if (s.rope_freqs) {
    CHECK(max_abs_diff(m.rope_freq_factors, ref_vector(s.ref["rope_freqs.weight"])) == 0.0f);
  } else {
    CHECK(m.rope_freq_factors.size() == 0);
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

TEST_CASE("gguf: stories260K.gguf parses", "[llama][gguf]") {
  const GgufFile f = GgufFile::open(stories_gguf());
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().size() == 48);
  CHECK(f.metadata().size() == 19);
  CHECK(f.data_offset() == 14176);
  CHECK(f.file_size() == 1185376);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_int("llama.block_count") == 5);
  CHECK(f.get_int("llama.context_length") == 2048);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == Approx(1e-5));
  CHECK(f.get_int("missing.key", 42) == 42);
  CHECK(f.get_string("missing.key", "x") == "x");
  CHECK_THROWS_AS(f.get_int("missing.key"), Error);
  CHECK_THROWS_AS(f.get_int("general.architecture"), Error);      // a string
  CHECK_THROWS_AS(f.get_string("llama.block_count"), Error);      // an integer
  CHECK_THROWS_AS(f.get_string_array("tokenizer.ggml.scores"), Error);
  CHECK(f.find("tokenizer.ggml.tokens")->type == GgufType::kArray);
  CHECK(f.find("tokenizer.ggml.tokens")->array.size() == 512);
  const auto* t = f.find_tensor("blk.0.ffn_down.weight");
  REQUIRE(t != nullptr);
  CHECK(t->dims == std::vector<std::uint64_t>{172, 64});
  CHECK(t->type == 0);
  CHECK(t->n_elements == 172u * 64u);
  CHECK(t->n_bytes == 172u * 64u * 4u);
  CHECK(f.find_tensor("nope") == nullptr);
  // Copies share the bytes and stay valid on their own.
  GgufFile copy = f;
  CHECK(copy.read_tensor(*copy.find_tensor("output_norm.weight")) == f.read_tensor(*f.find_tensor("output_norm.weight")));
}

TEST_CASE("gguf: stories260K.gguf and stories260K.bin hold identical weights", "[llama][gguf]") {
  const LlamaModel g = load_gguf(stories_gguf());
  const LlamaModel b = depthkv::llama::load_llama2c(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  CHECK(g.config.dim == b.config.dim);
  CHECK(g.config.hidden_dim == b.config.hidden_dim);
  CHECK(g.config.n_layers == b.config.n_layers);
  CHECK(g.config.n_heads == b.config.n_heads);
  CHECK(g.config.n_kv_heads == b.config.n_kv_heads);
  CHECK(g.config.vocab_size == b.config.vocab_size);
  CHECK(g.config.head_dim == b.config.head_dim);
  CHECK(g.config.rope_theta == b.config.rope_theta);
  CHECK(g.config.rms_eps == Approx(b.config.rms_eps));
  CHECK(g.config.rope_neox == b.config.rope_neox);
  CHECK(g.config.architecture == "llama");
  CHECK(g.config.seq_len == 2048);  // as the GGUF metadata states (the model was trained on 512)
  CHECK(g.source_path == stories_gguf());
  CHECK(g.file_size == 1185376u);
  CHECK(g.header_hash != b.header_hash);
  CHECK(max_abs_diff(g.token_embedding, b.token_embedding) == 0.0f);
  CHECK(max_abs_diff(g.classifier, b.classifier) == 0.0f);
  CHECK(max_abs_diff(g.final_norm, b.final_norm) == 0.0f);
  REQUIRE(g.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < g.layers.size(); ++l) {
    INFO("layer " << l);
    const auto &x = g.layers[l], &y = b.layers[l];
    CHECK(max_abs_diff(x.attn_norm, y.attn_norm) == 0.0f);
    CHECK(max_abs_diff(x.wq, y.wq) == 0.0f);
    CHECK(max_abs_diff(x.wk, y.wk) == 0.0f);
    CHECK(max_abs_diff(x.wv, y.wv) == 0.0f);
    CHECK(max_abs_diff(x.wo, y.wo) == 0.0f);
    CHECK(max_abs_diff(x.ffn_norm, y.ffn_norm) == 0.0f);
    CHECK(max_abs_diff(x.w1, y.w1) == 0.0f);
    CHECK(max_abs_diff(x.w2, y.w2) == 0.0f);
    CHECK(max_abs_diff(x.w3, y.w3) == 0.0f);
    CHECK(x.bq.size() == 0);
  }
  CHECK(g.rope_freq_factors.size() == 0);
  const Bytes raw = depthkv_test::read_bytes(stories_gguf());
  const LlamaModel m = load_gguf_from_memory(raw.data(), raw.size(), "mem");
  CHECK(m.header_hash == g.header_hash);
  CHECK(m.source_path == "mem");
  CHECK(m.layers[3].w2 == g.layers[3].w2);
}

TEST_CASE("gguf: the stored vocabulary tokenizes exactly like tok512.bin", "[llama][gguf][tokenizer]") {
  const depthkv::llama::Vocabulary v = depthkv::llama::load_gguf_vocabulary(stories_gguf());
  CHECK(v.model == "llama");
  CHECK(v.size() == 512);
  CHECK(v.scores.size() == 512);
  CHECK(v.token_types.size() == 512);
  CHECK(v.token_types[3] == 6);  // <0x00> is a byte token
  CHECK(v.bos_id == 1);
  CHECK(v.eos_id == 2);
  CHECK(v.unk_id == 0);
  CHECK(v.tokens[1] == "<s>");
  const depthkv::llama::Tokenizer tg(v);
  const depthkv::llama::Tokenizer tb(depthkv_test::data_path("models/stories260K/tok512.bin"), 512);
  REQUIRE(tg.vocab_size() == tb.vocab_size());
  for (int i = 0; i < tb.vocab_size(); ++i) {
    INFO("token " << i);
    REQUIRE(tg.piece(i) == tb.piece(i));
    REQUIRE(tg.score(i) == tb.score(i));
  }
  CHECK(tg.max_token_length() == tb.max_token_length());
  std::ifstream text(depthkv_test::data_path("text/tinystories_valid.txt"), std::ios::binary);
  std::string chunk(20000, '\0');
  text.read(&chunk[0], static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<std::size_t>(text.gcount()));
  CHECK(tg.encode(chunk, true, false) == tb.encode(chunk, true, false));
  CHECK(tg.encode("Once upon a time", false, false) == std::vector<int>{403, 407, 261, 378});
}

TEST_CASE("gguf: F32, F16, BF16 and Q8_0 tensors are dequantised exactly", "[llama][gguf]") {
  for (std::uint32_t type : {depthkv_test::kTF32, depthkv_test::kTF16, depthkv_test::kTBF16, depthkv_test::kTQ8_0}) {
    INFO("type " << type);
    std::mt19937 rng(1000 + type);
    std::vector<float> ref;
    GgufWriter w;
    w.kv_str("general.architecture", "test");
    w.tensor("t", {64, 3}, type, random_tensor(type, 192, rng, ref));
    const Bytes b = w.build();
    const GgufFile f = GgufFile::from_memory(b.data(), b.size());
    const auto& info = f.tensors().at(0);
    CHECK(info.n_elements == 192);
    const std::vector<float> got = f.read_tensor(info);
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      REQUIRE(got[i] == ref[i]);
    }
  }
  // Special half values.
  CHECK(depthkv::llama::fp16_to_float(0x3C00) == 1.0f);
  CHECK(depthkv::llama::fp16_to_float(0xC000) == -2.0f);
  CHECK(depthkv::llama::fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(depthkv::llama::fp16_to_float(0x7BFF) == 65504.0f);
  CHECK(std::isinf(depthkv::llama::fp16_to_float(0x7C00)));
  CHECK(std::isnan(depthkv::llama::fp16_to_float(0x7E00)));
  CHECK(std::signbit(depthkv::llama::fp16_to_float(0x8000)));
  CHECK(depthkv::llama::bf16_to_float(0x3F80) == 1.0f);
  // Every half bit pattern agrees with the reference decoder.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float a = depthkv::llama::fp16_to_float(static_cast<std::uint16_t>(h));
    const double r = depthkv_test::ref_half(static_cast<std::uint16_t>(h));
    if (std::isnan(r)) {
      REQUIRE(std::isnan(a));
    } else {
      REQUIRE(static_cast<double>(a) == r);
    }
  }
}

TEST_CASE("gguf: every block type reads as dequantize_row does, and its bytes in place", "[llama][gguf][quant]") {
  for (std::uint32_t type : {2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 20u, 23u}) {
    INFO("type " << depthkv::llama::ggml_type_name(type));
    std::mt19937 rng(2000 + type);
    std::vector<float> ref;
    GgufWriter w;
    w.kv_str("general.architecture", "test");
    w.f32_tensor("first", {3}, {1.0f, 2.0f, 3.0f});  // the tensor under test starts at a later offset
    const Bytes data = random_tensor(type, 512 * 3, rng, ref);
    w.tensor("t", {512, 3}, type, data);
    const Bytes b = w.build();
    std::shared_ptr<const void> keep;
    GgufFile::RawTensor raw;
    {
      const GgufFile f = GgufFile::from_memory(b.data(), b.size());
      const auto& info = *f.find_tensor("t");
      CHECK(depthkv::llama::ggml_type_readable(type));
      const std::vector<float> got = f.read_tensor(info);
      REQUIRE(got.size() == ref.size());
      CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0);
      raw = f.raw_tensor(info);
      CHECK(raw.type == static_cast<depthkv::llama::GgmlType>(type));
      CHECK(raw.data == f.tensor_data(info));
      CHECK(raw.rows == 3);
      CHECK(raw.cols == 512);
      CHECK(raw.n_bytes == data.size());
      CHECK(raw.row_bytes == depthkv::llama::ggml_row_bytes(raw.type, 512));
      keep = f.keep_alive();
    }
    // The bytes outlive every GgufFile copy while keep_alive() is held.
    REQUIRE(raw.n_bytes == data.size());
    CHECK(std::memcmp(raw.data, data.data(), data.size()) == 0);
    std::vector<float> row(512);
    depthkv::llama::dequantize_row(raw.type, raw.data + 2 * raw.row_bytes, row.data(), 512);
    CHECK(std::memcmp(row.data(), ref.data() + 1024, 512 * sizeof(float)) == 0);
  }
}

TEST_CASE("gguf: a synthetic model in K-quant and legacy block types loads to the dequantized weights", "[llama][gguf][quant]") {
  Synth s;
  s.dim = 256;
  s.hidden = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.types = {{"attn_q", 12}, {"attn_k", 13}, {"attn_v", 14}, {"attn_output", 11}, {"ffn_gate", 10},
             {"ffn_down", 12}, {"ffn_up", 2}, {"token_embd", 12}, {"output.", 14}};
  const Bytes b = s.writer().build();
  const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
  CHECK(m.config.dim == 256);
  check_synth(m, s);
}

TEST_CASE("gguf: a truncated Q4_K tensor is a clear error", "[llama][gguf][quant][corrupt]") {
  std::mt19937 rng(3);
  std::vector<float> ref;
  GgufWriter w;
  w.kv_str("general.architecture", "test");
  w.tensor("blk.0.ffn_up.weight", {256, 4}, depthkv_test::kTQ4_K, random_tensor(depthkv_test::kTQ4_K, 1024, rng, ref));
  Bytes b = w.build();
  CHECK_NOTHROW(GgufFile::from_memory(b.data(), b.size()));
  b.resize(b.size() - 100);  // the last block loses its last 100 bytes
  const std::string msg = error_of([&] { GgufFile::from_memory(b.data(), b.size()); });
  CHECK(contains(msg, "blk.0.ffn_up.weight"));
  CHECK(contains(msg, "Q4_K"));
  CHECK(contains(msg, "576 bytes"));
  CHECK(contains(msg, "extends past the end of the file"));
}

TEST_CASE("gguf: synthetic llama models in mixed tensor types load exactly", "[llama][gguf]") {
  Synth s;
  s.types = {{"attn_q", depthkv_test::kTF16}, {"attn_k", depthkv_test::kTBF16}, {"ffn_down", depthkv_test::kTQ8_0},
             {"ffn_up", depthkv_test::kTQ8_0}, {"token_embd", depthkv_test::kTF16}, {"output.", depthkv_test::kTBF16}};
  s.rope_freqs = true;
  Bytes b = s.writer().build();
  const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
  CHECK(m.config.dim == 32);
  CHECK(m.config.hidden_dim == 64);
  CHECK(m.config.n_layers == 2);
  CHECK(m.config.n_heads == 4);
  CHECK(m.config.n_kv_heads == 2);
  CHECK(m.config.head_dim == 8);
  CHECK(m.config.vocab_size == 20);
  CHECK(m.config.seq_len == 64);
  CHECK(m.config.rope_theta == 500000.0f);
  CHECK(m.config.rms_eps == 1e-6f);
  CHECK_FALSE(m.config.rope_neox);
  check_synth(m, s);

  // Through a file in a private temporary folder, and as GGUF v2.
  depthkv_test::TempDir dir;
  GgufWriter w2 = s.writer();
  w2.version = 2;
  const Bytes b2 = w2.build();
  const LlamaModel m2 = load_gguf(dir.write("v2.gguf", b2));
  check_synth(m2, s);

  // head_dim from attention.key_length (head_dim * heads != dim) and a tied classifier.
  Synth k;
  k.head_dim = 16;
  k.tied = true;
  const Bytes bk = k.writer().build();
  const LlamaModel mk = load_gguf_from_memory(bk.data(), bk.size());
  CHECK(mk.config.head_dim == 16);
  CHECK(mk.layers[0].wq.rows() == 64);
  CHECK(mk.layers[0].wo.cols() == 64);
  check_synth(mk, k);
}

TEST_CASE("gguf: qwen2 models (biases, NeoX RoPE, tied output)", "[llama][gguf]") {
  Synth s;
  s.arch = "qwen2";
  s.biases = true;
  s.tied = true;
  const Bytes b = s.writer().build();
  const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
  CHECK(m.config.architecture == "qwen2");
  CHECK(m.config.rope_neox);
  check_synth(m, s);
  // qwen2 without biases is rejected
  Synth nb;
  nb.arch = "qwen2";
  const Bytes bn = nb.writer().build();
  CHECK(contains(error_of([&] { load_gguf_from_memory(bn.data(), bn.size()); }), "attn_q.bias"));
}

TEST_CASE("gguf: qwen3 models (per-head q/k norms, NeoX RoPE) and linear RoPE scaling", "[llama][gguf]") {
  Synth s;
  s.arch = "qwen3";
  s.qk_norm = true;
  s.head_dim = 16;  // key_length 16 with 4 heads: q width 64 != dim 32, as in Qwen3
  const Bytes b = s.writer().build();
  const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
  CHECK(m.config.architecture == "qwen3");
  CHECK(m.config.rope_neox);
  CHECK(m.config.rope_freq_scale == 1.0f);
  check_synth(m, s);
  {  // with biases too
    Synth sb = s;
    sb.biases = true;
    const Bytes bb = sb.writer().build();
    check_synth(load_gguf_from_memory(bb.data(), bb.size()), sb);
  }
  {  // qwen3 without q/k norms is rejected, naming the tensor
    Synth nn = s;
    nn.qk_norm = false;
    const Bytes bn = nn.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bn.data(), bn.size()); }), "attn_q_norm.weight"));
  }
  {  // llama with q/k norms: unexpected tensors
    Synth ln;
    ln.qk_norm = true;
    const Bytes bl = ln.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bl.data(), bl.size()); }), "unexpected tensor 'blk.0.attn_q_norm.weight'"));
  }
  // linear RoPE scaling: positions divided by the factor; the older rope.scale_linear key too
  Synth l;
  GgufWriter w = l.writer();
  w.kv_str("llama.rope.scaling.type", "linear");
  w.kv_f32("llama.rope.scaling.factor", 4.0f);
  const Bytes bw = w.build();
  CHECK(load_gguf_from_memory(bw.data(), bw.size()).config.rope_freq_scale == 0.25f);
  GgufWriter w2 = l.writer();
  w2.kv_f32("llama.rope.scale_linear", 2.0f);
  const Bytes bw2 = w2.build();
  CHECK(load_gguf_from_memory(bw2.data(), bw2.size()).config.rope_freq_scale == 0.5f);
}

TEST_CASE("gguf: gemma3 models (post norms, GeGLU, scaled embeddings, sliding-window layers)", "[llama][gguf]") {
  Synth s;
  s.arch = "gemma3";
  s.qk_norm = true;
  s.post_norms = true;
  s.tied = true;
  s.layers = 7;
  s.window = 16;
  s.head_dim = 16;
  const Bytes b = s.writer().build();
  const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
  CHECK(m.config.architecture == "gemma3");
  CHECK(m.config.rope_neox);
  CHECK(m.config.ffn_activation == depthkv::llama::FfnActivation::kGeluTanh);
  CHECK(m.config.embedding_scale == std::sqrt(32.0f));
  // five local layers, then a global one (llama.cpp's pattern for Gemma 3)
  CHECK(m.config.layer_window == std::vector<int>{16, 16, 16, 16, 16, 0, 16});
  CHECK(m.config.rope_theta_local == 10000.0f);
  CHECK(m.config.rope_theta == 500000.0f);
  check_synth(m, s);
  CHECK(m.layers[3].attn_post_norm == ref_vector(s.ref.at("blk.3.post_attention_norm.weight")));
  CHECK(m.layers[3].ffn_post_norm == ref_vector(s.ref.at("blk.3.post_ffw_norm.weight")));
  {  // a per-layer pattern array and a local RoPE base in the file are read
    GgufWriter w = s.writer();
    w.kv_f32("gemma3.rope.freq_base_swa", 20000.0f);
    w.kv_bool_array("gemma3.attention.sliding_window_pattern", {true, false, true, false, true, false, false});
    const Bytes bw = w.build();
    const LlamaModel mw = load_gguf_from_memory(bw.data(), bw.size());
    CHECK(mw.config.layer_window == std::vector<int>{16, 0, 16, 0, 16, 0, 0});
    CHECK(mw.config.rope_theta_local == 20000.0f);
  }
  {  // a pattern of the wrong length, or without the window, is refused
    GgufWriter w = s.writer();
    w.kv_bool_array("gemma3.attention.sliding_window_pattern", {true, false});
    const Bytes bw = w.build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bw.data(), bw.size()); }), "array of 7 bools"));
    Synth nw = s;
    nw.window = 0;
    const Bytes bn = nw.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bn.data(), bn.size()); }), "gemma3.attention.sliding_window"));
  }
  {  // gemma3 without post norms: a missing tensor; llama with them: unexpected
    Synth np = s;
    np.post_norms = false;
    const Bytes bn = np.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bn.data(), bn.size()); }), "post_attention_norm.weight"));
    Synth lp;
    lp.post_norms = true;
    const Bytes bl = lp.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bl.data(), bl.size()); }),
                   "unexpected tensor 'blk.0.post_attention_norm.weight'"));
  }
}

TEST_CASE("gguf: every architecture of the table loads with its RoPE pairing and optional tensors", "[llama][gguf]") {
  using depthkv::llama::Architecture;
  using depthkv::llama::RopeStyle;
  using depthkv::llama::TensorUse;
  const std::vector<Architecture>& table = depthkv::llama::architectures();
  REQUIRE(table.size() == 4);
  CHECK(depthkv::llama::supported_architectures() == "llama, qwen2, qwen3, gemma3");
  CHECK(depthkv::llama::find_architecture("gpt2") == nullptr);
  // what each entry says (the engine's behaviour for the GGUF files llama.cpp writes)
  const Architecture* llama = depthkv::llama::find_architecture("llama");
  const Architecture* qwen2 = depthkv::llama::find_architecture("qwen2");
  REQUIRE((llama != nullptr && qwen2 != nullptr));
  CHECK((llama->rope == RopeStyle::kAdjacent && llama->qkv_bias == TensorUse::kOptional && llama->qk_norm == TensorUse::kNone));
  CHECK((qwen2->rope == RopeStyle::kNeox && qwen2->qkv_bias == TensorUse::kRequired && qwen2->qk_norm == TensorUse::kNone));
  CHECK(contains(error_of([] { depthkv::llama::architecture("phi3", "m.gguf"); }),
                 "m.gguf: unsupported architecture 'phi3' (depthkv's engine supports: llama, qwen2, qwen3, gemma3)"));
  {  // through the loader: the file, the architecture and the supported ones
    Synth u;
    u.arch = "phi3";
    const Bytes bu = u.writer().build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(bu.data(), bu.size(), "phi.gguf"); }),
                   "phi.gguf: unsupported architecture 'phi3' (depthkv's engine supports: llama, qwen2, qwen3, gemma3)"));
  }
  const Architecture& qwen3 = depthkv::llama::architecture("qwen3");
  CHECK((qwen3.rope == RopeStyle::kNeox && qwen3.qkv_bias == TensorUse::kOptional && qwen3.qk_norm == TensorUse::kRequired));
  CHECK(qwen3.key(qwen3.keys.head_count_kv) == "qwen3.attention.head_count_kv");
  CHECK(qwen3.layer_tensor(7, qwen3.tensors.attn_k_norm) == "blk.7.attn_k_norm.weight");
  for (const Architecture& a : table) {
    INFO("architecture " << a.name);
    CHECK(&depthkv::llama::architecture(a.name) == &a);
    Synth s;
    s.arch = a.name;
    s.head_dim = 16;
    s.biases = a.qkv_bias == TensorUse::kRequired;
    s.qk_norm = a.qk_norm == TensorUse::kRequired;
    s.tied = a.output != TensorUse::kRequired;
    s.post_norms = a.post_norms == TensorUse::kRequired;
    s.window = a.swa_period > 0 ? 4 : 0;
    const Bytes b = s.writer().build();
    const LlamaModel m = load_gguf_from_memory(b.data(), b.size());
    CHECK(m.config.architecture == a.name);
    CHECK(m.config.rope_neox == (a.rope == RopeStyle::kNeox));
    check_synth(m, s);
    // An optional group is loaded when present; a group the architecture lacks is unexpected.
    for (int group = 0; group < 2; ++group) {
      const TensorUse use = group == 0 ? a.qkv_bias : a.qk_norm;
      if (use == TensorUse::kRequired) continue;
      Synth o = s;
      (group == 0 ? o.biases : o.qk_norm) = true;
      const Bytes bo = o.writer().build();
      if (use == TensorUse::kOptional) {
        check_synth(load_gguf_from_memory(bo.data(), bo.size()), o);
      } else {
        CHECK(contains(error_of([&] { load_gguf_from_memory(bo.data(), bo.size()); }),
                       "unexpected tensor 'blk.0." + std::string(group == 0 ? "attn_q.bias" : "attn_q_norm.weight") +
                           "' for architecture '" + a.name + "'"));
      }
    }
  }
}

TEST_CASE("gguf: metadata of every value type, nested arrays, alignment", "[llama][gguf]") {
  GgufWriter w;
  w.kv<std::uint8_t>("u8", depthkv_test::kU8, 200);
  w.kv<std::int8_t>("i8", depthkv_test::kI8, -100);
  w.kv<std::uint16_t>("u16", depthkv_test::kU16, 60000);
  w.kv<std::int16_t>("i16", depthkv_test::kI16, -30000);
  w.kv<std::uint32_t>("u32", depthkv_test::kU32, 4000000000u);
  w.kv<std::int32_t>("i32", depthkv_test::kI32, -2000000000);
  w.kv<std::uint64_t>("u64", depthkv_test::kU64, std::numeric_limits<std::uint64_t>::max());
  w.kv<std::int64_t>("i64", depthkv_test::kI64, std::numeric_limits<std::int64_t>::min());
  w.kv<float>("f32", depthkv_test::kF32, 1.5f);
  w.kv<double>("f64", depthkv_test::kF64, -2.25);
  w.kv<std::uint8_t>("b", depthkv_test::kBool, 1);
  w.kv_str("s", std::string("a\0b", 3));
  w.kv_str("empty", "");
  w.kv_u32("general.alignment", 64);
  w.alignment = 64;
  Bytes nested;  // [[1, 2], []] as arrays of int16
  depthkv_test::put<std::uint32_t>(nested, depthkv_test::kArr);
  depthkv_test::put<std::uint64_t>(nested, 2);
  depthkv_test::put<std::uint32_t>(nested, depthkv_test::kI16);
  depthkv_test::put<std::uint64_t>(nested, 2);
  depthkv_test::put<std::int16_t>(nested, 1);
  depthkv_test::put<std::int16_t>(nested, 2);
  depthkv_test::put<std::uint32_t>(nested, depthkv_test::kI16);
  depthkv_test::put<std::uint64_t>(nested, 0);
  w.raw_kv("nested", depthkv_test::kArr, nested);
  w.f32_tensor("a", {3}, {1, 2, 3});
  w.f32_tensor("b", {2, 2}, {4, 5, 6, 7});
  const Bytes bytes = w.build();
  const GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.tensors()[1].offset == 64);
  CHECK(f.get_int("u8") == 200);
  CHECK(f.get_int("i8") == -100);
  CHECK(f.get_int("u16") == 60000);
  CHECK(f.get_int("i16") == -30000);
  CHECK(f.get_int("u32") == 4000000000LL);
  CHECK(f.get_int("i32") == -2000000000);
  CHECK_THROWS_AS(f.get_int("u64"), Error);  // above INT64_MAX
  CHECK(f.find("u64")->u == std::numeric_limits<std::uint64_t>::max());
  CHECK(f.get_int("i64") == std::numeric_limits<std::int64_t>::min());
  CHECK(f.get_float("f32") == 1.5);
  CHECK(f.get_float("f64") == -2.25);
  CHECK(f.get_float("u8") == 200.0);
  CHECK(f.get_bool("b", false));
  CHECK_THROWS_AS(f.get_bool("u8", false), Error);
  CHECK(f.get_string("s") == std::string("a\0b", 3));
  CHECK(f.get_string("empty").empty());
  const auto* n = f.find("nested");
  REQUIRE(n != nullptr);
  CHECK(n->array_type == GgufType::kArray);
  REQUIRE(n->array.size() == 2);
  CHECK(n->array[0].array.size() == 2);
  CHECK(n->array[0].array[1].i == 2);
  CHECK(n->array[1].array.empty());
  CHECK(f.read_tensor(f.tensors()[1]) == std::vector<float>{4, 5, 6, 7});
  CHECK_THROWS_AS(f.get_int_array("nested"), Error);
  // A vocabulary-less file has no tokenizer.
  CHECK(contains(error_of([&] { depthkv::llama::read_vocabulary(f); }), "no tokenizer"));
}

TEST_CASE("gguf: truncated files are rejected at every cut point", "[llama][gguf][corrupt]") {
  const Bytes full = depthkv_test::read_bytes(stories_gguf());
  std::vector<std::size_t> cuts;
  for (std::size_t c = 0; c <= 14200; c += (c < 600 ? 1 : 7)) cuts.push_back(c);  // header, metadata, tensor infos
  for (std::size_t k = 1; k < 200; ++k) cuts.push_back(14176 + k * (full.size() - 14176) / 200);
  cuts.push_back(full.size() - 1);
  for (std::size_t cut : cuts) {
    INFO("cut at " << cut);
    REQUIRE_THROWS_AS(GgufFile::from_memory(full.data(), cut), Error);
  }
  depthkv_test::TempDir dir;
  const std::string p = dir.write("cut.gguf", Bytes(full.begin(), full.begin() + 500000));
  const std::string msg = error_of([&] { load_gguf(p); });
  CHECK(contains(msg, p));
  CHECK(contains(msg, "past the end"));
  CHECK_THROWS_AS(load_gguf(dir.path() + "/missing.gguf"), Error);
  CHECK(depthkv::llama::is_gguf_file(stories_gguf()));
  CHECK(depthkv::llama::is_gguf_file(p));
  CHECK_FALSE(depthkv::llama::is_gguf_file(depthkv_test::data_path("models/stories260K/stories260K.bin")));
  CHECK_FALSE(depthkv::llama::is_gguf_file(dir.path() + "/missing.gguf"));
  CHECK_FALSE(depthkv::llama::is_gguf_file(dir.write("short", {'G', 'G'})));
  CHECK_THROWS_AS(depthkv::llama::load_gguf_vocabulary(dir.write("empty.gguf", {})), Error);
}

TEST_CASE("gguf: corrupt headers, strings, counts and offsets are rejected", "[llama][gguf][corrupt]") {
  const Bytes full = depthkv_test::read_bytes(stories_gguf());
  auto rejects = [&](const Bytes& b, const std::string& what, const std::string& needle) {
    INFO(what);
    const std::string msg = error_of([&] { GgufFile::from_memory(b.data(), b.size()); });
    CHECK(contains(msg, needle));
  };
  {
    Bytes b = full;
    b[0] = 'X';
    rejects(b, "magic", "bad magic");
  }
  for (std::uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    Bytes b = full;
    depthkv_test::poke(b, 4, v);
    rejects(b, "version " + std::to_string(v), "version");
  }
  {
    Bytes b = full;
    depthkv_test::poke<std::uint64_t>(b, 8, 1ull << 60);
    rejects(b, "tensor count", "tensor count");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 16, 1ull << 60);
    rejects(b, "metadata count", "metadata count");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 8, 49);  // one tensor more than stored: its info reads garbage
    CHECK_THROWS_AS(GgufFile::from_memory(b.data(), b.size()), Error);
  }
  {
    // First key "tokenizer.ggml.tokens": its length field at 24, the value type at 24+8+21,
    // the array element type and count after it.
    Bytes b = full;
    depthkv_test::poke<std::uint64_t>(b, 24, 1ull << 62);
    rejects(b, "key length", "length");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 24, 70000);
    rejects(b, "key length above 65535", "at most 65535");
    b = full;
    depthkv_test::poke<std::uint32_t>(b, 53, 13);
    rejects(b, "value type 13", "not a GGUF value type");
    b = full;
    depthkv_test::poke<std::uint32_t>(b, 57, 99);
    rejects(b, "array element type 99", "not a GGUF value type");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 61, 1ull << 40);
    rejects(b, "array count", "cannot fit");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 69, 1ull << 40);  // first token string length
    rejects(b, "token string length", "length");
    b = full;
    depthkv_test::poke<std::uint64_t>(b, 69, 200);  // plausible but wrong: the parse derails
    CHECK_THROWS_AS(GgufFile::from_memory(b.data(), b.size()), Error);
  }
  // Structural errors in synthetic files.
  auto base = [] {
    GgufWriter w;
    w.kv_str("general.architecture", "x");
    w.f32_tensor("a", {4}, {1, 2, 3, 4});
    w.f32_tensor("b", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    return w;
  };
  {
    GgufWriter w = base();
    Bytes b = w.build();
    CHECK_NOTHROW(GgufFile::from_memory(b.data(), b.size()));
    depthkv_test::poke<std::uint64_t>(b, w.offset_field_pos[1], 1ull << 40);
    rejects(b, "offset past the end", "past the end");
    depthkv_test::poke<std::uint64_t>(b, w.offset_field_pos[1], std::numeric_limits<std::uint64_t>::max() - 31);
    rejects(b, "offset + size overflows", "past the end");
    depthkv_test::poke<std::uint64_t>(b, w.offset_field_pos[1], 8);
    rejects(b, "misaligned offset", "alignment");
    depthkv_test::poke<std::uint64_t>(b, w.offset_field_pos[1], 32);  // fits, 32 bytes at 32: end of data
    CHECK_NOTHROW(GgufFile::from_memory(b.data(), b.size()));
    depthkv_test::poke<std::uint64_t>(b, w.offset_field_pos[1], 64);
    rejects(b, "just past the end", "past the end");
  }
  {
    GgufWriter w = base();
    w.tensors[0].dims = {0};
    rejects(w.build(), "zero dimension", "dimension 0 = 0");
    w = base();
    w.tensors[0].dims = {};
    rejects(w.build(), "no dimensions", "dimensions");
    w = base();
    w.tensors[0].dims = {1, 1, 1, 1, 4};
    rejects(w.build(), "5 dimensions", "dimensions");
    w = base();
    w.tensors[0].dims = {1ull << 32, 1ull << 32, 1ull << 32};
    rejects(w.build(), "element count overflow", "too many elements");
    w = base();
    w.tensors[0].dims = {1ull << 40};
    rejects(w.build(), "huge tensor", "past the end");
    w = base();
    w.tensors[1].name = "a";
    rejects(w.build(), "duplicate tensor", "duplicate tensor");
    w = base();
    w.tensors[1].name = std::string(65, 'n');
    rejects(w.build(), "long tensor name", "at most 64");
    w = base();
    w.tensors[1].name = "";
    rejects(w.build(), "empty tensor name", "empty name");
    w = base();
    w.tensors[1].type = depthkv_test::kTQ8_0;  // ne[0] = 4 is no multiple of 32
    rejects(w.build(), "block size", "block size");
    w = base();
    w.kv_str("general.architecture", "y");
    rejects(w.build(), "duplicate key", "duplicate metadata key");
    w = base();
    w.kv<std::uint8_t>("flag", depthkv_test::kBool, 2);
    rejects(w.build(), "bool 2", "must be 0 or 1");
    w = base();
    w.kv_u32("general.alignment", 48);
    rejects(w.build(), "alignment 48", "power of two");
    w = base();
    w.kv_u32("general.alignment", 0);
    rejects(w.build(), "alignment 0", "power of two");
    w = base();
    w.kv_f32("general.alignment", 32.0f);
    rejects(w.build(), "alignment float", "general.alignment");
    w = base();
    w.raw_kv("", depthkv_test::kU8, {1});
    rejects(w.build(), "empty key", "empty key");
  }
  {
    // Arrays nested deeper than the limit.
    Bytes v;
    for (int d = 0; d < 10; ++d) {
      depthkv_test::put<std::uint32_t>(v, depthkv_test::kArr);
      depthkv_test::put<std::uint64_t>(v, 1);
    }
    depthkv_test::put<std::uint32_t>(v, depthkv_test::kU8);
    depthkv_test::put<std::uint64_t>(v, 0);
    GgufWriter w;
    w.raw_kv("deep", depthkv_test::kArr, v);
    rejects(w.build(), "deep nesting", "nested deeper");
  }
}

TEST_CASE("gguf: unsupported models are clear errors", "[llama][gguf][corrupt]") {
  auto load_err = [](GgufWriter w) {
    const Bytes b = w.build();
    return error_of([&] { load_gguf_from_memory(b.data(), b.size()); });
  };
  Synth s;
  {
    Synth a = s;
    a.arch = "gpt2";
    CHECK(contains(load_err(a.writer()), "unsupported architecture 'gpt2'"));
  }
  {
    // An IQ2_XXS tensor (256 elements per block, 66 bytes) needs rows of a multiple of 256.
    Synth q2 = s;
    q2.dim = 256;
    q2.heads = 4;
    q2.head_dim = 64;
    GgufWriter w2 = q2.writer();
    for (auto& t : w2.tensors) {
      if (t.name == "blk.1.ffn_up.weight") {
        t.type = depthkv_test::kTIQ2_XXS;
        t.data.assign(static_cast<std::size_t>(64 * 66), 0);  // 64 rows x 1 block of 256
      }
    }
    const std::string msg = load_err(w2);
    CHECK(contains(msg, "blk.1.ffn_up.weight"));
    CHECK(contains(msg, "IQ2_XXS"));
    CHECK(contains(msg, "supported: F32, F16, BF16, Q4_0"));
  }
  {
    GgufWriter w = s.writer();
    w.tensors[3].type = 99;  // unknown type number: the table parses, the model does not load
    const Bytes b = w.build();
    CHECK_NOTHROW(GgufFile::from_memory(b.data(), b.size()));
    CHECK(contains(load_err(w), "type 99"));
  }
  {
    GgufWriter w = s.writer();
    w.kv_u32("llama.expert_count", 8);
    CHECK(contains(load_err(w), "mixture-of-experts"));
  }
  {
    GgufWriter w = s.writer();
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
    CHECK(contains(load_err(w), "RoPE scaling 'yarn' (factor 4) is not supported"));
  }
  {
    GgufWriter w = s.writer();
    w.kv_str("llama.rope.scaling.type", "linear");
    w.kv_f32("llama.rope.scaling.factor", -1.0f);
    CHECK(contains(load_err(w), "RoPE scaling factor -1 is out of range"));
  }
  {
    GgufWriter w = s.writer();
    w.kv_u32("llama.rope.dimension_count", 4);
    CHECK(contains(load_err(w), "partial RoPE"));
  }
  {
    GgufWriter w = s.writer();
    w.f32_tensor("blk.0.attn_output.bias", {32}, std::vector<float>(32, 0.0f));
    CHECK(contains(load_err(w), "unexpected tensor 'blk.0.attn_output.bias'"));
  }
  {
    GgufWriter w = s.writer();
    w.tensors.erase(w.tensors.begin() + 5);  // blk.0.attn_output.weight
    CHECK(contains(load_err(w), "'blk.0.attn_output.weight' is missing"));
  }
  {
    GgufWriter w = s.writer();
    w.tensors[2].dims = {16, 32};  // blk.0.attn_q.weight transposed: [out, in] instead of [in, out]
    CHECK(contains(load_err(w), "'blk.0.attn_q.weight' has shape [16, 32], expected [32, 32]"));
  }
  {
    Synth n = s;
    n.types = {{"attn_v", depthkv_test::kTF16}};
    GgufWriter w = n.writer();
    for (auto& t : w.tensors) {
      if (t.name == "blk.1.attn_v.weight") depthkv_test::poke<std::uint16_t>(t.data, 10, 0x7E00);  // NaN
    }
    CHECK(contains(load_err(w), "non-finite value at element 5"));
  }
  {
    GgufWriter w;  // hyper-parameters
    Synth h = s;
    w = h.writer();
    w.kvs.erase(w.kvs.begin() + 3);  // llama.block_count
    CHECK(contains(load_err(w), "'llama.block_count' is missing"));
    w = h.writer();
    w.kv_u32("llama.block_count", 7);  // duplicate key
    CHECK(contains(load_err(w), "duplicate"));
    Synth z = s;
    z.heads = 3;
    z.kv_heads = 2;
    z.head_dim = 8;
    CHECK(contains(load_err(z.writer()), "not a multiple of head_count_kv"));
    w = s.writer();
    w.kvs.erase(w.kvs.begin() + 3);
    w.kv_u32("llama.block_count", 1u << 20);
    CHECK(contains(load_err(w), "out of range"));
    w = s.writer();
    w.kvs.erase(w.kvs.begin() + 1);
    w.kv_f32("llama.embedding_length", 32.0f);
    CHECK(contains(load_err(w), "expected an integer"));
  }
  {
    Synth a = s;
    a.arch = "llama";
    GgufWriter w = a.writer();
    w.kvs.erase(w.kvs.begin());
    CHECK(contains(load_err(w), "general.architecture"));
  }
}

TEST_CASE("gguf: errors name the function the caller called (not its helpers)", "[llama][gguf][corrupt]") {
  // what() = "depthkv: <function>: <source>: ..."; the model checks speak for load_gguf, the
  // file checks for the parse of GgufFile::open / from_memory
  auto starts = [](const std::string& msg, const std::string& head) {
    return msg.compare(0, head.size(), head) == 0;
  };
  auto load_err = [](GgufWriter w) {
    const Bytes b = w.build();
    return error_of([&] { load_gguf_from_memory(b.data(), b.size(), "m.gguf"); });
  };
  Synth s;
  GgufWriter w = s.writer();
  w.kv_u32("llama.expert_count", 8);  // the shape's checks
  CHECK(starts(load_err(w), "depthkv: load_gguf: m.gguf: mixture-of-experts"));
  w = s.writer();
  w.kvs.erase(w.kvs.begin() + 7);           // llama.rope.freq_base
  w.kv_f32("llama.rope.freq_base", -1.0f);  // RoPE, norm and context checks
  CHECK(starts(load_err(w), "depthkv: load_gguf: m.gguf: rope.freq_base -1 is out of range"));
  w = s.writer();
  w.f32_tensor("blk.0.attn_output.bias", {32},
               std::vector<float>(32, 0.0f));  // the check that every tensor is used
  CHECK(starts(load_err(w), "depthkv: load_gguf: m.gguf: unexpected tensor 'blk.0.attn_output.bias'"));
  w = s.writer();
  w.tensors.erase(w.tensors.begin());  // token_embd.weight: the vocabulary size
  CHECK(starts(load_err(w), "depthkv: load_gguf: m.gguf: tensor 'token_embd.weight' is missing"));
  Bytes cut = s.writer().build();
  cut.resize(cut.size() - 1);  // the data section: the last tensor runs past the end
  const std::string msg = error_of([&] { GgufFile::from_memory(cut.data(), cut.size(), "cut.gguf"); });
  CHECK(starts(msg, "depthkv: parse: cut.gguf: tensor '"));
  CHECK(contains(msg, "extends past the end of the file"));
  GgufWriter e;
  e.kv_str("", "x");  // the metadata
  const Bytes eb = e.build();
  CHECK(starts(error_of([&] { GgufFile::from_memory(eb.data(), eb.size(), "e.gguf"); }),
               "depthkv: parse: e.gguf: metadata pair 0 has an empty key"));
}

TEST_CASE("gguf: vocabulary errors and gpt2 vocabularies", "[llama][gguf][tokenizer]") {
  auto vocab_err = [](GgufWriter w) {
    const Bytes b = w.build();
    return error_of([&] { depthkv::llama::read_vocabulary(GgufFile::from_memory(b.data(), b.size())); });
  };
  GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "\xC4\xA0" "c"});
  w.kv_u32("tokenizer.ggml.bos_token_id", 0);
  w.kv_u32("tokenizer.ggml.eos_token_id", 0xFFFFFFFFu);
  {
    const Bytes b = w.build();
    const auto v = depthkv::llama::read_vocabulary(GgufFile::from_memory(b.data(), b.size()));
    CHECK(v.model == "gpt2");
    CHECK(v.size() == 3);
    CHECK(v.scores.empty());
    CHECK(v.bos_id == 0);
    CHECK(v.eos_id == -1);
    CHECK(contains(error_of([&] { depthkv::llama::Tokenizer t(v); }), "pre-tokenized"));
  }
  GgufWriter bad = w;
  bad.kv_f32_array("tokenizer.ggml.scores", {0.0f, 1.0f});
  CHECK(contains(vocab_err(bad), "2 entries for 3 tokens"));
  bad = w;
  bad.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1});
  CHECK(contains(vocab_err(bad), "4 entries for 3 tokens"));
  bad = w;
  bad.kv_u32("tokenizer.ggml.unknown_token_id", 3);
  CHECK(contains(vocab_err(bad), "out of range"));
  bad = w;
  bad.kvs.erase(bad.kvs.begin() + 1);
  CHECK(contains(vocab_err(bad), "tokenizer.ggml.tokens' is missing"));
  bad = w;
  bad.kvs.erase(bad.kvs.begin() + 1);
  bad.kv_str_array("tokenizer.ggml.tokens", {});
  CHECK(contains(vocab_err(bad), "empty"));
}

// ---- weights kept in their stored blocks (QuantWeight) against the dequantized float32 twin ----

namespace {

// A tame synthetic llama model (dim 256 so that every K-quant fits) with every weight matrix,
// the token embedding and the classifier stored as `type`.
Synth quant_synth(std::uint32_t type) {
  Synth s;
  s.dim = 256;
  s.hidden = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 48;
  s.ctx = 64;
  s.tame = true;
  s.types = {{"attn_q", type}, {"attn_k", type}, {"attn_v", type}, {"attn_output", type}, {"ffn_gate", type},
             {"ffn_down", type}, {"ffn_up", type}, {"token_embd", type}, {"output.", type}};
  return s;
}

std::vector<int> test_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int> t(static_cast<std::size_t>(n));
  for (int& x : t) x = static_cast<int>(rng() % static_cast<unsigned>(vocab));
  return t;
}

}  // namespace

TEST_CASE("gguf: block-quantized, F16 and BF16 weights stay in place in the mapping, dequantize forces float32",
          "[llama][gguf][quant]") {
  Synth s = quant_synth(depthkv_test::kTQ4_K);
  s.types["ffn_up"] = depthkv_test::kTF16;    // F16 stays in place
  s.types["ffn_gate"] = depthkv_test::kTBF16; // BF16 stays in place
  s.types["attn_v"] = depthkv_test::kTF32;    // F32 is float32
  depthkv_test::TempDir dir;
  const std::string path = dir.write("q4k.gguf", s.writer().build());
  const GgufFile f = GgufFile::open(path);
  const LlamaModel m = load_gguf(f);
  const LlamaModel twin = load_gguf(f, depthkv::llama::GgufLoadOptions{true});
  const auto& w = m.layers[1];
  CHECK(w.wq.size() == 0);
  CHECK(w.wq_quant.type == depthkv::llama::GgmlType::kQ4_K);
  CHECK(w.wq_quant.data == f.raw_tensor(*f.find_tensor("blk.1.attn_q.weight")).data);  // in place, no copy
  CHECK(w.wq_quant.rows == 256);
  CHECK(w.wq_quant.cols == 256);
  CHECK(w.wq_quant.row_bytes == 144);
  CHECK(w.wq_quant.keep_alive == f.keep_alive());
  CHECK(w.w2_quant.cols == 512);
  CHECK(w.w3.size() == 0);
  CHECK(w.w3_quant.type == depthkv::llama::GgmlType::kF16);
  CHECK(w.w3_quant.data == f.raw_tensor(*f.find_tensor("blk.1.ffn_up.weight")).data);
  CHECK(w.w3_quant.rows == 512);
  CHECK(w.w3_quant.row_bytes == 2 * 256);
  CHECK(w.w1.size() == 0);
  CHECK(w.w1_quant.type == depthkv::llama::GgmlType::kBF16);
  CHECK(w.w1_quant.data == f.raw_tensor(*f.find_tensor("blk.1.ffn_gate.weight")).data);
  CHECK(w.wv_quant.empty());
  CHECK(w.wv.rows() == 128);
  CHECK(m.token_embedding.size() == 0);
  CHECK(m.token_embedding_quant.data == f.raw_tensor(*f.find_tensor("token_embd.weight")).data);
  CHECK(m.classifier_quant.data == f.raw_tensor(*f.find_tensor("output.weight")).data);
  check_synth(m, s);
  for (const auto& l : twin.layers) {
    CHECK(l.wq_quant.empty());
    CHECK(l.w1_quant.empty());
    CHECK(l.w3_quant.empty());
  }
  CHECK(twin.token_embedding_quant.empty());
  CHECK(twin.classifier_quant.empty());
  check_synth(twin, s);

  // The mapping outlives the GgufFile: a model loaded from a path runs after the file object is gone.
  const LlamaModel from_path = load_gguf(path);
  const depthkv::llama::LlamaEngine engine(from_path);
  const depthkv::llama::LlamaEngine twin_engine(twin);
  const std::vector<int> tokens = test_tokens(5, s.vocab, 1);
  // the embedding rows of a quantized token_embd are dequantize_row of the stored row, exactly
  CHECK(max_abs_diff(engine.embed(tokens.data(), 5), twin_engine.embed(tokens.data(), 5)) == 0.0f);
}

// Tolerance: the quantized engine multiplies the stored blocks with int8 activations (quant/
// products.hpp), the twin multiplies exactly the same weight values in float32, so the only
// difference is the activations' rounding. Each dot product is within sum_k |w_k| * max|x| / 254
// per 32 values of the exact one; for weights of random sign sum_k |w_k x_k| is ~sqrt(cols) times
// |sum_k w_k x_k|, so one projection's bound is ~sqrt(256..512) / 254 = 6-9% of its output's
// scale (the typical error, a sum of independent roundings, is far smaller). Compounded over
// 2 layers x 7 projections and the classifier. Each type gets its own bound on the largest logit
// difference, at 2.2-2.7x the error measured on these synthetic models (AVX2, this seed: 0.114%
// Q4_K, 2.15% Q8_0, 5.44% Q6_K, 0.328% Q4_0 of the largest logit), so a kernel that gets worse
// than it is fails; and the logits must not agree bit-identically (the quantized path really ran).
TEST_CASE("gguf: the quantized engine's logits match its dequantized float32 twin", "[llama][gguf][quant][engine]") {
  const std::vector<std::pair<std::uint32_t, float>> bounds{
      {depthkv_test::kTQ4_K, 0.003f}, {depthkv_test::kTQ8_0, 0.05f}, {14 /* Q6_K */, 0.12f}, {2 /* Q4_0 */, 0.008f}};
  for (const auto& [type, bound] : bounds) {
    CAPTURE(depthkv::llama::ggml_type_name(type), bound);
    Synth s = quant_synth(type);
    const Bytes b = s.writer(11).build();
    const LlamaModel qm = load_gguf_from_memory(b.data(), b.size());
    const LlamaModel fm = load_gguf_from_memory(b.data(), b.size(), "twin", depthkv::llama::GgufLoadOptions{true});
    REQUIRE_FALSE(qm.layers[0].w1_quant.empty());
    REQUIRE(fm.layers[0].w1_quant.empty());
    const depthkv::llama::LlamaEngine qe(qm), fe(fm);
    const std::vector<int> tokens = test_tokens(20, s.vocab, 2);
    const std::vector<int> prompt(tokens.begin(), tokens.begin() + 12);
    auto qc = qe.make_cache(), fc = fe.make_cache();
    // prefill: quant_matmul (several rows); decode: quant_matvec (one row)
    RowMatrix ql = qe.prefill(prompt, 0, qc), fl = fe.prefill(prompt, 0, fc);
    for (int i = 12; i < 20; ++i) {
      const Eigen::VectorXf qd = qe.decode(tokens[static_cast<std::size_t>(i)], i, qc);
      const Eigen::VectorXf fd = fe.decode(tokens[static_cast<std::size_t>(i)], i, fc);
      ql.conservativeResize(ql.rows() + 1, Eigen::NoChange);
      fl.conservativeResize(fl.rows() + 1, Eigen::NoChange);
      ql.row(ql.rows() - 1) = qd.transpose();
      fl.row(fl.rows() - 1) = fd.transpose();
    }
    REQUIRE(ql.allFinite());
    const float scale = fl.cwiseAbs().maxCoeff();
    const float diff = max_abs_diff(ql, fl);
    CAPTURE(scale, diff);
    CHECK(scale > 0.1f);
    CHECK(diff <= bound * scale);
    CHECK(diff > 0.0f);
    // 2 threads (the FFN's gate and up products reach kParallelGemvWork: the engine's ThreadPool)
    // give the bytes of 1
    auto c1 = qe.make_cache(), c2 = qe.make_cache();
    depthkv::llama::ForwardOptions one, two;
    one.n_threads = 1;
    two.n_threads = 2;
    REQUIRE(max_abs_diff(qe.prefill(prompt, 0, c1, one), qe.prefill(prompt, 0, c2, two)) == 0.0f);
    for (int i = 12; i < 20; ++i) {
      const Eigen::VectorXf d1 = qe.decode(tokens[static_cast<std::size_t>(i)], i, c1, nullptr, depthkv::CpuOptions{1, 3});
      const Eigen::VectorXf d2 = qe.decode(tokens[static_cast<std::size_t>(i)], i, c2, nullptr, depthkv::CpuOptions{2, 3});
      REQUIRE(std::memcmp(d1.data(), d2.data(), sizeof(float) * static_cast<std::size_t>(d1.size())) == 0);
    }
  }
}

// F16 and BF16 weights in place are converted in registers and multiplied in float (FMA, or
// Eigen's GEMM on a converted tile), the twin multiplies the same values in float32: only the
// summation order differs, so the logits agree to float rounding (measured: < 2e-6 of the largest
// logit), and a tied F16 classifier uses the embedding's bytes.
TEST_CASE("gguf: F16 and BF16 weights in place match their float32 twin", "[llama][gguf][quant][engine]") {
  for (std::uint32_t type : {depthkv_test::kTF16, depthkv_test::kTBF16}) {
    CAPTURE(depthkv::llama::ggml_type_name(type));
    Synth s = quant_synth(type);
    s.tied = true;
    const Bytes b = s.writer(13).build();
    const LlamaModel qm = load_gguf_from_memory(b.data(), b.size());
    const LlamaModel fm = load_gguf_from_memory(b.data(), b.size(), "twin", depthkv::llama::GgufLoadOptions{true});
    REQUIRE(qm.layers[0].w1_quant.type == static_cast<depthkv::llama::GgmlType>(type));
    REQUIRE(qm.layers[0].w1.size() == 0);
    REQUIRE(qm.classifier_quant.data == qm.token_embedding_quant.data);
    REQUIRE(fm.layers[0].w1_quant.empty());
    check_synth(qm, s);
    const depthkv::llama::LlamaEngine qe(qm), fe(fm);
    const std::vector<int> tokens = test_tokens(20, s.vocab, 4);
    const std::vector<int> prompt(tokens.begin(), tokens.begin() + 12);
    auto qc = qe.make_cache(), fc = fe.make_cache();
    RowMatrix ql = qe.prefill(prompt, 0, qc), fl = fe.prefill(prompt, 0, fc);  // quant_matmul
    REQUIRE(ql.allFinite());
    const float scale = fl.cwiseAbs().maxCoeff();
    CAPTURE(scale);
    CHECK(scale > 0.1f);
    CHECK(max_abs_diff(ql, fl) <= 1e-4f * scale);
    for (int i = 12; i < 20; ++i) {  // quant_matvec
      const Eigen::VectorXf qd = qe.decode(tokens[static_cast<std::size_t>(i)], i, qc);
      const Eigen::VectorXf fd = fe.decode(tokens[static_cast<std::size_t>(i)], i, fc);
      CHECK((qd - fd).cwiseAbs().maxCoeff() <= 1e-4f * scale);
    }
  }
}

TEST_CASE("gguf: perplexity of a Q4_K model and its dequantized F32 twin agree within 1e-3", "[llama][gguf][quant][perplexity]") {
  Synth s = quant_synth(depthkv_test::kTQ4_K);
  const Bytes b = s.writer(5).build();
  const LlamaModel qm = load_gguf_from_memory(b.data(), b.size());
  const LlamaModel fm = load_gguf_from_memory(b.data(), b.size(), "twin", depthkv::llama::GgufLoadOptions{true});
  const depthkv::llama::LlamaEngine qe(qm), fe(fm);
  const std::vector<int> ids = test_tokens(96, s.vocab, 3);
  const depthkv::llama::PerplexityResult q = depthkv::llama::perplexity(qe, ids, 32, 3, /*bos=*/1, 8, 1);
  const depthkv::llama::PerplexityResult f = depthkv::llama::perplexity(fe, ids, 32, 3, /*bos=*/1, 8, 1);
  CAPTURE(q.nll, f.nll);
  REQUIRE(q.n_scored == f.n_scored);
  CHECK(std::isfinite(q.nll));
  CHECK(std::abs(q.nll - f.nll) <= 1e-3 * std::abs(f.nll));
  // each window alone (16 scored tokens) is noisier: the rounding errors partly cancel in the mean
  for (std::size_t w = 0; w < f.window_nll.size(); ++w)
    CHECK(std::abs(q.window_nll[w] - f.window_nll[w]) <= 5e-3 * std::abs(f.window_nll[w]));
}

TEST_CASE("gguf: errors of quantized weights stay clear", "[llama][gguf][quant][corrupt]") {
  Synth s = quant_synth(depthkv_test::kTQ4_K);
  {
    // the last tensor (output.weight, Q4_K) loses its last 100 bytes
    Bytes b = s.writer().build();
    b.resize(b.size() - 100);
    const std::string msg = error_of([&] { load_gguf_from_memory(b.data(), b.size()); });
    CHECK(contains(msg, "output.weight"));
    CHECK(contains(msg, "Q4_K"));
    CHECK(contains(msg, "extends past the end of the file"));
  }
  {
    // a NaN fp16 scale in a block of a quantized matrix: the in-place load still rejects it
    GgufWriter w = s.writer();
    for (auto& t : w.tensors)
      if (t.name == "blk.1.ffn_down.weight") depthkv_test::poke<std::uint16_t>(t.data, 144, 0x7E00);  // block 1's d
    const Bytes b = w.build();
    const std::string msg = error_of([&] { load_gguf_from_memory(b.data(), b.size()); });
    CHECK(contains(msg, "'blk.1.ffn_down.weight' has a non-finite value at element 256"));
  }
  {
    // a quantized matrix of the wrong shape is named by the loader and by the engine's validation
    GgufWriter w = s.writer();
    for (auto& t : w.tensors)
      if (t.name == "blk.0.attn_k.weight") t.dims = {256, 64};
    const Bytes b = w.build();
    CHECK(contains(error_of([&] { load_gguf_from_memory(b.data(), b.size()); }),
                   "'blk.0.attn_k.weight' has shape [256, 64], expected [256, 128]"));
    const Bytes good = s.writer().build();
    LlamaModel m = load_gguf_from_memory(good.data(), good.size());
    m.layers[0].wk_quant.rows = 64;
    CHECK(contains(error_of([&] { depthkv::llama::LlamaEngine e(m); }), "wk of layer 0 (Q4_K) is [64 x 256], expected [128 x 256]"));
    m.layers[0].wk_quant.rows = 128;
    m.layers[0].wk.resize(128, 256);
    CHECK(contains(error_of([&] { depthkv::llama::LlamaEngine e(m); }), "wk of layer 0 has both a float and a quantized form"));
  }
}

TEST_CASE("gguf: a negative token id and token types outside the enum are refused", "[llama][gguf][tokenizer]") {
  auto vocab_err = [](GgufWriter w) {
    const Bytes b = w.build();
    return error_of([&] { depthkv::llama::read_vocabulary(GgufFile::from_memory(b.data(), b.size())); });
  };
  GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_str_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  {  // the uint32 0xFFFFFFFF is llama.cpp's "no token"; types 0 (undefined) .. 6 (byte) are known
    GgufWriter ok = w;
    ok.kv_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
    ok.kv_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 0});
    CHECK(vocab_err(ok) == "<no error>");
  }
  GgufWriter bad = w;
  bad.kv("tokenizer.ggml.bos_token_id", depthkv_test::kI32, std::int32_t{-1});
  CHECK(contains(vocab_err(bad), "tokenizer.ggml.bos_token_id = -1 is not a token id"));
  bad = w;
  bad.kv("tokenizer.ggml.eos_token_id", depthkv_test::kI32, std::int32_t{-7});
  CHECK(contains(vocab_err(bad), "tokenizer.ggml.eos_token_id = -7 is not a token id"));
  bad = w;
  bad.kv_i32_array("tokenizer.ggml.token_type", {1, 1, 7, 1});
  CHECK(contains(vocab_err(bad), "tokenizer.ggml.token_type of token 2 is 7, not a token type"));
  bad = w;
  bad.kv_i32_array("tokenizer.ggml.token_type", {1, -1, 1, 1});
  CHECK(contains(vocab_err(bad), "tokenizer.ggml.token_type of token 1 is -1, not a token type"));
}
