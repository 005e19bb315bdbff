#include "depthkv/kv_cache.hpp"

#include <Eigen/Core>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

namespace {

std::vector<float> random_rows(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("HostLayer appends, reads back, reports bytes", "[kv_cache]", float, Eigen::half,
                   Eigen::bfloat16) {
  const int H = 3, D = 5, N = 40;
  depthkv::HostLayer<TestType> L(H, D);
  std::mt19937 rng(7);
  std::vector<std::vector<float>> ks, vs;
  for (int t = 0; t < N; ++t) {
    ks.push_back(random_rows(H * D, rng));
    vs.push_back(random_rows(H * D, rng));
    L.append(ks.back().data(), vs.back().data(), 2 * t + 1);
  }
  REQUIRE(L.capacity() >= N);
  for (int h = 0; h < H; ++h) {
    REQUIRE(L.size(h) == N);
    for (int t = 0; t < N; ++t) {
      REQUIRE(L.positions(h)[t] == 2 * t + 1);
      for (int d = 0; d < D; ++d) {
        const float want_k = static_cast<float>(static_cast<TestType>(ks[t][h * D + d]));
        const float want_v = static_cast<float>(static_cast<TestType>(vs[t][h * D + d]));
        REQUIRE(static_cast<float>(L.key(h, t)[d]) == want_k);
        REQUIRE(static_cast<float>(L.value(h, t)[d]) == want_v);
      }
    }
  }
  REQUIRE(L.bytes() == static_cast<std::size_t>(H) * N * D * 2 * sizeof(TestType));
}

TEST_CASE("HostLayer compacts per head, keeps order and positions, shrinks storage", "[kv_cache]") {
  const int H = 2, D = 4, N = 10;
  depthkv::HostLayer<float> L(H, D, N);
  for (int t = 0; t < N; ++t) {
    std::vector<float> k(H * D), v(H * D);
    for (int i = 0; i < H * D; ++i) {
      k[i] = static_cast<float>(100 * t + i);
      v[i] = -k[i];
    }
    L.append(k.data(), v.data(), t);
  }
  const std::size_t alloc_before = L.bytes_allocated();
  const std::int32_t keep0[] = {0, 3, 9};
  const std::int32_t keep1[] = {5};
  L.compact(0, keep0, 3);
  L.compact(1, keep1, 1);
  REQUIRE(L.size(0) == 3);
  REQUIRE(L.size(1) == 1);
  REQUIRE(L.positions(0)[1] == 3);
  REQUIRE(L.positions(0)[2] == 9);
  REQUIRE(L.positions(1)[0] == 5);
  REQUIRE(L.key(0, 2)[1] == 901.f);
  REQUIRE(L.value(1, 0)[3] == -(500.f + 4 + 3));
  L.shrink_to_fit();
  REQUIRE(L.capacity() == 3);
  REQUIRE(L.bytes_allocated() < alloc_before);
  REQUIRE(L.bytes_allocated() == static_cast<std::size_t>(H) * 3 * D * 2 * sizeof(float));
  REQUIRE(L.key(0, 2)[1] == 901.f);
  REQUIRE(L.positions(1)[0] == 5);
  // Heads of different lengths keep growing independently after eviction.
  const float kv1[D] = {1, 2, 3, 4};
  L.append_head(1, kv1, kv1, 10);
  REQUIRE(L.size(1) == 2);
  REQUIRE(L.size(0) == 3);
}

TEST_CASE("HostLayer rejects bad input without changing", "[kv_cache]") {
  REQUIRE_THROWS_AS(depthkv::HostLayer<float>(0, 4), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::HostLayer<float>(2, 0), depthkv::Error);
  depthkv::HostLayer<float> L(1, 2);
  const float kv[2] = {1, 2};
  L.append(kv, kv, 5);
  REQUIRE_THROWS_AS(L.append(kv, kv, 5), depthkv::Error);  // position must increase
  REQUIRE_THROWS_AS(L.append(kv, kv, -1), depthkv::Error);
  REQUIRE(L.size(0) == 1);
  const std::int32_t bad_order[] = {0, 0};
  REQUIRE_THROWS_AS(L.compact(0, bad_order, 2), depthkv::Error);
  const std::int32_t out_of_range[] = {1};
  REQUIRE_THROWS_AS(L.compact(0, out_of_range, 1), depthkv::Error);
  REQUIRE_THROWS_AS(L.compact(3, out_of_range, 0), depthkv::Error);
  REQUIRE(L.size(0) == 1);
  REQUIRE(L.key(0, 0)[1] == 2.f);
  try {
    L.append(kv, kv, 3);
    FAIL("expected an error");
  } catch (const depthkv::Error& e) {
    REQUIRE(std::string(e.what()).find("position 3") != std::string::npos);
  }
}

TEST_CASE("LayerView works in place over engine memory with strides", "[kv_cache]") {
  // Engine memory: [heads=2][capacity=6][token_stride=8] with head_dim 3 and padding.
  const int H = 2, C = 6, D = 3, TS = 8;
  const std::ptrdiff_t HS = C * TS + 5;
  std::vector<float> kmem(static_cast<std::size_t>(H * HS), -7.f), vmem(kmem.size(), -7.f);
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < D; ++d)
        kmem[h * HS + t * TS + d] = vmem[h * HS + t * TS + d] = 10.f * t + d + 100.f * h;
  depthkv::LayerView<float> view(kmem.data(), vmem.data(), H, D, C, /*length=*/4, HS, TS);
  REQUIRE(view.size(1) == 4);
  REQUIRE(view.positions(1)[3] == 3);
  REQUIRE(view.key(1, 2) == kmem.data() + HS + 2 * TS);
  const std::int32_t keep[] = {1, 3};
  view.compact(1, keep, 2);
  REQUIRE(kmem[HS + 0 * TS + 2] == 112.f);  // slot 0 of head 1 now holds token 1
  REQUIRE(kmem[HS + 1 * TS + 0] == 130.f);
  REQUIRE(kmem[HS + 0 * TS + D] == -7.f);  // padding untouched
  REQUIRE(view.positions(1)[1] == 3);
  REQUIRE(view.bytes() == (4 + 2) * D * 2 * sizeof(float));
  const float kv[H * D] = {1, 2, 3, 4, 5, 6};
  view.append(kv, kv, 4);
  view.append(kv, kv, 5);
  REQUIRE(view.size(0) == 6);
  REQUIRE(view.size(1) == 4);
  REQUIRE_THROWS_AS(view.append(kv, kv, 6), depthkv::Error);  // head 0 is full: nothing appended
  REQUIRE(view.size(1) == 4);
  REQUIRE_THROWS_AS(depthkv::LayerView<float>(kmem.data(), vmem.data(), H, D, C, 7), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::LayerView<float>(kmem.data(), vmem.data(), H, D, C, 0, HS, 2), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::LayerView<float>(nullptr, vmem.data(), H, D, C), depthkv::Error);
}

TEST_CASE("KVCache holds layers of different sizes and sums bytes", "[kv_cache]") {
  depthkv::KVCache<depthkv::HostLayer<Eigen::half>> cache;
  REQUIRE(cache.n_layers() == 0);
  REQUIRE(cache.bytes() == 0);
  for (int l = 0; l < 3; ++l) cache.add_layer(depthkv::HostLayer<Eigen::half>(2, 8));
  std::vector<float> kv(16, 0.5f);
  for (int l = 0; l < 3; ++l)
    for (int t = 0; t < 5 + l; ++t) cache.layer(l).append(kv.data(), kv.data(), t);
  const auto per_layer = cache.bytes_per_layer();
  REQUIRE(per_layer.size() == 3);
  for (int l = 0; l < 3; ++l) REQUIRE(per_layer[l] == static_cast<std::size_t>(5 + l) * 2 * 8 * 2 * 2);
  REQUIRE(cache.bytes() == per_layer[0] + per_layer[1] + per_layer[2]);
  REQUIRE(cache.lengths() == std::vector<int>{5, 6, 7});
  REQUIRE_THROWS_AS(cache.layer(3), depthkv::Error);
  REQUIRE_THROWS_AS(cache.layer(-1), depthkv::Error);
}

TEST_CASE(
    "HostLayer storage is 2 MiB-aligned from 2 MiB on, cache-line aligned below, and holds what is written",
    "[kv_cache]") {
  using depthkv::detail::kLargePageBytes;
  depthkv::detail::LargePageAllocator<float> alloc;
  const std::size_t big = kLargePageBytes / sizeof(float) + 3;  // just over 2 MiB, not a multiple
  float* p = alloc.allocate(big);
  for (std::size_t i = 0; i < big; ++i) p[i] = static_cast<float>(i % 1000);
  bool same = true;
  for (std::size_t i = 0; i < big; ++i) same = same && p[i] == static_cast<float>(i % 1000);
  CHECK(same);
#if (defined(__unix__) || defined(__APPLE__)) && !defined(DEPTHKV_NO_LARGE_PAGES)
  CHECK(reinterpret_cast<std::uintptr_t>(p) % kLargePageBytes == 0);
#endif
  alloc.deallocate(p, big);
  for (std::size_t n :
       {std::size_t{1}, std::size_t{16}, std::size_t{1000}}) {  // small blocks: 64-byte aligned
    float* q = alloc.allocate(n);
    CHECK(reinterpret_cast<std::uintptr_t>(q) % depthkv::detail::kCacheLineBytes == 0);
    q[n - 1] = 1.0f;
    alloc.deallocate(q, n);
  }
  depthkv::HostLayer<Eigen::half> small(2, 8, 10);
  CHECK(reinterpret_cast<std::uintptr_t>(small.key(0, 0)) % depthkv::detail::kCacheLineBytes == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(small.value(0, 0)) % depthkv::detail::kCacheLineBytes == 0);

  // a layer whose key block is >= 2 MiB: 8 heads x 128 dims x 1024 slots x 4 bytes = 4 MiB
  depthkv::HostLayer<float> layer(8, 128, 1024);
  std::vector<float> k(8 * 128, 0.5f), v(8 * 128, -0.5f);
  for (int t = 0; t < 1024; ++t) layer.append(k.data(), v.data(), t);
#if (defined(__unix__) || defined(__APPLE__)) && !defined(DEPTHKV_NO_LARGE_PAGES)
  CHECK(reinterpret_cast<std::uintptr_t>(layer.key(0, 0)) % kLargePageBytes == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(layer.value(0, 0)) % kLargePageBytes == 0);
#endif
  CHECK(layer.bytes_allocated() == std::size_t{2} * 8 * 128 * 1024 * sizeof(float));
  CHECK(layer.value(7, 1023)[127] == -0.5f);
}
