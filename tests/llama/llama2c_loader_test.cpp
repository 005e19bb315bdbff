#include "depthkv/llama/llama2c_loader.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "llama/file_util.hpp"
#include "support/test_data.hpp"

using depthkv::Error;
using depthkv::llama::LlamaModel;
using depthkv::llama::load_llama2c;
using depthkv::llama::load_llama2c_from_memory;
using depthkv_test::Bytes;

namespace {

struct Header {
  std::int32_t dim, hidden, layers, heads, kv_heads, vocab, seq;
};

// A synthetic llama2.c checkpoint: float number k of the weight section has the value
// (k % 9973) * 0.001 - 4, so every tensor's position in the file can be checked.
Bytes synthetic_checkpoint(const Header& h) {
  Bytes b;
  for (std::int32_t v : {h.dim, h.hidden, h.layers, h.heads, h.kv_heads, h.vocab, h.seq}) depthkv_test::put(b, v);
  const std::int64_t hs = h.dim / h.heads, kv = hs * h.kv_heads, V = std::abs(h.vocab), L = h.layers;
  std::int64_t n = V * h.dim + L * h.dim + L * h.dim * h.dim + 2 * L * kv * h.dim + L * h.dim * h.dim + L * h.dim +
                   3 * L * h.hidden * h.dim + h.dim + 2 * h.seq * (hs / 2) + (h.vocab < 0 ? V * h.dim : 0);
  for (std::int64_t k = 0; k < n; ++k) depthkv_test::put(b, static_cast<float>(k % 9973) * 0.001f - 4.0f);
  return b;
}

float synthetic_value(std::int64_t k) { return static_cast<float>(k % 9973) * 0.001f - 4.0f; }

// Independent float reader of a real checkpoint: float number k after the 28-byte header.
float file_float(const Bytes& b, std::int64_t k) { return depthkv_test::peek<float>(b, 28 + static_cast<std::size_t>(k) * 4); }

void check_rejects(const Bytes& b, const std::string& what) {
  INFO(what);
  REQUIRE_THROWS_AS(load_llama2c_from_memory(b.data(), b.size(), what), Error);
}

}  // namespace

TEST_CASE("llama2c: stories260K loads with the documented shapes and values", "[llama][llama2c]") {
  const std::string path = depthkv_test::data_path("models/stories260K/stories260K.bin");
  const LlamaModel m = load_llama2c(path);
  const auto& c = m.config;
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.seq_len == 512);
  CHECK(c.head_dim == 8);
  CHECK(c.rope_theta == 10000.0f);
  CHECK(c.rms_eps == 1e-5f);
  CHECK_FALSE(c.rope_neox);
  CHECK(c.architecture == "llama");
  CHECK(m.source_path == path);
  CHECK(m.file_size == 1056540u);
  REQUIRE(m.layers.size() == 5);
  CHECK(m.token_embedding.rows() == 512);
  CHECK(m.token_embedding.cols() == 64);
  CHECK(m.classifier == m.token_embedding);  // shared classifier (positive vocab size)
  CHECK(m.final_norm.size() == 64);
  CHECK(m.rope_freq_factors.size() == 0);
  for (const auto& l : m.layers) {
    CHECK(l.wq.rows() == 64);
    CHECK(l.wq.cols() == 64);
    CHECK(l.wk.rows() == 32);
    CHECK(l.wv.rows() == 32);
    CHECK(l.wo.cols() == 64);
    CHECK(l.w1.rows() == 172);
    CHECK(l.w2.rows() == 64);
    CHECK(l.w2.cols() == 172);
    CHECK(l.w3.rows() == 172);
    CHECK(l.bq.size() == 0);
  }

  // Spot checks against an independent reading of the file at the documented offsets.
  const Bytes raw = depthkv_test::read_bytes(path);
  const std::int64_t D = 64, H = 172, L = 5, KV = 32, V = 512;
  std::int64_t off = 0;
  CHECK(m.token_embedding(0, 0) == file_float(raw, off));
  CHECK(m.token_embedding(511, 63) == file_float(raw, off + V * D - 1));
  CHECK(m.token_embedding(37, 5) == file_float(raw, off + 37 * D + 5));
  off += V * D;
  CHECK(m.layers[2].attn_norm(7) == file_float(raw, off + 2 * D + 7));
  off += L * D;
  CHECK(m.layers[1].wq(3, 60) == file_float(raw, off + 1 * D * D + 3 * D + 60));
  off += L * D * D;
  CHECK(m.layers[4].wk(31, 63) == file_float(raw, off + 4 * KV * D + 31 * D + 63));
  off += L * KV * D;
  CHECK(m.layers[0].wv(10, 2) == file_float(raw, off + 10 * D + 2));
  off += L * KV * D;
  CHECK(m.layers[3].wo(63, 0) == file_float(raw, off + 3 * D * D + 63 * D));
  off += L * D * D;
  CHECK(m.layers[4].ffn_norm(63) == file_float(raw, off + 4 * D + 63));
  off += L * D;
  CHECK(m.layers[2].w1(171, 1) == file_float(raw, off + 2 * H * D + 171 * D + 1));
  off += L * H * D;
  CHECK(m.layers[2].w2(1, 171) == file_float(raw, off + 2 * D * H + 1 * H + 171));
  off += L * D * H;
  CHECK(m.layers[4].w3(100, 50) == file_float(raw, off + 4 * H * D + 100 * D + 50));
  off += L * H * D;
  CHECK(m.final_norm(0) == file_float(raw, off));
  CHECK(m.final_norm(63) == file_float(raw, off + 63));

  // The in-memory entry point gives the same model and identity.
  const LlamaModel m2 = load_llama2c_from_memory(raw.data(), raw.size(), path);
  CHECK(m2.header_hash == m.header_hash);
  CHECK(m2.token_embedding == m.token_embedding);
  CHECK(m2.layers[4].w2 == m.layers[4].w2);
  CHECK(m.header_hash != 0);
}

TEST_CASE("llama2c: aidreams260K loads (4 layers, MHA, seq_len 128)", "[llama][llama2c]") {
  const LlamaModel m = load_llama2c(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  CHECK(m.config.dim == 64);
  CHECK(m.config.hidden_dim == 172);
  CHECK(m.config.n_layers == 4);
  CHECK(m.config.n_heads == 4);
  CHECK(m.config.n_kv_heads == 4);
  CHECK(m.config.vocab_size == 512);
  CHECK(m.config.seq_len == 128);
  CHECK(m.config.head_dim == 16);
  CHECK(m.layers.size() == 4);
  CHECK(m.layers[0].wk.rows() == 64);
  CHECK(m.classifier == m.token_embedding);
  const LlamaModel s = load_llama2c(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  CHECK(m.header_hash != s.header_hash);
}

TEST_CASE("llama2c: synthetic checkpoint with a separate classifier puts every tensor in place",
          "[llama][llama2c]") {
  const Header h{16, 24, 3, 4, 2, -40, 10};
  const Bytes b = synthetic_checkpoint(h);
  const LlamaModel m = load_llama2c_from_memory(b.data(), b.size());
  const std::int64_t D = 16, H = 24, L = 3, KV = 8, V = 40, S = 10, HS = 4;
  CHECK(m.config.vocab_size == 40);
  CHECK(m.config.n_kv_heads == 2);
  CHECK(m.config.head_dim == 4);
  CHECK(m.source_path == "<memory>");
  std::int64_t off = 0;
  CHECK(m.token_embedding(39, 15) == synthetic_value(off + V * D - 1));
  off += V * D;
  CHECK(m.layers[2].attn_norm(0) == synthetic_value(off + 2 * D));
  off += L * D;
  CHECK(m.layers[1].wq(15, 15) == synthetic_value(off + D * D + 15 * D + 15));
  off += L * D * D;
  CHECK(m.layers[2].wk(7, 3) == synthetic_value(off + 2 * KV * D + 7 * D + 3));
  off += L * KV * D;
  CHECK(m.layers[1].wv(0, 0) == synthetic_value(off + KV * D));
  off += L * KV * D;
  CHECK(m.layers[0].wo(2, 9) == synthetic_value(off + 2 * D + 9));
  off += L * D * D;
  CHECK(m.layers[1].ffn_norm(1) == synthetic_value(off + D + 1));
  off += L * D;
  CHECK(m.layers[1].w1(23, 15) == synthetic_value(off + H * D + 23 * D + 15));
  off += L * H * D;
  CHECK(m.layers[2].w2(15, 23) == synthetic_value(off + 2 * D * H + 15 * H + 23));
  off += L * D * H;
  CHECK(m.layers[0].w3(5, 6) == synthetic_value(off + 5 * D + 6));
  off += L * H * D;
  CHECK(m.final_norm(15) == synthetic_value(off + 15));
  off += D + 2 * S * (HS / 2);
  CHECK(m.classifier(0, 0) == synthetic_value(off));
  CHECK(m.classifier(39, 15) == synthetic_value(off + V * D - 1));
  CHECK(m.classifier != m.token_embedding);
}

TEST_CASE("llama2c: truncated and padded files are rejected", "[llama][llama2c][corrupt]") {
  const Bytes full = depthkv_test::read_bytes(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  std::vector<std::size_t> cuts = {0, 1, 4, 27, 28, 29, 32, 4096, full.size() / 3, full.size() / 2,
                                   full.size() - 8193, full.size() - 4, full.size() - 1};
  for (std::size_t k = 1; k < 64; ++k) cuts.push_back(k * full.size() / 64 + (k % 7));
  for (std::size_t cut : cuts) {
    const Bytes b(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
    check_rejects(b, "cut at " + std::to_string(cut));
  }
  Bytes padded = full;
  padded.push_back(0);
  check_rejects(padded, "one trailing byte");

  // Through the file API too, from a private temporary folder.
  depthkv_test::TempDir dir;
  const std::string p = dir.write("truncated.bin", Bytes(full.begin(), full.begin() + 100000));
  try {
    load_llama2c(p);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("truncated") != std::string::npos);
    CHECK(msg.find(p) != std::string::npos);
  }
  CHECK_THROWS_AS(load_llama2c(dir.path() + "/does_not_exist.bin"), Error);
  CHECK_THROWS_AS(load_llama2c(dir.path()), Error);  // a directory
  CHECK_THROWS_AS(load_llama2c(dir.write("empty.bin", {})), Error);
}

TEST_CASE("llama2c: absurd or inconsistent header fields are rejected", "[llama][llama2c][corrupt]") {
  const Bytes full = depthkv_test::read_bytes(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int f = 0; f < 7; ++f) {
    for (std::int32_t v : {0, -1, 1, 3, 7, 1000, 1 << 20, std::numeric_limits<std::int32_t>::max(),
                           std::numeric_limits<std::int32_t>::min()}) {
      const std::int32_t orig = depthkv_test::peek<std::int32_t>(full, 4 * f);
      if (v == orig) continue;
      Bytes b = full;
      depthkv_test::poke(b, 4 * f, v);
      check_rejects(b, std::string(names[f]) + " = " + std::to_string(v));
    }
  }
  // The message of an out-of-range field names it.
  Bytes b = full;
  depthkv_test::poke<std::int32_t>(b, 8, 1 << 30);
  try {
    load_llama2c_from_memory(b.data(), b.size(), "x.bin");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("n_layers") != std::string::npos);
  }
  // Consistent byte sizes, inconsistent shapes.
  check_rejects(synthetic_checkpoint({18, 8, 1, 4, 2, 8, 4}), "dim not divisible by n_heads");
  check_rejects(synthetic_checkpoint({16, 8, 1, 4, 3, 8, 4}), "n_heads not a multiple of n_kv_heads");
  check_rejects(synthetic_checkpoint({12, 8, 1, 4, 4, 8, 4}), "odd head size");
  check_rejects(synthetic_checkpoint({16, 8, 1, 2, 4, 8, 4}), "n_kv_heads > n_heads");
  CHECK_NOTHROW(load_llama2c_from_memory(synthetic_checkpoint({16, 8, 1, 4, 2, 8, 4}).data(),
                                         synthetic_checkpoint({16, 8, 1, 4, 2, 8, 4}).size()));
}

TEST_CASE("llama2c: non-finite weights are rejected with the tensor name", "[llama][llama2c][corrupt]") {
  Bytes b = synthetic_checkpoint({16, 8, 2, 4, 2, 8, 4});
  const std::size_t wv1 = 28 + 4 * static_cast<std::size_t>(8 * 16 + 2 * 16 + 2 * 256 + 2 * 8 * 16 + 8 * 16 + 5);
  depthkv_test::poke(b, wv1, std::numeric_limits<float>::quiet_NaN());
  try {
    load_llama2c_from_memory(b.data(), b.size());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("wv[1]") != std::string::npos);
  }
  Bytes c = synthetic_checkpoint({16, 8, 2, 4, 2, 8, 4});
  depthkv_test::poke(c, 28, std::numeric_limits<float>::infinity());
  CHECK_THROWS_AS(load_llama2c_from_memory(c.data(), c.size()), Error);
}
