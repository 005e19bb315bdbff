// Dequantization of every ggml type against the gguf Python package (gguf.quants.dequantize):
// the vectors under tests/data/quants/ were written by make_quant_vectors.py there.
#include "depthkv/llama/quant/dequantize.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

using depthkv::llama::GgmlType;

namespace {

std::vector<std::uint8_t> read_bytes(const std::string& name) {
  const std::string path = std::string(DEPTHKV_TEST_SOURCE_DIR) + "/data/quants/" + name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Case {
  GgmlType type;
  const char* file;
};
const Case kCases[] = {
    {GgmlType::kF32, "f32"},   {GgmlType::kF16, "f16"},   {GgmlType::kBF16, "bf16"},     {GgmlType::kQ4_0, "q4_0"},
    {GgmlType::kQ4_1, "q4_1"}, {GgmlType::kQ5_0, "q5_0"}, {GgmlType::kQ5_1, "q5_1"},     {GgmlType::kQ8_0, "q8_0"},
    {GgmlType::kQ2_K, "q2_k"}, {GgmlType::kQ3_K, "q3_k"}, {GgmlType::kQ4_K, "q4_k"},     {GgmlType::kQ5_K, "q5_k"},
    {GgmlType::kQ6_K, "q6_k"}, {GgmlType::kIQ4_NL, "iq4_nl"}, {GgmlType::kIQ4_XS, "iq4_xs"},
};

}  // namespace

TEST_CASE("dequantize_row is bit-exact with gguf.quants.dequantize for every type", "[llama][quant]") {
  for (const Case& c : kCases) {
    INFO("type " << depthkv::llama::ggml_type_name(c.type));
    const std::vector<std::uint8_t> blocks = read_bytes(std::string(c.file) + ".blocks");
    const std::vector<std::uint8_t> f32 = read_bytes(std::string(c.file) + ".f32");
    REQUIRE(f32.size() % 4 == 0);
    const std::int64_t n = static_cast<std::int64_t>(f32.size() / 4);
    std::vector<float> expected(static_cast<std::size_t>(n));
    std::memcpy(expected.data(), f32.data(), f32.size());
    REQUIRE(depthkv::llama::ggml_row_bytes(c.type, n) == blocks.size());
    std::vector<float> got(static_cast<std::size_t>(n), -1.0f);
    depthkv::llama::dequantize_row(c.type, blocks.data(), got.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("value " << i);
      std::uint32_t a, b;
      std::memcpy(&a, &got[static_cast<std::size_t>(i)], 4);
      std::memcpy(&b, &expected[static_cast<std::size_t>(i)], 4);
      REQUIRE(a == b);  // bits: -0.0f is not 0.0f
    }
    // An odd start address (blocks in a file are not aligned for their fields).
    std::vector<std::uint8_t> shifted(blocks.size() + 1);
    std::memcpy(shifted.data() + 1, blocks.data(), blocks.size());
    std::vector<float> got2(static_cast<std::size_t>(n));
    depthkv::llama::dequantize_row(c.type, shifted.data() + 1, got2.data(), n);
    CHECK(got2 == got);
    // Zero values: nothing written, nothing read.
    depthkv::llama::dequantize_row(c.type, nullptr, nullptr, 0);
  }
}

TEST_CASE("dequantize_row rejects other types and partial blocks", "[llama][quant]") {
  std::vector<std::uint8_t> src(1024);
  std::vector<float> dst(512);
  CHECK_THROWS_WITH(depthkv::llama::dequantize_row(GgmlType::kIQ2_XXS, src.data(), dst.data(), 256),
                    Catch::Contains("IQ2_XXS") && Catch::Contains("not supported"));
  CHECK_THROWS_WITH(depthkv::llama::dequantize_row(GgmlType::kQ4_K, src.data(), dst.data(), 100),
                    Catch::Contains("Q4_K") && Catch::Contains("256"));
  CHECK_THROWS_WITH(depthkv::llama::dequantize_row(static_cast<GgmlType>(99), src.data(), dst.data(), 32),
                    Catch::Contains("type 99"));
  CHECK(depthkv::llama::ggml_type_dequantizable(12));
  CHECK_FALSE(depthkv::llama::ggml_type_dequantizable(9));  // Q8_1: an activation type, never stored in files
}
