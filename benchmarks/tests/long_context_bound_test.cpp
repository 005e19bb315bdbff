// The formulas of long_context_bound.hpp on the Qwen2.5-0.5B shape (24 layers, 14 query heads,
// 2 KV heads of 64), weights of 494e6 parameters in 525e6 bytes (about Q8_0), F16 KV, computed by
// hand in the comments.

#include <catch2/catch.hpp>

#include "../long_context_bound.hpp"

namespace {

depthkv_bench::DecodeShape qwen_shape() { return depthkv_bench::DecodeShape{24, 14, 2, 64, 494e6, 525e6}; }

}  // namespace

TEST_CASE("kv bytes per token of the qwen shape", "[bench][bound]") {
  // 2 (K, V) * 24 layers * 2 KV heads * 64 * 2 bytes
  CHECK(depthkv_bench::kv_bytes_per_token(qwen_shape(), 2) == 12288.0);
  CHECK(depthkv_bench::kv_bytes_per_token(qwen_shape(), 4) == 24576.0);
}

TEST_CASE("decode work of a 16K full cache", "[bench][bound]") {
  const double slots = 24.0 * 2 * 16384;  // 786432
  const depthkv_bench::DecodeWork w = depthkv_bench::decode_work(qwen_shape(), slots, 2);
  CHECK(w.weight_bytes == 525e6);
  CHECK(w.kv_bytes == 201326592.0);           // 2 * 786432 * 64 * 2
  CHECK(w.weight_flops == 988e6);             // 2 * 494e6
  CHECK(w.attention_flops == 1409286144.0);   // 4 * (14 / 2) * 786432 * 64
  CHECK(w.bytes() == 525e6 + 201326592.0);
  CHECK(w.flops() == 988e6 + 1409286144.0);
}

TEST_CASE("bound of keep 0.1 at 16K lies between 1.33x and 2.12x", "[bench][bound]") {
  const double full = 24.0 * 2 * 16384;
  const depthkv_bench::DecodeBound b = depthkv_bench::bound_speedup(depthkv_bench::decode_work(qwen_shape(), full, 2),
                                                                    depthkv_bench::decode_work(qwen_shape(), 0.1 * full, 2));
  // (525e6 + 201326592) / (525e6 + 20132659.2) and (988e6 + 1409286144) / (988e6 + 140928614.4)
  CHECK(b.bytes_only == Approx(1.3323850254).epsilon(1e-9));
  CHECK(b.flops_only == Approx(2.1235055197).epsilon(1e-9));
}

TEST_CASE("bound of the full cache over itself is 1 and an empty cache reads only weights", "[bench][bound]") {
  const depthkv_bench::DecodeWork w = depthkv_bench::decode_work(qwen_shape(), 1000, 4);
  const depthkv_bench::DecodeBound same = depthkv_bench::bound_speedup(w, w);
  CHECK(same.bytes_only == 1.0);
  CHECK(same.flops_only == 1.0);
  const depthkv_bench::DecodeWork none = depthkv_bench::decode_work(qwen_shape(), 0, 4);
  CHECK(none.kv_bytes == 0.0);
  CHECK(none.attention_flops == 0.0);
  CHECK(none.bytes() == 525e6);
}
