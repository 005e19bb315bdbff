#pragma once
// Score rows for the selection tests: random rows and rows built to break a selection (ties,
// constant rows, signed zeros, sorted rows, +/-inf, denormals, values differing in their lowest
// bits, wide exponent ranges, arbitrary bit patterns). Never NaN.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace depthkv_test {

/// Number of kinds of adversarial_score / adversarial_scores: kinds 0 .. kScoreKinds - 1.
constexpr int kScoreKinds = 14;

/// Score of slot i of a row of n under `kind` (kinds wrap modulo kScoreKinds):
///  0 uniform [0, 1);  1 few values {0, 1, 2, 3} (many ties);  2 constant 0.5;
///  3 +0 / -0 only;  4 ascending i;  5 descending n - i;
///  6 drawn from {+/-inf, +/-denorm_min, 2 denorm_min, +/-0, +/-1, 1e-38};
///  7 +inf, -inf, 0 repeating;  8 signed multiples of denorm_min (0..6) and +/-0;
///  9 1 + (i mod 5) ulp (differ in the lowest mantissa bits);  10 uniform (-5e5, 5e5);
///  11 uniform [0, 1) scaled by 2^-(i mod 40);  12 +/-2^((i mod 60) - 30);
///  13 arbitrary 32-bit patterns, NaN patterns excluded (+/-inf and denormals included).
template <class Rng>
float adversarial_score(int kind, int i, int n, Rng& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float den = std::numeric_limits<float>::denorm_min();
  switch (((kind % kScoreKinds) + kScoreKinds) % kScoreKinds) {
    case 0: return u(rng);
    case 1: return static_cast<float>(std::uniform_int_distribution<int>(0, 3)(rng));
    case 2: return 0.5f;
    case 3: return (i % 2) ? 0.0f : -0.0f;
    case 4: return static_cast<float>(i);
    case 5: return static_cast<float>(n - i);
    case 6: {
      const float pool[] = {inf, -inf, den, -den, 2 * den, 0.0f, -0.0f, 1.0f, -1.0f, 1e-38f};
      return pool[std::uniform_int_distribution<int>(0, 9)(rng)];
    }
    case 7: return (i % 3 == 0) ? inf : (i % 3 == 1 ? -inf : 0.0f);
    case 8: return den * static_cast<float>(i % 7) * (i % 2 ? 1.0f : -1.0f);
    case 9: return 1.0f + std::ldexp(static_cast<float>(i % 5), -23);
    case 10: return (u(rng) - 0.5f) * 1e6f;
    case 11: return std::ldexp(u(rng), -(i % 40));
    case 12: return std::ldexp(1.0f, (i % 60) - 30) * (u(rng) < 0.5f ? -1.0f : 1.0f);
    default: {
      std::uint32_t bits = static_cast<std::uint32_t>(std::uniform_int_distribution<std::uint32_t>()(rng));
      if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0u) bits &= 0xff800000u;  // NaN -> inf
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
  }
}

/// A row of n scores of one kind (see adversarial_score).
template <class Rng>
std::vector<float> adversarial_scores(int n, int kind, Rng& rng) {
  std::vector<float> s(static_cast<std::size_t>(n > 0 ? n : 0));
  for (int i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = adversarial_score(kind, i, n, rng);
  return s;
}

}  // namespace depthkv_test
