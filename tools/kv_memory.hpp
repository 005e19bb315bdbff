#pragma once
// The physical KV memory of per-layer budgets, against what other caches hold for the same
// sequence: every layer at full length (an engine that ignores sliding windows), a full cache
// whose local layers hold only their window (a sliding-window cache, as HF's and depthkv's), and
// a uniform keep ratio applied to every layer at full length (kvpress's presses on a naive
// engine). Used by `depthkv allocate` and `depthkv eval`.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace depthkv_cli {

struct KvMemory {
  long long bytes_per_token = 0;    // one token of one layer: K and V of every KV head (0: shape unknown)
  std::vector<long long> layer;     // tokens per layer of these budgets
  long long kept = 0;               // their sum
  long long full_naive = 0;         // every layer at `length`
  long long full_windowed = 0;      // local layers at min(length, window - 1), others at `length`
  long long uniform_naive = 0;      // round(keep x length) on every layer
};

/// @param budgets tokens kept per layer
/// @param length the sequence length every layer has seen
/// @param window per layer 0 or the sliding window (empty: no local layers)
/// @param kv_heads, head_dim the model's KV shape (0: bytes unknown); elements of `elem_bytes` (F16: 2)
inline KvMemory kv_memory(const std::vector<int>& budgets, int length, const std::vector<int>& window, double keep,
                          int kv_heads, int head_dim, int elem_bytes = 2) {
  KvMemory m;
  m.bytes_per_token = 2LL * kv_heads * head_dim * elem_bytes;
  for (std::size_t l = 0; l < budgets.size(); ++l) {
    const int w = l < window.size() ? window[l] : 0;
    m.layer.push_back(budgets[l]);
    m.kept += budgets[l];
    m.full_naive += length;
    m.full_windowed += w > 0 ? std::min(length, w - 1) : length;
    m.uniform_naive += static_cast<long long>(keep * length + 0.5);
  }
  return m;
}

inline std::string mib_or_tokens(long long tokens, long long bytes_per_token) {
  char buf[64];
  if (bytes_per_token > 0)
    std::snprintf(buf, sizeof buf, "%lld tokens, %.2f MiB", tokens, static_cast<double>(tokens * bytes_per_token) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%lld tokens", tokens);
  return buf;
}

/// Prints the comparison (F16 K and V).
inline void print_kv_memory(const KvMemory& m, double keep, int length) {
  const auto pct = [&](long long x, long long of) { return of > 0 ? 100.0 * static_cast<double>(x) / static_cast<double>(of) : 0.0; };
  std::printf("KV memory (F16 keys and values%s):\n",
              m.bytes_per_token > 0 ? (", " + std::to_string(m.bytes_per_token) + " bytes per token per layer").c_str() : "");
  std::printf("  these budgets:                                  %s\n", mib_or_tokens(m.kept, m.bytes_per_token).c_str());
  std::printf("  full, every layer at %d tokens (naive engine):  %s (these budgets: %.1f%%)\n", length,
              mib_or_tokens(m.full_naive, m.bytes_per_token).c_str(), pct(m.kept, m.full_naive));
  if (m.full_windowed != m.full_naive)
    std::printf("  full, local layers at their window (sliding-window cache): %s (these budgets: %.1f%%)\n",
                mib_or_tokens(m.full_windowed, m.bytes_per_token).c_str(), pct(m.kept, m.full_windowed));
  std::printf("  keep %.3f on every layer at full length (naive engine): %s\n", keep,
              mib_or_tokens(m.uniform_naive, m.bytes_per_token).c_str());
}

inline nlohmann::json kv_memory_json(const KvMemory& m) {
  return {{"bytes_per_token", m.bytes_per_token}, {"tokens_per_layer", m.layer},    {"tokens", m.kept},
          {"full_naive_tokens", m.full_naive},     {"full_windowed_tokens", m.full_windowed},
          {"uniform_naive_tokens", m.uniform_naive}};
}

}  // namespace depthkv_cli
