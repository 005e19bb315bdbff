// Both selection paths of detail/radix_select.hpp (histogram select and nth_element) give exactly
// the naive full-sort kept set at every length, on random and adversarial keys, for float and
// 16-bit keys; and the compaction helper of detail/compact_runs.hpp matches a per-token copy.
#include "depthkv/detail/radix_select.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "depthkv/detail/compact_runs.hpp"
#include "support/adversarial_scores.hpp"
#include "support/selection_reference.hpp"
#include "support/simd_guard.hpp"

namespace rd = depthkv::detail;
using I32 = std::int32_t;

namespace {

// The m best of [lo, hi) by (value desc, position asc, slot asc), ascending
// (support/selection_reference.hpp).
std::vector<I32> naive(const std::vector<float>& v, const I32* pos, int lo, int hi, int m) {
  return depthkv_test::naive_best(v.data(), pos, lo, hi, m);
}

using depthkv_test::adversarial_scores;

using depthkv_test::available_simd_levels;

}  // namespace

TEST_CASE("radix and nth_element selection equal the naive kept set (float keys)", "[evict][select]") {
  std::mt19937 rng(31337);
  for (int n : {1, 2, 3, 10, 100, 767, 768, 2047, 2048, 2049, 10000, 70000}) {
    for (int kind = 0; kind < depthkv_test::kScoreKinds; ++kind) {
      const std::vector<float> v = adversarial_scores(n, kind, rng);
      std::vector<I32> shuffled(static_cast<std::size_t>(n));
      std::iota(shuffled.begin(), shuffled.end(), 0);
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      for (const I32* pos : {static_cast<const I32*>(nullptr), static_cast<const I32*>(shuffled.data())}) {
        const int lo = n > 10 ? 3 : 0, hi = n > 10 ? n - 2 : n;
        for (int m : {0, 1, 2, (hi - lo) / 10, (hi - lo) / 2, hi - lo - 1, hi - lo, hi - lo + 1}) {
          INFO("n " << n << " kind " << kind << " m " << m << " shuffled positions " << (pos != nullptr));
          const auto want = naive(v, pos, lo, hi, m);
          rd::SelectWorkspace ws;
          std::vector<I32> nth{-5};  // appended after existing content
          rd::select_best_nth(rd::FloatKeys{v.data()}, pos, lo, hi, m, ws, nth);
          REQUIRE(nth.front() == -5);
          REQUIRE(std::vector<I32>(nth.begin() + 1, nth.end()) == want);
          for (int level : available_simd_levels()) {  // every float pass: scalar, SSE2, AVX2
            ws.simd_level = level;
            INFO("simd level " << level);
            std::vector<I32> radix{-5}, hist{-5};
            rd::select_best_radix(rd::FloatKeys{v.data()}, pos, lo, hi, m, ws, radix);
            rd::select_best_histogram(rd::FloatKeys{v.data()}, pos, lo, hi, m, ws, hist);
            REQUIRE(radix.front() == -5);
            REQUIRE(hist.front() == -5);
            REQUIRE(std::vector<I32>(radix.begin() + 1, radix.end()) == want);
            REQUIRE(std::vector<I32>(hist.begin() + 1, hist.end()) == want);
          }
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("radix selection on 16-bit keys equals the naive kept set", "[evict][select]", Eigen::half,
                   Eigen::bfloat16) {
  std::mt19937 rng(4);
  for (int n : {1, 5, 800, 5000, 40000}) {
    for (int kind = 0; kind < depthkv_test::kScoreKinds; ++kind) {
      const std::vector<float> f = adversarial_scores(n, kind, rng);
      std::vector<std::uint16_t> bits(f.size());
      std::vector<float> v(f.size());  // the 16-bit values, as floats, for the reference
      for (std::size_t i = 0; i < f.size(); ++i) {
        const TestType t = static_cast<TestType>(f[i]);
        std::memcpy(&bits[i], &t, 2);
        v[i] = static_cast<float>(t);
      }
      for (int m : {0, 1, n / 10, n / 2, n - 1, n}) {
        INFO("n " << n << " kind " << kind << " m " << m);
        rd::SelectWorkspace ws;
        std::vector<I32> radix, hist;
        rd::select_best_radix(rd::Bits16Keys{bits.data()}, nullptr, 0, n, m, ws, radix);
        rd::select_best_histogram(rd::Bits16Keys{bits.data()}, nullptr, 0, n, m, ws, hist);
        const auto want = naive(v, nullptr, 0, n, m);
        REQUIRE(radix == want);
        REQUIRE(hist == want);
      }
    }
  }
}

TEMPLATE_TEST_CASE("compact_runs moves kept tokens like a per-token copy", "[evict][compact]", float,
                   Eigen::half) {
  std::mt19937 rng(12);
  constexpr std::size_t kAlignPad = 64 / sizeof(TestType);
  for (int n : {0, 1, 50, 3000}) {
    for (int hd : {1, 4, 8, 16, 24, 32, 64}) {
      for (std::ptrdiff_t pad : {0, 3, 16}) {
        const std::ptrdiff_t stride = hd + pad;
        // `offset` 0: a 64-byte aligned head (the streaming path can run), 1: misaligned (memmove).
        std::vector<TestType> buf(static_cast<std::size_t>(n * stride + 1) + 2 * kAlignPad);
        for (std::size_t i = 0; i < buf.size(); ++i)
          buf[i] = static_cast<TestType>(static_cast<float>(i % 2000));
        const std::size_t aligned =
            (64 - reinterpret_cast<std::uintptr_t>(buf.data()) % 64) % 64 / sizeof(TestType);
        std::vector<I32> pos(static_cast<std::size_t>(n));
        std::iota(pos.begin(), pos.end(), 100);
        for (double keep : {0.0, 0.1, 0.5, 0.9, 1.0}) {
          std::vector<I32> kept;
          std::bernoulli_distribution b(keep);
          for (int i = 0; i < n; ++i)
            if (b(rng)) kept.push_back(i);
          for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            const std::size_t at = aligned + offset;
            std::vector<TestType> want = buf;
            std::vector<I32> want_pos = pos;
            for (std::size_t i = 0; i < kept.size(); ++i) {
              for (int d = 0; d < hd; ++d)
                want[at + i * static_cast<std::size_t>(stride) + static_cast<std::size_t>(d)] =
                    want[at + static_cast<std::size_t>(kept[i] * stride + d)];
              want_pos[i] = want_pos[static_cast<std::size_t>(kept[i])];
            }
            // every instruction set, with plain moves and (from 0 bytes on) streaming stores
            for (int level : available_simd_levels()) {
              for (std::size_t from : {std::numeric_limits<std::size_t>::max(), std::size_t{0}}) {
                std::vector<TestType> got = buf;
                std::vector<I32> got_pos = pos;
                rd::compact_runs(got.data() + at, stride, hd, kept.data(), static_cast<int>(kept.size()),
                                 from, level);
                rd::compact_runs(got_pos.data(), 1, 1, kept.data(), static_cast<int>(kept.size()), from, level);
                INFO("n " << n << " hd " << hd << " pad " << pad << " keep " << keep << " offset " << offset
                          << " level " << level << " streaming from " << from);
                REQUIRE(std::memcmp(got.data(), want.data(), sizeof(TestType) * got.size()) ==
                        0);  // padding and the bytes around the head untouched too
                REQUIRE(got_pos == want_pos);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ordered_key_fast equals ordered_key on special and random bit patterns", "[evict][select]") {
  std::mt19937 rng(1);
  const std::uint32_t special[] = {0u,          0x80000000u, 1u,          0x80000001u,
                                   0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                   0x00800000u, 0x80800000u, 0x3F800000u};
  auto f = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  for (std::uint32_t u : special) REQUIRE(rd::ordered_key_fast(f(u)) == rd::ordered_key(f(u)));
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(rng());
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) continue;  // NaN patterns are rejected before selection
    REQUIRE(rd::ordered_key_fast(f(u)) == rd::ordered_key(f(u)));
  }
}

TEST_CASE("a row built to defeat the sample bracket still gives the exact kept set", "[evict][select]") {
  // Every slot the strided sample reads is high, the rest low: the bracket misses and the full
  // histogram select takes over.
  for (int len : {1000, 10000, 50000}) {
    const int s = std::min(len, std::max(256, static_cast<int>(8.0 * std::sqrt(static_cast<double>(len)))));
    std::vector<float> v(static_cast<std::size_t>(len), 0.25f);
    for (int j = 0; j < s; ++j)
      v[static_cast<std::size_t>((static_cast<std::int64_t>(j) * len + len / 2) / s)] = 0.75f;
    for (int i = 0; i < len; i += 7) v[static_cast<std::size_t>(i)] += 0.001f * static_cast<float>(i % 5);
    for (int m : {s / 2, s + 10, len / 2}) {
      INFO("len " << len << " m " << m);
      rd::SelectWorkspace ws;
      std::vector<I32> got;
      rd::select_best_radix(rd::FloatKeys{v.data()}, nullptr, 0, len, m, ws, got);
      REQUIRE(got == naive(v, nullptr, 0, len, m));
    }
  }
}

TEST_CASE("digit_histogram and keep_bucket: counts, the top digit, the chosen bucket in order (in place too)",
          "[evict][select]") {
  std::mt19937 rng(5);
  for (int c : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099}) {
    for (int spread : {2, 16, 256}) {  // few distinct digits (runs of equal digits) to many
      std::vector<std::uint32_t> keys(static_cast<std::size_t>(c));
      std::uniform_int_distribution<std::uint32_t> digit(0, static_cast<std::uint32_t>(spread - 1));
      for (auto& k : keys) k = (static_cast<std::uint32_t>(rng()) & 0xF00000FFu) | (digit(rng) << 8);
      const int s = 8;
      const std::uint32_t mask = 0xFFFFu;  // 16-bit digit: bits 8..23
      std::vector<std::uint32_t> h(mask + 1u);
      const std::uint32_t top =
          c > 0 ? rd::digit_histogram(h.data(), keys.data(), static_cast<std::uint32_t>(c), s, mask) : 0;
      std::vector<std::uint32_t> want_h(mask + 1u, 0u);
      std::uint32_t want_top = 0;
      for (std::uint32_t k : keys) {
        ++want_h[(k >> s) & mask];
        want_top = std::max(want_top, (k >> s) & mask);
      }
      if (c > 0) {
        REQUIRE(h == want_h);
        REQUIRE(top == want_top);
      }
      for (int level : available_simd_levels()) {
        for (std::uint32_t d : {0u, 1u, want_top, 0xABCDu}) {
          INFO("c " << c << " spread " << spread << " digit " << d << " simd level " << level);
          std::vector<std::uint32_t> want;
          for (std::uint32_t k : keys)
            if (((k >> s) & mask) == d) want.push_back(k);
          std::vector<std::uint32_t> out(keys.size() + 1, 7u);
          const std::uint32_t n =
              rd::keep_bucket(out.data(), keys.data(), static_cast<std::uint32_t>(c), s, mask, d, level);
          REQUIRE(std::vector<std::uint32_t>(out.begin(), out.begin() + n) == want);
          REQUIRE(out.back() == 7u);  // nothing written past the c keys' room
          std::vector<std::uint32_t> in_place = keys;
          in_place.push_back(7u);
          const std::uint32_t n2 =
              rd::keep_bucket(in_place.data(), in_place.data(), static_cast<std::uint32_t>(c), s, mask, d, level);
          REQUIRE(std::vector<std::uint32_t>(in_place.begin(), in_place.begin() + n2) == want);
          REQUIRE(in_place.back() == 7u);
        }
      }
    }
  }
}

TEST_CASE("radix_threshold and radix_threshold2 give the keys of the requested ranks", "[evict][select]") {
  std::mt19937 rng(99);
  for (int c : {1, 2, 7, 300, 1448, 5000}) {
    for (int kind = 0; kind < depthkv_test::kScoreKinds; ++kind) {
      const std::vector<float> v = adversarial_scores(c, kind, rng);
      std::vector<std::uint32_t> keys(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) keys[i] = rd::ordered_key(v[i]);
      std::vector<std::uint32_t> sorted = keys;
      std::sort(sorted.begin(), sorted.end(), std::greater<std::uint32_t>());
      rd::SelectWorkspace ws;
      for (int level : available_simd_levels())  // keep_bucket: scalar, and 8 keys at a time with AVX2
        for (int a : {1, 2, c / 3 + 1, c / 2 + 1, c}) {
          for (int b : {a, a + 1, a + 5, c}) {
            if (a > c || b > c || b < a) continue;
            ws.simd_level = level;
            INFO("c " << c << " kind " << kind << " ranks " << a << " " << b << " simd level " << level);
            const auto ua = static_cast<std::uint32_t>(a), ub = static_cast<std::uint32_t>(b);
            const rd::Threshold th = rd::radix_threshold(keys.data(), static_cast<std::uint32_t>(c), ua, ws);
            REQUIRE(th.T == sorted[ua - 1]);
            // t: how many T-keyed keys complete the a best
            const auto above = static_cast<std::uint32_t>(
                std::count_if(keys.begin(), keys.end(), [&](std::uint32_t k) { return k > th.T; }));
            REQUIRE(th.t == ua - above);
            std::uint32_t ka = 0, kb = 0;
            rd::radix_threshold2(keys.data(), static_cast<std::uint32_t>(c), ua, ub, ws, ka, kb);
            REQUIRE(ka == sorted[ua - 1]);
            REQUIRE(kb == sorted[ub - 1]);
          }
        }
    }
  }
}
