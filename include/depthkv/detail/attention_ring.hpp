#pragma once
/// @file detail/attention_ring.hpp
/// @brief `AttentionRing`: the attention rows of the last `capacity` distinct query positions
/// observed by one KV head, ascending by position, each row the sum over the group's query heads
/// (the state of the SnapKV and TOVA rules).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "depthkv/scoring_rule.hpp"

namespace depthkv {
namespace detail {

/// A sorted ring of per-position attention rows of one KV head.
class AttentionRing {
 public:
  /// @param capacity the positions kept (>= 1)
  explicit AttentionRing(int capacity = 1) : capacity_(capacity) {}

  int capacity() const { return capacity_; }
  void clear() { rows_.clear(); }

  /// Adds `row` (n slots) to the row of position `pos`; a position older than every kept one of a
  /// full ring is dropped, a new one evicts the oldest of a full ring.
  void add(std::int32_t pos, const float* row, int n) {
    auto by_pos = [](const Row& r, std::int32_t p) { return r.pos < p; };
    auto it = std::lower_bound(rows_.begin(), rows_.end(), pos, by_pos);
    if (it == rows_.end() || it->pos != pos) {
      std::vector<float> buf;
      if (static_cast<int>(rows_.size()) == capacity_) {
        if (pos < rows_.front().pos) return;  // older than every position kept: never in the window
        buf = std::move(rows_.front().v);
        rows_.erase(rows_.begin());
        it = std::lower_bound(rows_.begin(), rows_.end(), pos, by_pos);
      }
      buf.clear();
      it = rows_.insert(it, Row{pos, std::move(buf)});
    }
    std::vector<float>& v = it->v;
    if (static_cast<int>(v.size()) < n) v.resize(static_cast<std::size_t>(n), 0.0f);
    for (int j = 0; j < n; ++j) v[static_cast<std::size_t>(j)] += row[j];
  }

  /// Adds the kept rows, ascending by position, onto `s` (s[j] += row[j] for j < the row's length).
  void sum_into(std::vector<float>& s) const {
    for (const Row& row : rows_)
      for (std::size_t j = 0; j < row.v.size(); ++j) s[j] += row.v[j];
  }

  /// Keeps the kept slots of every row (`keep_slots`).
  void compact(const std::int32_t* kept, int n_kept) {
    for (Row& row : rows_) keep_slots(row.v, kept, n_kept);
  }

 private:
  struct Row {
    std::int32_t pos;
    std::vector<float> v;  // summed over the group's query heads
  };
  int capacity_;
  std::vector<Row> rows_;  // ascending positions
};

/// Feeds the rows of block `b` to `ring`: only the last `ring.capacity()` rows of a block can be
/// among the last `capacity` positions, so the earlier ones are skipped.
inline void add_block(AttentionRing& ring, const AttentionBlock& b) {
  const int first = std::max(0, b.n_queries - ring.capacity());
  for (int r = first; r < b.n_queries; ++r) ring.add(b.q_pos0 + r, b.row(r), b.n);
}

}  // namespace detail
}  // namespace depthkv
