#pragma once
/// @file llama/sampler.hpp
/// @brief `Sampler`: next-token sampling exactly as karpathy/llama2.c `run.c` (greedy argmax at
/// temperature 0; else softmax with temperature, then multinomial or top-p (nucleus) sampling
/// driven by run.c's xorshift random number generator), so that a seed reproduces run.c's text.
///
/// @code
/// depthkv::llama::Sampler sampler(/*vocab_size=*/512, /*temperature=*/1.0f, /*topp=*/0.9f, /*seed=*/42);
/// int next = sampler.sample(logits);   // logits: Eigen::VectorXf [vocab] (taken by value)
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"

namespace depthkv {
namespace llama {

/// llama2.c's sampler. Not thread-safe (it owns the random state).
class Sampler {
 public:
  /// @param vocab_size number of logits per call (>= 1)
  /// @param temperature 0 = greedy; negative values are treated as 0 (as run.c)
  /// @param topp nucleus threshold; values outside [0, 1] become 0.9 (as run.c); <= 0 or >= 1
  ///   samples from the whole distribution
  /// @param seed xorshift state (run.c seeds with time(NULL) when its seed is 0; callers do that)
  /// @throws Error when vocab_size < 1
  Sampler(int vocab_size, float temperature, float topp, unsigned long long seed)
      : vocab_size_(vocab_size),
        temperature_(temperature < 0.0f ? 0.0f : temperature),
        topp_((topp < 0.0f || topp > 1.0f) ? 0.9f : topp),
        state_(seed) {
    DEPTHKV_CHECK(vocab_size >= 1, "vocab_size must be >= 1, got " << vocab_size);
  }

  float temperature() const { return temperature_; }
  float topp() const { return topp_; }

  /// Samples the next token from `logits` (`vocab_size` entries).
  /// @return a token id in `[0, vocab_size)`
  /// @throws Error when the logits have the wrong size
  int sample(Eigen::VectorXf logits) {
    DEPTHKV_CHECK(logits.size() == vocab_size_, logits.size() << " logits for vocabulary " << vocab_size_);
    float* p = logits.data();
    const int n = vocab_size_;
    if (temperature_ == 0.0f) return argmax(p, n);
    for (int q = 0; q < n; ++q) p[q] /= temperature_;
    softmax(p, n);
    const float coin = random_f32();
    if (topp_ <= 0.0f || topp_ >= 1.0f) return sample_mult(p, n, coin);
    return sample_topp(p, n, coin);
  }

  /// run.c's xorshift generator: next 32-bit value.
  unsigned int random_u32() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<unsigned int>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  }
  /// A float in [0, 1).
  float random_f32() { return static_cast<float>(random_u32() >> 8) / 16777216.0f; }

  /// Index of the first largest value.
  static int argmax(const float* p, int n) {
    int best = 0;
    float mx = p[0];
    for (int i = 1; i < n; ++i)
      if (p[i] > mx) {
        best = i;
        mx = p[i];
      }
    return best;
  }
  /// In-place softmax, as run.c.
  static void softmax(float* x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; ++i)
      if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - mx);
      sum += x[i];
    }
    for (int i = 0; i < n; ++i) x[i] /= sum;
  }

 private:
  struct ProbIndex {
    float prob;
    int index;
  };
  static int sample_mult(const float* p, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; ++i) {
      cdf += p[i];
      if (coin < cdf) return i;
    }
    return n - 1;
  }
  int sample_topp(const float* p, int n, float coin) {
    if (n == 1) return 0;
    // Candidates below (1 - topp) / (n - 1) cannot be part of the nucleus (run.c's cut-off).
    const float cutoff = (1.0f - topp_) / static_cast<float>(n - 1);
    probindex_.clear();
    for (int i = 0; i < n; ++i)
      if (p[i] >= cutoff) probindex_.push_back({p[i], i});
    // run.c sorts with qsort (descending probability); glibc's qsort is a stable merge sort.
    std::stable_sort(probindex_.begin(), probindex_.end(),
                     [](const ProbIndex& a, const ProbIndex& b) { return a.prob > b.prob; });
    const int n0 = static_cast<int>(probindex_.size());
    if (n0 == 0) return argmax(p, n);  // (run.c reads out of bounds here; only near-uniform p with a tiny topp)
    float cumulative = 0.0f;
    int last = n0 - 1;
    for (int i = 0; i < n0; ++i) {
      cumulative += probindex_[static_cast<std::size_t>(i)].prob;
      if (cumulative > topp_) {
        last = i;
        break;
      }
    }
    const float r = coin * cumulative;
    float cdf = 0.0f;
    for (int i = 0; i <= last; ++i) {
      cdf += probindex_[static_cast<std::size_t>(i)].prob;
      if (r < cdf) return probindex_[static_cast<std::size_t>(i)].index;
    }
    return probindex_[static_cast<std::size_t>(last)].index;
  }

  int vocab_size_;
  float temperature_;
  float topp_;
  unsigned long long state_;
  std::vector<ProbIndex> probindex_;
};

}  // namespace llama
}  // namespace depthkv
