#include "depthkv/kv_cache.hpp"

#include <catch2/catch.hpp>

TEST_CASE("HostLayer append and bytes", "[kv_cache]") {
  depthkv::HostLayer<float> L(2, 4);
  const float k[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  L.append(k, k, 0);
  REQUIRE(L.size(0) == 1);
  REQUIRE(L.bytes() == 2 * 4 * 2 * sizeof(float));
}
