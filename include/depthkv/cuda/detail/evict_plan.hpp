#pragma once
/// @file cuda/detail/evict_plan.hpp
/// @brief Host-safe logic of the CUDA eviction (no CUDA headers): the row plan (protected
/// ranges and the middle range the radix select works on), radix digit helpers, the
/// threshold/tie rule used to emit kept slots, workspace layout and launch-path choice, and the
/// row table type `EvictRow` with its host-side builder and validation.
///
/// Everything here is compiled by the plain C++ compiler too (`DEPTHKV_HOST_DEVICE` is `inline`
/// off nvcc), so `tests/detail/cuda_host_logic_test.cpp` emulates the kernels' selection on the
/// CPU with exactly these functions and compares it with the CPU evictor.
///
/// ## How a row is evicted (both launch paths)
/// A row holds `n` tokens (slots `0..n-1`, original positions strictly ascending, so slot order
/// is position order). Slots `[0, lo)` (sinks) and `[hi, n)` (recent window) are protected and
/// always kept; the middle `[lo, hi)` keeps `keep_mid = k - protected` tokens, the best by
/// (score desc, position asc). A radix select over order-preserving keys
/// (`depthkv::detail::ordered_key` / `ordered_key16`), most significant 8-bit digit first, finds
/// the threshold key `T` and `need`, the number of middle tokens with key == T that are kept:
/// a middle token is kept iff `key > T`, or `key == T` and fewer than `need` middle tokens with
/// key == T precede it. That is exactly "(score desc, position asc)" with -0.0 == +0.0.
/// The kept tokens are emitted in slot order: the output index of a kept token is
/// `kept_before(slot)` = protected slots before it + `mid_rank(gt_before, eq_before, need)`.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "depthkv/config.hpp"
#include "depthkv/detail/select_common.hpp"
#include "depthkv/error.hpp"

namespace depthkv {
namespace cuda {

/// Bits OR-ed into `EvictParams::status` by the eviction kernels (the CPU path throws instead).
struct EvictStatus {
  static constexpr std::uint32_t kOk = 0u;
  /// A score of some row is NaN (its key still orders deterministically, but the CPU path rejects it).
  static constexpr std::uint32_t kNaNScore = 1u;
  /// Some row has k < 0, or k below its protected count while k < n: only its protected tokens are kept.
  static constexpr std::uint32_t kBadKeep = 2u;
  /// Some row has n < 0 or n > max_n, or null scores where a selection is needed: the row is skipped.
  static constexpr std::uint32_t kBadRow = 4u;
  /// The radix digit search of some row found no bin holding the wanted rank (the histogram summed
  /// to less than the rank: a broken invariant, e.g. scores changed while the kernels ran). That
  /// row keeps its protected tokens only; its middle tokens are not emitted.
  static constexpr std::uint32_t kSelectFailed = 8u;
};

/// One row of a batched eviction: the tokens of one (sequence, layer, KV head).
///
/// Layouts (all device memory, element type `T` for K/V and `ScoreT` for scores):
/// - `scores[i]`, `positions[i]` for slot `i` in `[0, n)`; positions strictly ascending (the
///   Layer invariant), so ties broken by position are ties broken by slot;
/// - source token `i`: `head_dim` contiguous elements at `src_k + i * src_token_stride` (likewise
///   `src_v`);
/// - kept token `j` (`j` in `[0, n_kept)`, `n_kept = min(k, n)`, ascending slot order) is written to
///   `dst_k + j * dst_token_stride` (likewise `dst_v`), `dst_positions[j]` and `kept_slots[j]`.
/// The destination must not overlap the source (out-of-place / ping-pong). Every output pointer
/// may be null (not written): e.g. select-only fills `kept_slots` alone.
struct EvictRow {
  const void* scores = nullptr;             ///< [n] ScoreT scores, slot order
  const std::int32_t* positions = nullptr;  ///< [n] original positions (null: slot index is written)
  const void* src_k = nullptr;              ///< source keys of slot 0
  const void* src_v = nullptr;              ///< source values of slot 0
  void* dst_k = nullptr;                    ///< destination keys of kept token 0 (null: no key gather)
  void* dst_v = nullptr;                    ///< destination values of kept token 0 (null: no value gather)
  std::int32_t* dst_positions = nullptr;    ///< [n_kept] positions of the kept tokens (null: not written)
  std::int32_t* kept_slots = nullptr;       ///< [n_kept] kept source slots, ascending (null: not written)
  std::int64_t src_token_stride = 0;        ///< elements between consecutive source tokens (>= head_dim)
  std::int64_t dst_token_stride = 0;        ///< elements between consecutive destination tokens (>= head_dim)
  std::int32_t n = 0;                       ///< tokens in the row
  std::int32_t k = 0;                       ///< tokens to keep (k >= n keeps all)
};

namespace detail {

// ---- small host/device arithmetic (std::min/max are not device functions) ----------------------
DEPTHKV_HOST_DEVICE int imin(int a, int b) { return a < b ? a : b; }
DEPTHKV_HOST_DEVICE int imax(int a, int b) { return a > b ? a : b; }
DEPTHKV_HOST_DEVICE std::int64_t lmin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
DEPTHKV_HOST_DEVICE std::int64_t lmax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// ---- constants ---------------------------------------------------------------------------------
constexpr int kRadixBits = 8;                    ///< bits per radix digit
constexpr std::uint32_t kRadixBins = 256u;       ///< bins per digit
constexpr int kEvictChunk = 8192;                ///< slots per CTA in the multi-block path
constexpr int kOneBlockMaxN = 16384;             ///< longest row the auto rule sends to one block when rows are many
constexpr std::size_t kOneBlockStaticSmem = 4096;  ///< static shared memory reserve of the one-block kernel
constexpr int kMaxRadixPasses = 4;               ///< 32-bit keys; 16-bit keys use 2
constexpr int kEvictMaxChunksPerRow = 65535;     ///< the multi-block grid's y extent (CUDA: gridDim.y <= 65535)
/// Longest row (and largest `max_n`) a batched eviction accepts: 65535 chunks of kEvictChunk slots
/// = 536,862,720 tokens (the multi-block grid is rows x chunks; the one-block path is far shorter).
constexpr int kEvictMaxN = kEvictMaxChunksPerRow * kEvictChunk;
/// Alignment in bytes the eviction workspace must have (what cudaMalloc returns; the areas inside
/// are laid out at multiples of it).
constexpr std::size_t kEvictWorkspaceAlignment = 256;

// ---- 16-bit score formats ----------------------------------------------------------------------
/// Storage formats of scores. IEEE half and bfloat16 are both sign-magnitude, so
/// `depthkv::detail::ordered_key16` orders them; NaN detection differs.
enum class ScoreFormat : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// Bits of the order-preserving key of a score format (32 for float, 16 otherwise).
DEPTHKV_HOST_DEVICE int key_bits(ScoreFormat f) { return f == ScoreFormat::kF32 ? 32 : 16; }

/// The +infinity bit pattern of a 16-bit format (kF16 or kBF16), for `depthkv::detail::is_nan16`.
DEPTHKV_HOST_DEVICE std::uint16_t inf_bits16(ScoreFormat f) {
  return f == ScoreFormat::kF16 ? depthkv::detail::kHalfInfBits : depthkv::detail::kBFloat16InfBits;
}

// ---- the row plan ------------------------------------------------------------------------------
/// What one row does: slots `[0, lo)` and `[hi, n)` are kept unconditionally; `keep_mid` of the
/// middle `[lo, hi)` are selected. `k >= n` keeps all (lo = hi = n). A bad row has n = 0.
struct RowPlan {
  int n;                 ///< tokens (0 for a skipped bad row)
  int lo;                ///< first middle slot (= kept sinks)
  int hi;                ///< end of the middle; [hi, n) is the kept recent window
  int keep_mid;          ///< middle tokens to keep, in [0, hi - lo)
  int n_kept;            ///< lo + keep_mid + (n - hi)
  bool select;           ///< a radix select is needed (0 < keep_mid < hi - lo)
  std::uint32_t status;  ///< EvictStatus bits for this row
};

/// Plans one row.
/// @param n tokens in the row, @param k tokens to keep, @param n_sink / @param n_recent protection
/// @param max_n the launch's bound on n (rows above it are bad: their buffers were not sized)
/// @param has_scores whether the row's score pointer is non-null
DEPTHKV_HOST_DEVICE RowPlan plan_row(int n, int k, int n_sink, int n_recent, int max_n, bool has_scores) {
  RowPlan p{0, 0, 0, 0, 0, false, EvictStatus::kOk};
  if (n < 0 || n > max_n) {
    p.status = EvictStatus::kBadRow;
    return p;
  }
  p.n = n;
  if (k >= n) {  // keep all: everything is "protected"
    p.lo = n;
    p.hi = n;
    p.n_kept = n;
    return p;
  }
  const int s = imin(imax(n_sink, 0), n);
  const int r = imin(imax(n_recent, 0), n);
  p.lo = s;
  p.hi = imax(n - r, s);
  const int m = p.hi - p.lo;
  const int protected_n = n - m;  // == depthkv::detail::protected_count(n, n_sink, n_recent)
  int keep_mid = k - protected_n;
  if (k < 0 || keep_mid < 0) {
    p.status |= EvictStatus::kBadKeep;
    keep_mid = 0;
  }
  p.keep_mid = keep_mid;  // < m because k < n
  p.select = keep_mid > 0;
  if (p.select && !has_scores) {
    RowPlan bad{0, 0, 0, 0, 0, false, EvictStatus::kBadRow};
    return bad;
  }
  p.n_kept = protected_n + keep_mid;
  return p;
}

// ---- radix digits ------------------------------------------------------------------------------
/// Radix passes for keys of `key_bits` bits (4 for float, 2 for half/bfloat16).
DEPTHKV_HOST_DEVICE int radix_passes(int key_bits_) { return key_bits_ / kRadixBits; }
/// Right shift of the digit of pass `pass` (pass 0 is the most significant digit).
DEPTHKV_HOST_DEVICE int radix_shift(int pass, int key_bits_) { return key_bits_ - kRadixBits * (pass + 1); }
/// The digit of `key` in pass `pass`.
DEPTHKV_HOST_DEVICE std::uint32_t radix_digit(std::uint32_t key, int pass, int key_bits_) {
  return (key >> radix_shift(pass, key_bits_)) & (kRadixBins - 1u);
}
/// Mask of the key bits decided before pass `pass` (the top pass * 8 bits of the key).
DEPTHKV_HOST_DEVICE std::uint32_t radix_decided_mask(int pass, int key_bits_) {
  const std::uint64_t all = (std::uint64_t{1} << key_bits_) - 1u;
  const std::uint64_t low = (std::uint64_t{1} << (key_bits_ - kRadixBits * pass)) - 1u;
  return static_cast<std::uint32_t>(all & ~low);
}
/// True when `key` agrees with the digits decided before pass `pass` (held in `prefix`).
DEPTHKV_HOST_DEVICE bool radix_matches(std::uint32_t key, std::uint32_t prefix, int pass, int key_bits_) {
  return (key & radix_decided_mask(pass, key_bits_)) == prefix;
}

/// The bin holding the `rank`-th largest element (1-based) and its rank inside that bin.
struct DigitChoice {
  std::uint32_t digit;
  std::uint32_t rank;
};

/// Serial digit search: walks the 256 bins from the top and returns the bin where the running
/// count reaches `rank` (1 <= rank <= total), with `rank` minus the count above that bin; {0, 0}
/// (rank 0: no bin) when `rank` is 0 or above the total.
/// The CUDA kernels do the same walk with one warp (8 bins per lane, descending).
DEPTHKV_HOST_DEVICE DigitChoice find_digit(const std::uint32_t* hist, std::uint32_t rank) {
  std::uint32_t above = 0;
  for (int d = static_cast<int>(kRadixBins) - 1; d >= 0; --d) {
    const std::uint32_t c = hist[d];
    if (rank <= above + c) return DigitChoice{static_cast<std::uint32_t>(d), rank - above};
    above += c;
  }
  return DigitChoice{0u, 0u};  // rank > total: the caller broke the invariant
}

/// Whether a digit search found no bin (its rank is 0; a found bin always has rank >= 1).
DEPTHKV_HOST_DEVICE bool digit_not_found(DigitChoice c) { return c.rank == 0u; }

/// The result of the radix select: keep middle keys > `key`, and the first `need` middle slots
/// with key == `key`.
struct Threshold {
  std::uint32_t key;
  std::uint32_t need;
};

/// The threshold of a failed select (`need == 0`; a valid one has need >= 1): no key is above
/// 0xffffffff and none equal to it is kept, so the row's middle keeps nothing (EvictStatus::kSelectFailed).
DEPTHKV_HOST_DEVICE Threshold failed_threshold() { return Threshold{0xffffffffu, 0u}; }
/// Whether a threshold is the failed one (a digit search of some pass found no bin).
DEPTHKV_HOST_DEVICE bool select_failed(Threshold t) { return t.need == 0u; }

/// One step of the radix select: the threshold after `pass + 1` digits from the one after `pass`
/// digits and the digit chosen in pass `pass`. A failed step (no bin found), or any step after
/// one, gives `failed_threshold()`.
DEPTHKV_HOST_DEVICE Threshold radix_step(Threshold prev, DigitChoice c, int pass, int key_bits_) {
  if (select_failed(prev) || digit_not_found(c)) return failed_threshold();
  return Threshold{prev.key | (c.digit << radix_shift(pass, key_bits_)), c.rank};
}

/// Kept middle tokens among middle slots before a given one, from the counts of middle keys
/// greater than / equal to the threshold before it.
DEPTHKV_HOST_DEVICE std::uint32_t mid_rank(std::uint32_t gt_before, std::uint32_t eq_before, std::uint32_t need) {
  return gt_before + (eq_before < need ? eq_before : need);
}

/// Whether a middle token with key `key`, preceded by `eq_before` middle tokens with key == T, is kept.
DEPTHKV_HOST_DEVICE bool keeps(std::uint32_t key, Threshold t, std::uint32_t eq_before) {
  return key > t.key || (key == t.key && eq_before < t.need);
}

/// Kept tokens of the row in slots before `slot` (0 <= slot <= n), given the kept middle tokens
/// before it: this is the output index of the kept token at `slot`.
DEPTHKV_HOST_DEVICE std::int64_t kept_before(const RowPlan& p, int slot, std::uint32_t mid_kept_before) {
  return static_cast<std::int64_t>(imin(slot, p.lo)) + static_cast<std::int64_t>(mid_kept_before) +
         static_cast<std::int64_t>(imax(0, slot - p.hi));
}

// ---- multi-block layout ------------------------------------------------------------------------
/// Chunks of kEvictChunk slots covering a row of `max_n` tokens.
DEPTHKV_HOST_DEVICE int evict_chunks(int max_n) {
  return max_n <= 0 ? 0 : static_cast<int>((static_cast<std::int64_t>(max_n) + kEvictChunk - 1) / kEvictChunk);
}

/// Workspace of the multi-block path (the one-block path needs none): per row 4 x 256 histogram
/// counters (uint32, zeroed by the call), the select state after each pass ({prefix, rank} after
/// j digits, j = 1..4, written by the row's first middle chunk), and per row and chunk the middle
/// keys greater than and equal to the threshold (2 x uint32).
struct EvictWorkspaceLayout {
  std::size_t hist_offset = 0;    ///< bytes, [n_rows][kMaxRadixPasses][256] uint32
  std::size_t hist_bytes = 0;
  std::size_t state_offset = 0;   ///< bytes, [n_rows][kMaxRadixPasses + 1][2] uint32
  std::size_t state_bytes = 0;
  std::size_t counts_offset = 0;  ///< bytes, [n_rows][n_chunks][2] uint32
  std::size_t counts_bytes = 0;
  std::size_t total_bytes = 0;
  int n_chunks = 0;
};

inline std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// Workspace layout for `n_rows` rows of at most `max_n` tokens (independent of the score type).
inline EvictWorkspaceLayout evict_workspace_layout(int n_rows, int max_n) {
  EvictWorkspaceLayout w;
  const std::size_t rows = n_rows > 0 ? static_cast<std::size_t>(n_rows) : 0u;
  w.n_chunks = evict_chunks(max_n);
  w.hist_offset = 0;
  w.hist_bytes = rows * static_cast<std::size_t>(kMaxRadixPasses) * kRadixBins * sizeof(std::uint32_t);
  w.state_offset = align_up(w.hist_offset + w.hist_bytes, 256);
  w.state_bytes = rows * static_cast<std::size_t>(kMaxRadixPasses + 1) * 2u * sizeof(std::uint32_t);
  w.counts_offset = align_up(w.state_offset + w.state_bytes, 256);
  w.counts_bytes = rows * static_cast<std::size_t>(w.n_chunks) * 2u * sizeof(std::uint32_t);
  w.total_bytes = (rows == 0 || w.n_chunks == 0) ? 0u : align_up(w.counts_offset + w.counts_bytes, 256);
  return w;
}

/// Element index of row `row`'s histogram of pass `pass` inside the histogram area.
DEPTHKV_HOST_DEVICE std::size_t hist_index(int row, int pass) {
  return (static_cast<std::size_t>(row) * kMaxRadixPasses + static_cast<std::size_t>(pass)) * kRadixBins;
}
/// Element index of row `row`'s select state after `digits` digits ({prefix, rank}) inside the state area.
DEPTHKV_HOST_DEVICE std::size_t state_index(int row, int digits) {
  return (static_cast<std::size_t>(row) * (kMaxRadixPasses + 1) + static_cast<std::size_t>(digits)) * 2u;
}
/// The chunk whose CTA writes a row's select state: the first chunk holding a middle slot
/// (every kernel runs that CTA to the end for a row that selects).
DEPTHKV_HOST_DEVICE int state_writer_chunk(const RowPlan& p, int chunk_size) { return p.lo / chunk_size; }
/// Element index of (row, chunk)'s {greater, equal} counts inside the counts area.
DEPTHKV_HOST_DEVICE std::size_t counts_index(int row, int chunk, int n_chunks) {
  return (static_cast<std::size_t>(row) * static_cast<std::size_t>(n_chunks) + static_cast<std::size_t>(chunk)) * 2u;
}

/// Dynamic shared memory of the one-block kernel for rows of at most `max_n` tokens (one 32-bit key per slot).
inline std::size_t one_block_smem_bytes(int max_n) {
  const std::size_t keys = static_cast<std::size_t>(max_n > 4 ? max_n : 4);
  return align_up(keys * sizeof(std::uint32_t), 16);
}

/// The automatic launch-path rule: one CTA per row (keys in shared memory, select + compaction +
/// gather fused in one launch) when rows are short, or moderately long but many (at least one per
/// multiprocessor); otherwise several CTAs per row (kEvictChunk slots each) over a few launches.
inline bool auto_one_block_per_row(int n_rows, int max_n, int n_sms, std::size_t smem_optin) {
  if (one_block_smem_bytes(max_n) + kOneBlockStaticSmem > smem_optin) return false;
  if (max_n <= kEvictChunk) return true;
  return max_n <= kOneBlockMaxN && n_rows >= n_sms;
}

/// The shape half of `evict_params_problem`: why the row count, lengths, sink/recent counts,
/// row table or head size are rejected, or null when they are accepted.
inline const char* evict_shape_problem(int n_rows, bool rows_null, int max_n, int head_dim, std::size_t elem_bytes,
                                       int n_sink, int n_recent) {
  if (n_rows < 0) return "n_rows < 0";
  if (max_n < 0) return "max_n < 0";
  if (max_n > kEvictMaxN)
    return "max_n above kEvictMaxN = 536862720 tokens (65535 chunks of 8192: the CUDA grid's y limit)";
  if (n_sink < 0 || n_recent < 0) return "n_sink or n_recent < 0";
  if (n_rows > 0 && rows_null) return "null row table";
  if (n_rows > 0 && head_dim < 1) return "head_dim < 1";
  if (elem_bytes == 0 || static_cast<std::size_t>(head_dim > 0 ? head_dim : 0) > std::size_t{0x7fffffff} / elem_bytes)
    return "head_dim * sizeof(T) above 2^31 - 1 bytes";
  return nullptr;
}

/// The workspace half of `evict_params_problem`: why the caller's workspace is rejected for
/// `n_rows` rows of at most `max_n` tokens (too small, null or misaligned), or null when accepted.
inline const char* evict_workspace_problem(int n_rows, int max_n, const void* d_workspace,
                                           std::size_t workspace_bytes) {
  const std::size_t need = evict_workspace_layout(n_rows, max_n).total_bytes;
  if (workspace_bytes < need) return "workspace smaller than EvictWorkspaceBytes(params)";
  if (need > 0 && d_workspace == nullptr) return "null workspace";
  if (need > 0 && reinterpret_cast<std::uintptr_t>(d_workspace) % kEvictWorkspaceAlignment != 0u)
    return "workspace not aligned to kEvictWorkspaceAlignment = 256 bytes";
  return nullptr;
}

/// Why a batched eviction's parameters are rejected (the CUDA `Evict` then returns
/// cudaErrorInvalidValue; `EvictParamsError` gives this text), or null when they are accepted.
/// @param rows_null whether the row table pointer is null, @param elem_bytes sizeof(T) of the K/V
/// elements, @param d_workspace / @param workspace_bytes the caller's workspace
inline const char* evict_params_problem(int n_rows, bool rows_null, int max_n, int head_dim, std::size_t elem_bytes,
                                        int n_sink, int n_recent, const void* d_workspace,
                                        std::size_t workspace_bytes) {
  if (const char* why = evict_shape_problem(n_rows, rows_null, max_n, head_dim, elem_bytes, n_sink, n_recent))
    return why;
  return evict_workspace_problem(n_rows, max_n, d_workspace, workspace_bytes);
}

/// Largest copy unit (16, 8, 4, 2 or 1 bytes) dividing every byte quantity OR-ed into `or_bits`
/// (row bytes, strides in bytes, base addresses).
DEPTHKV_HOST_DEVICE int copy_unit_bytes(std::uint64_t or_bits) {
  if (or_bits == 0) return 16;
  const std::uint64_t low = or_bits & (~or_bits + 1u);
  return low >= 16u ? 16 : static_cast<int>(low);
}

// ---- host-side validation and row building -----------------------------------------------------
/// Validates one row as the CPU evictor would (throws depthkv::Error naming the row).
inline void check_evict_row(const EvictRow& r, int row, int head_dim, int n_sink, int n_recent) {
  DEPTHKV_CHECK(n_sink >= 0 && n_recent >= 0, "protection must be >= 0, got sink " << n_sink << " recent " << n_recent);
  DEPTHKV_CHECK(r.n >= 0, "row " << row << ": n = " << r.n << " < 0");
  DEPTHKV_CHECK(r.n <= kEvictMaxN, "row " << row << ": n = " << r.n << " above the CUDA eviction's limit kEvictMaxN = "
                                          << kEvictMaxN << " tokens (65535 chunks of " << kEvictChunk << ")");
  DEPTHKV_CHECK(r.k >= 0, "row " << row << ": keep count " << r.k << " < 0");
  if (r.k < r.n) {
    const int pc = depthkv::detail::protected_count(r.n, n_sink, n_recent);
    DEPTHKV_CHECK(r.k >= pc, "row " << row << ": keep " << r.k << " < " << pc << " protected tokens");
    DEPTHKV_CHECK(r.scores != nullptr || r.k == pc, "row " << row << ": null scores");
  }
  if (r.dst_k != nullptr) {
    DEPTHKV_CHECK(r.src_k != nullptr, "row " << row << ": destination keys without source keys");
    DEPTHKV_CHECK(r.src_token_stride >= head_dim && r.dst_token_stride >= head_dim,
                  "row " << row << ": token strides " << r.src_token_stride << ", " << r.dst_token_stride
                         << " below head_dim " << head_dim);
  }
  if (r.dst_v != nullptr) {
    DEPTHKV_CHECK(r.src_v != nullptr, "row " << row << ": destination values without source values");
    DEPTHKV_CHECK(r.src_token_stride >= head_dim && r.dst_token_stride >= head_dim,
                  "row " << row << ": token strides " << r.src_token_stride << ", " << r.dst_token_stride
                         << " below head_dim " << head_dim);
  }
}

/// Byte range [begin, end) spanned by a layer's keys or values.
template <class Layer, class Ptr>
inline void layer_span(const Layer& L, Ptr base0, Ptr base_last, std::uintptr_t& begin, std::uintptr_t& end) {
  begin = reinterpret_cast<std::uintptr_t>(base0);
  end = reinterpret_cast<std::uintptr_t>(base_last) +
        static_cast<std::uintptr_t>(L.capacity()) * static_cast<std::uintptr_t>(L.token_stride()) *
            sizeof(typename Layer::Scalar);
}

inline bool spans_overlap(std::uintptr_t a0, std::uintptr_t a1, std::uintptr_t b0, std::uintptr_t b1) {
  return a0 < b1 && b0 < a1;
}

}  // namespace detail

/// Appends the rows of one layer (one per KV head) that evict `src` into `dst`: head h keeps
/// `keep_per_head[h]` tokens (k >= size keeps all) by its scores `d_scores + h * score_head_stride`,
/// protected sinks/recent window always kept. Validates everything first (as the CPU evictor),
/// then sets `dst`'s host-side sizes to the kept counts (the kernel fills them in stream order).
///
/// @tparam SrcLayer, DstLayer device layers (`DeviceLayer<T>`, `DeviceLayerView<T>`), same Scalar
/// @param d_kept_slots optional device buffer `[n_kv_heads][kept_head_stride]` for the kept slots
/// @throws Error on mismatched shapes, a bad keep count, a too small destination or overlapping storage
///
/// @code
/// std::vector<depthkv::cuda::EvictRow> rows;
/// for (int l = 0; l < n_layers; ++l)
///   depthkv::cuda::append_evict_rows(rows, src[l], dst[l], d_scores[l], capacity, keep[l].data(), 4, 64);
/// // copy rows to the device (d_rows), then depthkv::cuda::Evict<T>(params, ...)
/// @endcode
template <class SrcLayer, class DstLayer, typename ScoreT>
void append_evict_rows(std::vector<EvictRow>& rows, const SrcLayer& src, DstLayer& dst, const ScoreT* d_scores,
                       std::int64_t score_head_stride, const int* keep_per_head, int n_sink, int n_recent,
                       std::int32_t* d_kept_slots = nullptr, std::int64_t kept_head_stride = 0) {
  static_assert(sizeof(typename SrcLayer::Scalar) == sizeof(typename DstLayer::Scalar),
                "source and destination layers must store the same element type");
  DEPTHKV_CHECK(src.n_kv_heads() == dst.n_kv_heads() && src.head_dim() == dst.head_dim(),
                "source [" << src.n_kv_heads() << " heads x " << src.head_dim() << "] and destination ["
                           << dst.n_kv_heads() << " x " << dst.head_dim() << "] differ");
  DEPTHKV_CHECK(keep_per_head != nullptr, "null keep counts");
  const int nh = src.n_kv_heads();
  if (nh == 0) return;
  // out-of-place: the destination storage must not overlap the source storage
  std::uintptr_t sk0, sk1, sv0, sv1, dk0, dk1, dv0, dv1;
  detail::layer_span(src, src.key(0, 0), src.key(nh - 1, 0), sk0, sk1);
  detail::layer_span(src, src.value(0, 0), src.value(nh - 1, 0), sv0, sv1);
  detail::layer_span(dst, dst.key(0, 0), dst.key(nh - 1, 0), dk0, dk1);
  detail::layer_span(dst, dst.value(0, 0), dst.value(nh - 1, 0), dv0, dv1);
  DEPTHKV_CHECK(!detail::spans_overlap(sk0, sk1, dk0, dk1) && !detail::spans_overlap(sk0, sk1, dv0, dv1) &&
                    !detail::spans_overlap(sv0, sv1, dk0, dk1) && !detail::spans_overlap(sv0, sv1, dv0, dv1),
                "destination storage overlaps the source (eviction is out-of-place)");
  std::vector<int> kept(static_cast<std::size_t>(nh));
  for (int h = 0; h < nh; ++h) {
    EvictRow r;
    r.n = src.size(h);
    r.k = keep_per_head[h];
    r.scores = d_scores == nullptr ? nullptr : d_scores + static_cast<std::int64_t>(h) * score_head_stride;
    detail::check_evict_row(r, static_cast<int>(rows.size()) + h, src.head_dim(), n_sink, n_recent);
    kept[static_cast<std::size_t>(h)] = r.k < r.n ? r.k : r.n;
    DEPTHKV_CHECK(kept[static_cast<std::size_t>(h)] <= dst.capacity(),
                  "head " << h << ": " << kept[static_cast<std::size_t>(h)] << " kept tokens exceed the destination capacity "
                          << dst.capacity());
  }
  for (int h = 0; h < nh; ++h) {
    EvictRow r;
    r.n = src.size(h);
    r.k = keep_per_head[h];
    r.scores = d_scores == nullptr ? nullptr : d_scores + static_cast<std::int64_t>(h) * score_head_stride;
    r.positions = src.positions(h);
    r.src_k = src.key(h, 0);
    r.src_v = src.value(h, 0);
    r.dst_k = dst.key(h, 0);
    r.dst_v = dst.value(h, 0);
    r.dst_positions = dst.positions(h);
    r.kept_slots = d_kept_slots == nullptr ? nullptr : d_kept_slots + static_cast<std::int64_t>(h) * kept_head_stride;
    r.src_token_stride = src.token_stride();
    r.dst_token_stride = dst.token_stride();
    rows.push_back(r);
    dst.set_size(h, kept[static_cast<std::size_t>(h)]);
  }
}

}  // namespace cuda
}  // namespace depthkv
