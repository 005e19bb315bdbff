// CPU tests of the host/device logic shared by the CUDA eviction kernels (no CUDA needed):
// the row plan, radix digit helpers and digit search, the tie rule, workspace layout, launch-path
// rule, copy-unit choice, row validation/building and the device-layer bookkeeping. Both kernel
// paths (one CTA per row; several CTAs per row) are emulated step by step with exactly these
// functions -- tile-wise block scans, in-place compaction, chunk counts, output offsets -- and
// compared with a naive reference and, when present, the CPU evictor `depthkv::select_keep`.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "depthkv/cuda/detail/device_storage.hpp"
#include "depthkv/cuda/detail/evict_plan.hpp"
#include "depthkv/detail/select_common.hpp"
#include "support/adversarial_scores.hpp"
#include "support/selection_reference.hpp"

#if !defined(DEPTHKV_TEST_NO_CPU_EVICTOR) && __has_include("depthkv/evictor.hpp")
#include "depthkv/evictor.hpp"
#define DEPTHKV_TEST_HAVE_EVICTOR 1
#endif

namespace dc = depthkv::cuda;
namespace dd = depthkv::cuda::detail;

namespace {

// ---- references --------------------------------------------------------------------------------

/// The CPU path: the naive reference, cross-checked with depthkv::select_keep when it exists.
/// With 16-bit scores (`raw16` non-empty) the CPU evictor's 16-bit overload is checked too.
std::vector<std::int32_t> cpu_select(const std::vector<float>& s, const std::vector<std::int32_t>& pos, int k, int sink,
                                     int recent, const std::vector<std::uint16_t>& raw16 = {}, bool bf16 = false) {
  const int n = static_cast<int>(s.size());
  std::vector<std::int32_t> ref = depthkv_test::naive_select_keep(s.data(), pos.data(), n, k, sink, recent);
#ifdef DEPTHKV_TEST_HAVE_EVICTOR
  depthkv::Protection prot;
  prot.n_sink = sink;
  prot.n_recent = recent;
  const std::vector<std::int32_t> cpu = depthkv::select_keep(s.data(), pos.data(), n, k, prot);
  REQUIRE(cpu == ref);
  if (!raw16.empty()) {
    const std::vector<std::int32_t> cpu16 =
        bf16 ? depthkv::select_keep(reinterpret_cast<const Eigen::bfloat16*>(raw16.data()), pos.data(), n, k, prot)
             : depthkv::select_keep(reinterpret_cast<const Eigen::half*>(raw16.data()), pos.data(), n, k, prot);
    REQUIRE(cpu16 == ref);
  }
#else
  (void)raw16;
  (void)bf16;
#endif
  return ref;
}

/// The library's NaN test of a 16-bit score pattern in format f (kF16 or kBF16).
bool nan16(std::uint16_t u, dd::ScoreFormat f) { return depthkv::detail::is_nan16(u, dd::inf_bits16(f)); }

float half_to_float(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  else
    v = std::ldexp(static_cast<float>(man + 1024), exp - 25);
  return sign ? -v : v;
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- emulation of the kernels ------------------------------------------------------------------

/// Emulates compact_mid: tiles of NT elements, per tile all reads then an exclusive scan of
/// (greater, equal) flags, then the in-place writes. Returns the kept count.
int emulate_compact(std::vector<std::uint32_t>& keys, int a_off, int len, int base_slot, dd::Threshold t,
                    std::uint32_t gt_base, std::uint32_t eq_base, int NT) {
  const std::uint32_t start = dd::mid_rank(gt_base, eq_base, t.need);
  std::uint32_t gt = gt_base, eq = eq_base;
  bool ok = true;  // one REQUIRE per call keeps the test fast
  for (int i0 = 0; i0 < len; i0 += NT) {
    std::vector<std::pair<int, std::uint32_t>> writes;
    std::uint32_t ge = 0, ee = 0;  // exclusive scan within the tile
    for (int tid = 0; tid < NT; ++tid) {
      const int i = i0 + tid;
      const bool valid = i < len;
      const std::uint32_t key = valid ? keys[static_cast<std::size_t>(a_off + i)] : 0u;
      const bool is_gt = valid && key > t.key;
      const bool is_eq = valid && key == t.key;
      const std::uint32_t g = gt + ge, e = eq + ee;
      if (is_gt || (is_eq && e < t.need)) {
        ok = ok && dd::keeps(key, t, e);
        const int out = static_cast<int>(dd::mid_rank(g, e, t.need) - start);
        ok = ok && out <= i;       // in place: never ahead of the element being read
        ok = ok && out < i0 + NT;  // never into a later tile
        writes.emplace_back(out, static_cast<std::uint32_t>(base_slot + i));
      } else if (valid) {
        ok = ok && !dd::keeps(key, t, e);
      }
      ge += is_gt ? 1u : 0u;
      ee += is_eq ? 1u : 0u;
    }
    for (const auto& w : writes) keys[static_cast<std::size_t>(a_off + w.first)] = w.second;
    gt += ge;
    eq += ee;
  }
  REQUIRE(ok);
  return static_cast<int>(dd::mid_rank(gt, eq, t.need) - start);
}

/// Digit search after `passes_done` passes from per-pass histograms (threshold_from_global).
dd::Threshold threshold_from(const std::vector<std::vector<std::uint32_t>>& hists, int passes_done, int bits,
                             std::uint32_t rank) {
  std::uint32_t prefix = 0;
  for (int p = 0; p < passes_done; ++p) {
    const std::uint32_t total = std::accumulate(hists[static_cast<std::size_t>(p)].begin(), hists[static_cast<std::size_t>(p)].end(), 0u);
    REQUIRE(rank >= 1u);
    REQUIRE(rank <= total);
    const dd::DigitChoice c = dd::find_digit(hists[static_cast<std::size_t>(p)].data(), rank);
    REQUIRE(c.rank >= 1u);
    REQUIRE(c.rank <= hists[static_cast<std::size_t>(p)][c.digit]);
    prefix |= c.digit << dd::radix_shift(p, bits);
    rank = c.rank;
  }
  return dd::Threshold{prefix, rank};
}

/// Emulates EvictOneBlockPerRowKernel's selection: kept slots in output order.
std::vector<std::int32_t> emulate_one_block(const std::vector<std::uint32_t>& key_of_slot, int k, int sink, int recent,
                                            int bits, int NT) {
  const int n = static_cast<int>(key_of_slot.size());
  const dd::RowPlan p = dd::plan_row(n, k, sink, recent, n, true);
  REQUIRE(p.status == dc::EvictStatus::kOk);
  std::vector<std::uint32_t> keys(key_of_slot.begin() + p.lo, key_of_slot.begin() + p.hi);
  const int m = p.hi - p.lo;
  int m_kept = 0;
  if (p.select) {
    std::vector<std::vector<std::uint32_t>> hists;
    for (int pass = 0; pass < dd::radix_passes(bits); ++pass) {
      const dd::Threshold so_far = threshold_from(hists, pass, bits, static_cast<std::uint32_t>(p.keep_mid));
      std::vector<std::uint32_t> h(dd::kRadixBins, 0u);
      for (int i = 0; i < m; ++i)
        if (dd::radix_matches(keys[static_cast<std::size_t>(i)], so_far.key, pass, bits))
          ++h[dd::radix_digit(keys[static_cast<std::size_t>(i)], pass, bits)];
      hists.push_back(h);
    }
    const dd::Threshold t = threshold_from(hists, dd::radix_passes(bits), bits, static_cast<std::uint32_t>(p.keep_mid));
    m_kept = emulate_compact(keys, 0, m, p.lo, t, 0u, 0u, NT);
    REQUIRE(m_kept == p.keep_mid);
  }
  std::vector<std::int32_t> out;
  for (int q = 0; q < p.lo; ++q) out.push_back(q);
  for (int q = 0; q < m_kept; ++q) out.push_back(static_cast<std::int32_t>(keys[static_cast<std::size_t>(q)]));
  for (int s = p.hi; s < n; ++s) out.push_back(s);
  REQUIRE(static_cast<int>(out.size()) == p.n_kept);
  return out;
}

/// Emulates the multi-block path with chunk size C: histogram passes over chunks (each CTA one
/// radix step from the stored state; the row's writer chunk stores the new state), the count
/// pass (final threshold stored, per-chunk counts), then the emit pass reading the stored state.
/// One CTA's output of an emulated eviction: its first destination index and its kept source
/// slots in output order (the kernel's KeptMap).
using CtaOutput = std::pair<std::int64_t, std::vector<std::int32_t>>;

std::vector<std::int32_t> emulate_multi_block(const std::vector<std::uint32_t>& key_of_slot, int k, int sink, int recent,
                                              int bits, int C, int NT, std::vector<CtaOutput>* ctas = nullptr) {
  const int n = static_cast<int>(key_of_slot.size());
  const dd::RowPlan p = dd::plan_row(n, k, sink, recent, n, true);
  const int n_chunks = (n + C - 1) / C;
  const int passes = dd::radix_passes(bits);
  std::vector<std::vector<std::uint32_t>> hists;
  std::vector<dd::Threshold> stored(static_cast<std::size_t>(passes + 1), dd::Threshold{0xdeadbeefu, 0xdeadbeefu});
  const dd::Threshold state0{0u, static_cast<std::uint32_t>(p.keep_mid)};
  // multi_block_state: one step from the stored state after digits - 1 digits
  auto state_after = [&](int digits, bool writer) {
    if (digits == 0) return state0;
    const dd::Threshold prev = digits == 1 ? state0 : stored[static_cast<std::size_t>(digits - 1)];
    REQUIRE(prev.key != 0xdeadbeefu);  // written by an earlier launch
    const dd::DigitChoice c = dd::find_digit(hists[static_cast<std::size_t>(digits - 1)].data(), prev.need);
    REQUIRE(c.rank >= 1u);
    const dd::Threshold t = dd::radix_step(prev, c, digits - 1, bits);
    if (writer) stored[static_cast<std::size_t>(digits)] = t;
    return t;
  };
  dd::Threshold t{0xffffffffu, 0u};
  std::vector<std::uint32_t> cgt(static_cast<std::size_t>(n_chunks), 0u), ceq(static_cast<std::size_t>(n_chunks), 0u);
  if (p.select) {
    const int writer = dd::state_writer_chunk(p, C);
    for (int pass = 0; pass < passes; ++pass) {  // EvictHistogramKernel launches
      std::vector<std::uint32_t> global(dd::kRadixBins, 0u);
      std::vector<dd::Threshold> seen;
      for (int c = n_chunks - 1; c >= 0; --c) {  // any CTA order
        const int a = std::max(c * C, p.lo), b = std::min(c * C + C, p.hi);
        if (a >= b) continue;
        const dd::Threshold so_far = state_after(pass, c == writer);
        seen.push_back(so_far);
        for (int i = a; i < b; ++i)
          if (dd::radix_matches(key_of_slot[static_cast<std::size_t>(i)], so_far.key, pass, bits))
            ++global[dd::radix_digit(key_of_slot[static_cast<std::size_t>(i)], pass, bits)];
      }
      // every CTA of the row derived the same state, equal to the full recomputation
      const dd::Threshold full = threshold_from(hists, pass, bits, static_cast<std::uint32_t>(p.keep_mid));
      for (const dd::Threshold& x : seen) REQUIRE((x.key == full.key && x.need == full.need));
      hists.push_back(global);
    }
    for (int c = n_chunks - 1; c >= 0; --c) {  // EvictCountKernel
      t = state_after(passes, c == writer);
      const int a = std::max(c * C, p.lo), b = std::min(c * C + C, p.hi);
      for (int i = a; i < b; ++i) {
        cgt[static_cast<std::size_t>(c)] += key_of_slot[static_cast<std::size_t>(i)] > t.key ? 1u : 0u;
        ceq[static_cast<std::size_t>(c)] += key_of_slot[static_cast<std::size_t>(i)] == t.key ? 1u : 0u;
      }
    }
    const dd::Threshold full = threshold_from(hists, passes, bits, static_cast<std::uint32_t>(p.keep_mid));
    t = stored[static_cast<std::size_t>(passes)];  // what EvictEmitKernel reads
    REQUIRE((t.key == full.key && t.need == full.need));
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(p.n_kept), -1);
  std::vector<std::uint32_t> keys = key_of_slot;  // per-chunk scratch (the CTA's shared list)
  for (int c = 0; c < n_chunks; ++c) {
    const int c0 = c * C, c1 = std::min(c0 + C, n);
    std::uint32_t mid_before = 0;
    int m_kept = 0;
    int a = 0, b = 0;
    if (p.select) {
      std::uint32_t gb = 0, eb = 0;
      for (int j = 0; j < c; ++j) {
        gb += cgt[static_cast<std::size_t>(j)];
        eb += ceq[static_cast<std::size_t>(j)];
      }
      mid_before = dd::mid_rank(gb, eb, t.need);
      a = std::max(c0, p.lo);
      b = std::min(c1, p.hi);
      if (a < b) m_kept = emulate_compact(keys, a, b - a, a, t, gb, eb, NT);
    }
    const std::int64_t base = dd::kept_before(p, c0, mid_before);
    const int s_cnt = std::max(0, std::min(c1, p.lo) - c0);
    const int r_begin = std::max(c0, p.hi), r_cnt = std::max(0, c1 - r_begin);
    std::vector<std::int32_t> chunk_out;
    for (int q = 0; q < s_cnt; ++q) chunk_out.push_back(c0 + q);
    for (int q = 0; q < m_kept; ++q) chunk_out.push_back(static_cast<std::int32_t>(keys[static_cast<std::size_t>(a + q)]));
    for (int q = 0; q < r_cnt; ++q) chunk_out.push_back(r_begin + q);
    if (ctas != nullptr) ctas->emplace_back(base, chunk_out);
    bool ok = true;
    for (std::size_t q = 0; q < chunk_out.size() && ok; ++q) {
      const std::int64_t d = base + static_cast<std::int64_t>(q);
      ok = d >= 0 && d < p.n_kept && out[static_cast<std::size_t>(d)] == -1;  // every output written exactly once
      if (ok) out[static_cast<std::size_t>(d)] = chunk_out[q];
    }
    REQUIRE(ok);
  }
  REQUIRE(std::all_of(out.begin(), out.end(), [](std::int32_t v) { return v >= 0; }));
  return out;
}

// ---- random rows -------------------------------------------------------------------------------

struct RandomRow {
  std::vector<float> scores;          // as the CPU sees them
  std::vector<std::uint32_t> keys;    // as the GPU ranks them
  std::vector<std::int32_t> positions;
  std::vector<std::uint16_t> raw16;   // 16-bit formats: the stored bit patterns
  int bits = 32;
  bool bf16 = false;
};

RandomRow random_row(std::mt19937_64& rng, int n, dd::ScoreFormat fmt) {
  RandomRow r;
  r.bits = dd::key_bits(fmt);
  r.bf16 = fmt == dd::ScoreFormat::kBF16;
  const int kind = static_cast<int>(rng() % depthkv_test::kScoreKinds);  // float rows
  const int mode = kind % 5;                                                 // 16-bit rows
  std::int32_t pos = static_cast<std::int32_t>(rng() % 5);
  for (int i = 0; i < n; ++i) {
    r.positions.push_back(pos);
    pos += 1 + static_cast<std::int32_t>(rng() % 3);
    if (fmt == dd::ScoreFormat::kF32) {
      const float f = depthkv_test::adversarial_score(kind, i, n, rng);
      r.scores.push_back(f);
      r.keys.push_back(depthkv::detail::ordered_key(f));
    } else {
      std::uint16_t u = 0;
      switch (mode) {
        case 0: u = static_cast<std::uint16_t>(rng()); break;
        case 1: u = static_cast<std::uint16_t>(0x3c00u + (rng() % 3)); break;
        case 2: u = 0x3c00u; break;
        case 3: u = (rng() % 2) ? 0x0000u : 0x8000u; break;
        default: u = static_cast<std::uint16_t>(rng() % 16); break;
      }
      if (nan16(u, fmt)) u = static_cast<std::uint16_t>(u & 0x7c00u);  // keep it finite-or-inf, not NaN
      const float f = fmt == dd::ScoreFormat::kF16 ? half_to_float(u) : bf16_to_float(u);
      REQUIRE(!std::isnan(f));
      r.scores.push_back(f);
      r.raw16.push_back(u);
      r.keys.push_back(depthkv::detail::ordered_key16(u));
    }
  }
  return r;
}

// A device-layer bookkeeping object over fake (never dereferenced) pointers.
template <typename T>
struct FakeLayer : dd::DeviceStorage<T> {
  FakeLayer(T* k, T* v, std::int32_t* p, int nh, int hd, int cap, int len, std::ptrdiff_t token_stride = -1,
            std::ptrdiff_t head_stride = -1) {
    this->init(k, v, p, nh, hd, cap, len, head_stride, token_stride, -1);
  }
};

}  // namespace

TEST_CASE("ordered_key16 orders half and bfloat16 like their float values", "[evict][cuda][host]") {
  for (dd::ScoreFormat fmt : {dd::ScoreFormat::kF16, dd::ScoreFormat::kBF16}) {
    std::vector<std::uint16_t> pats;
    for (std::uint32_t u = 0; u < 65536u; ++u)
      if (!nan16(static_cast<std::uint16_t>(u), fmt)) pats.push_back(static_cast<std::uint16_t>(u));
    auto val = [&](std::uint16_t u) { return fmt == dd::ScoreFormat::kF16 ? half_to_float(u) : bf16_to_float(u); };
    std::sort(pats.begin(), pats.end(), [](std::uint16_t a, std::uint16_t b) {
      return depthkv::detail::ordered_key16(a) < depthkv::detail::ordered_key16(b);
    });
    std::size_t bad = 0;
    for (std::size_t i = 1; i < pats.size(); ++i) {
      const float a = val(pats[i - 1]), b = val(pats[i]);
      const bool same_key = depthkv::detail::ordered_key16(pats[i - 1]) == depthkv::detail::ordered_key16(pats[i]);
      bad += (a <= b) ? 0u : 1u;
      bad += (same_key == (a == b)) ? 0u : 1u;
      // and the float keys agree with the 16-bit keys
      bad += ((depthkv::detail::ordered_key(a) < depthkv::detail::ordered_key(b)) == !same_key) ? 0u : 1u;
    }
    REQUIRE(bad == 0u);
  }
  std::uint32_t nan_count = 0;
  for (std::uint32_t u = 0; u < 65536u; ++u) nan_count += nan16(static_cast<std::uint16_t>(u), dd::ScoreFormat::kF16) ? 1u : 0u;
  REQUIRE(nan_count == 2u * 1023u);
  REQUIRE(nan16(0x7fc0u, dd::ScoreFormat::kBF16));
  REQUIRE(!nan16(0x7f80u, dd::ScoreFormat::kBF16));  // +inf
  REQUIRE(!nan16(0xfc00u, dd::ScoreFormat::kF16));   // -inf
}

TEST_CASE("plan_row: protected ranges, keep-all, bad rows", "[evict][cuda][host]") {
  using S = dc::EvictStatus;
  SECTION("empty row") {
    const dd::RowPlan p = dd::plan_row(0, 0, 4, 4, 10, true);
    REQUIRE(p.n == 0);
    REQUIRE(p.n_kept == 0);
    REQUIRE(!p.select);
    REQUIRE(p.status == S::kOk);
  }
  SECTION("keep all") {
    const dd::RowPlan p = dd::plan_row(10, 10, 2, 3, 10, false);
    REQUIRE(p.lo == 10);
    REQUIRE(p.hi == 10);
    REQUIRE(p.n_kept == 10);
    REQUIRE(!p.select);
    REQUIRE(dd::plan_row(10, 1000, 2, 3, 10, true).n_kept == 10);
  }
  SECTION("keep none with no protection") {
    const dd::RowPlan p = dd::plan_row(10, 0, 0, 0, 10, true);
    REQUIRE(p.n_kept == 0);
    REQUIRE(!p.select);
    REQUIRE(p.status == S::kOk);
  }
  SECTION("middle select") {
    const dd::RowPlan p = dd::plan_row(100, 30, 4, 16, 100, true);
    REQUIRE(p.lo == 4);
    REQUIRE(p.hi == 84);
    REQUIRE(p.keep_mid == 10);
    REQUIRE(p.select);
    REQUIRE(p.n_kept == 30);
    REQUIRE(p.n - (p.hi - p.lo) == depthkv::detail::protected_count(100, 4, 16));
  }
  SECTION("overlapping protection") {
    const dd::RowPlan p = dd::plan_row(10, 9, 8, 8, 10, true);
    REQUIRE(p.lo == 8);
    REQUIRE(p.hi == 8);
    REQUIRE(p.status == S::kBadKeep);  // 9 < 10 protected
    REQUIRE(p.n_kept == 10);           // protected tokens are still kept
  }
  SECTION("k equal to the protected count needs no scores") {
    const dd::RowPlan p = dd::plan_row(50, 6, 2, 4, 50, false);
    REQUIRE(!p.select);
    REQUIRE(p.status == S::kOk);
    REQUIRE(p.n_kept == 6);
  }
  SECTION("bad keep and bad rows") {
    REQUIRE(dd::plan_row(10, -1, 0, 0, 10, true).status == S::kBadKeep);
    REQUIRE(dd::plan_row(10, 3, 2, 2, 10, true).status == S::kBadKeep);
    REQUIRE(dd::plan_row(11, 3, 0, 0, 10, true).status == S::kBadRow);
    REQUIRE(dd::plan_row(11, 3, 0, 0, 10, true).n == 0);
    REQUIRE(dd::plan_row(-1, 3, 0, 0, 10, true).status == S::kBadRow);
    REQUIRE(dd::plan_row(10, 5, 0, 0, 10, false).status == S::kBadRow);  // selection without scores
  }
  SECTION("negative k on an empty row") { REQUIRE(dd::plan_row(0, -1, 0, 0, 10, true).status == S::kBadKeep); }
}

TEST_CASE("radix digits, masks and digit search", "[evict][cuda][host]") {
  REQUIRE(dd::radix_passes(32) == 4);
  REQUIRE(dd::radix_passes(16) == 2);
  REQUIRE(dd::radix_decided_mask(0, 32) == 0u);
  REQUIRE(dd::radix_decided_mask(1, 32) == 0xff000000u);
  REQUIRE(dd::radix_decided_mask(3, 32) == 0xffffff00u);
  REQUIRE(dd::radix_decided_mask(1, 16) == 0xff00u);
  REQUIRE(dd::radix_digit(0x12345678u, 0, 32) == 0x12u);
  REQUIRE(dd::radix_digit(0x12345678u, 3, 32) == 0x78u);
  REQUIRE(dd::radix_digit(0xabcdu, 0, 16) == 0xabu);
  REQUIRE(dd::radix_digit(0xabcdu, 1, 16) == 0xcdu);
  REQUIRE(dd::radix_matches(0x12345678u, 0x12340000u, 2, 32));
  REQUIRE(!dd::radix_matches(0x12355678u, 0x12340000u, 2, 32));

  std::vector<std::uint32_t> h(256, 0u);
  h[255] = 2;
  h[200] = 3;
  h[7] = 5;
  REQUIRE(dd::find_digit(h.data(), 1).digit == 255u);
  REQUIRE(dd::find_digit(h.data(), 2).rank == 2u);
  REQUIRE(dd::find_digit(h.data(), 3).digit == 200u);
  REQUIRE(dd::find_digit(h.data(), 3).rank == 1u);
  REQUIRE(dd::find_digit(h.data(), 5).digit == 200u);
  REQUIRE(dd::find_digit(h.data(), 6).digit == 7u);
  REQUIRE(dd::find_digit(h.data(), 10).rank == 5u);

  // the warp version: 8 bins per lane, lane l holds bins 255-8l..248-8l; emulate it
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::uint32_t> hist(256, 0u);
    std::uint32_t total = 0;
    for (auto& c : hist) {
      c = (rng() % 3 == 0) ? static_cast<std::uint32_t>(rng() % 50) : 0u;
      total += c;
    }
    if (total == 0) continue;
    const std::uint32_t rank = 1u + static_cast<std::uint32_t>(rng() % total);
    int found = 0;
    dd::DigitChoice warp{0, 0};
    std::uint32_t incl = 0;
    for (int lane = 0; lane < 32; ++lane) {
      std::uint32_t s = 0;
      for (int j = 0; j < 8; ++j) s += hist[static_cast<std::size_t>(255 - 8 * lane - j)];
      std::uint32_t above = incl;
      incl += s;
      if (above < rank && rank <= incl) {
        ++found;
        bool f = false;
        for (int j = 0; j < 8; ++j) {
          const std::uint32_t c = hist[static_cast<std::size_t>(255 - 8 * lane - j)];
          if (!f && rank <= above + c) {
            warp = dd::DigitChoice{static_cast<std::uint32_t>(255 - 8 * lane - j), rank - above};
            f = true;
          }
          above += c;
        }
      }
    }
    REQUIRE(found == 1);
    const dd::DigitChoice serial = dd::find_digit(hist.data(), rank);
    REQUIRE(warp.digit == serial.digit);
    REQUIRE(warp.rank == serial.rank);
  }
}

TEST_CASE("tie rule helpers", "[evict][cuda][host]") {
  const dd::Threshold t{100u, 2u};
  REQUIRE(dd::keeps(101u, t, 5u));
  REQUIRE(dd::keeps(100u, t, 0u));
  REQUIRE(dd::keeps(100u, t, 1u));
  REQUIRE(!dd::keeps(100u, t, 2u));
  REQUIRE(!dd::keeps(99u, t, 0u));
  REQUIRE(dd::mid_rank(3u, 1u, 2u) == 4u);
  REQUIRE(dd::mid_rank(3u, 7u, 2u) == 5u);
  const dd::RowPlan p = dd::plan_row(100, 30, 4, 16, 100, true);
  REQUIRE(dd::kept_before(p, 0, 0u) == 0);
  REQUIRE(dd::kept_before(p, 4, 0u) == 4);
  REQUIRE(dd::kept_before(p, 50, 7u) == 11);
  REQUIRE(dd::kept_before(p, 84, 10u) == 14);
  REQUIRE(dd::kept_before(p, 100, 10u) == 30);
  // -0.0 and +0.0 are equal scores: the earlier position ranks first
  REQUIRE(depthkv::detail::ordered_key(-0.0f) == depthkv::detail::ordered_key(0.0f));
  REQUIRE(depthkv::detail::ordered_key16(0x8000u) == depthkv::detail::ordered_key16(0x0000u));
}

TEST_CASE("emulated one-block and multi-block selection match the CPU path", "[evict][cuda][host]") {
  std::mt19937_64 rng(20240601);
  const dd::ScoreFormat fmts[] = {dd::ScoreFormat::kF32, dd::ScoreFormat::kF16, dd::ScoreFormat::kBF16};
  // Rows where the selection decides (some unprotected slots kept and some evicted), per score
  // format; of those, rows where equal keys straddle the cut (the tie rule decides) and rows of
  // more than one chunk.
  int decided[3] = {0, 0, 0}, tie_at_cut = 0, multi_chunk = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const dd::ScoreFormat fmt = fmts[trial % 3];
    int n;
    switch (trial % 6) {
      case 0: n = static_cast<int>(rng() % 4); break;
      case 1: n = 1 + static_cast<int>(rng() % 64); break;
      case 2: n = 1 + static_cast<int>(rng() % 700); break;
      case 3: n = 1 + static_cast<int>(rng() % 5000); break;
      case 4: n = 8190 + static_cast<int>(rng() % 8); break;  // around one chunk
      default: n = 1 + static_cast<int>(rng() % 40000); break;
    }
    const int sink = (rng() % 3 == 0) ? 0 : static_cast<int>(rng() % 9);
    const int recent = (rng() % 3 == 0) ? 0 : static_cast<int>(rng() % (n / 2 + 2));
    const int pc = depthkv::detail::protected_count(n, sink, recent);
    int k;
    switch (rng() % 6) {
      case 0: k = pc; break;
      case 1: k = n; break;
      case 2: k = n + 3; break;
      case 3: k = std::min(n, pc + 1); break;
      default: k = pc + (n > pc ? static_cast<int>(rng() % static_cast<std::uint64_t>(n - pc + 1)) : 0);
    }
    const RandomRow row = random_row(rng, n, fmt);
    const std::vector<std::int32_t> ref = cpu_select(row.scores, row.positions, k, sink, recent, row.raw16, row.bf16);
    const int NT = (trial % 2) ? 512 : 32 * (1 + static_cast<int>(rng() % 4));
    INFO("trial " << trial << " n " << n << " k " << k << " sink " << sink << " recent " << recent << " fmt "
                  << static_cast<int>(fmt) << " NT " << NT);
    REQUIRE(emulate_one_block(row.keys, k, sink, recent, row.bits, NT) == ref);
    REQUIRE(emulate_multi_block(row.keys, k, sink, recent, row.bits, dd::kEvictChunk, NT) == ref);
    const int C = 1 + static_cast<int>(rng() % 300);
    REQUIRE(emulate_multi_block(row.keys, k, sink, recent, row.bits, C, NT) == ref);
    if (pc < k && k < n) {
      ++decided[trial % 3];
      if (n > dd::kEvictChunk) ++multi_chunk;
      std::vector<char> kept(static_cast<std::size_t>(n), 0);
      for (std::int32_t i : ref) kept[static_cast<std::size_t>(i)] = 1;
      std::uint32_t min_kept = ~0u, max_evicted = 0u;
      for (int i = sink; i < n - recent; ++i) {
        const std::uint32_t key = row.keys[static_cast<std::size_t>(i)];
        if (kept[static_cast<std::size_t>(i)])
          min_kept = std::min(min_kept, key);
        else
          max_evicted = std::max(max_evicted, key);
      }
      if (min_kept == max_evicted) ++tie_at_cut;
    }
  }
  INFO("decided rows f32/f16/bf16 " << decided[0] << "/" << decided[1] << "/" << decided[2] << ", tie at the cut "
                                    << tie_at_cut << ", more than one chunk " << multi_chunk);
  for (int f = 0; f < 3; ++f) REQUIRE(decided[f] >= 40);
  REQUIRE(tie_at_cut >= 100);
  REQUIRE(multi_chunk >= 40);
}

TEST_CASE("emulated selection on a full-length row of 131072 tokens", "[evict][cuda][host]") {
  std::mt19937_64 rng(5);
  const int n = 131072;
  for (dd::ScoreFormat fmt : {dd::ScoreFormat::kF32, dd::ScoreFormat::kBF16}) {
    const RandomRow row = random_row(rng, n, fmt);
    for (int sink : {4, 9000}) {
      for (int k : {0, 4 + 64, 13107, 65536, n - 1}) {
        const int kk = std::max(k, depthkv::detail::protected_count(n, sink, 64));
        const std::vector<std::int32_t> ref = cpu_select(row.scores, row.positions, kk, sink, 64, row.raw16, row.bf16);
        REQUIRE(emulate_multi_block(row.keys, kk, sink, 64, row.bits, dd::kEvictChunk, 512) == ref);
      }
    }
  }
}

TEST_CASE("workspace layout, chunks and launch-path rule", "[evict][cuda][host]") {
  REQUIRE(dd::evict_chunks(0) == 0);
  REQUIRE(dd::evict_chunks(1) == 1);
  REQUIRE(dd::evict_chunks(dd::kEvictChunk) == 1);
  REQUIRE(dd::evict_chunks(dd::kEvictChunk + 1) == 2);
  REQUIRE(dd::evict_chunks(131072) == 16);
  REQUIRE(dd::evict_chunks(std::numeric_limits<int>::max()) == 262144);  // no int overflow

  const dd::EvictWorkspaceLayout w = dd::evict_workspace_layout(256, 131072);
  REQUIRE(w.n_chunks == 16);
  REQUIRE(w.hist_bytes == 256u * 4u * 256u * 4u);
  REQUIRE(w.state_offset % 256 == 0);
  REQUIRE(w.state_offset >= w.hist_offset + w.hist_bytes);
  REQUIRE(w.state_bytes == 256u * 5u * 2u * 4u);
  REQUIRE(w.counts_offset % 256 == 0);
  REQUIRE(w.counts_offset >= w.state_offset + w.state_bytes);
  REQUIRE(w.counts_bytes == 256u * 16u * 8u);
  REQUIRE(w.total_bytes >= w.counts_offset + w.counts_bytes);
  REQUIRE(w.total_bytes % 256 == 0);
  REQUIRE(dd::evict_workspace_layout(0, 100).total_bytes == 0);
  REQUIRE(dd::evict_workspace_layout(5, 0).total_bytes == 0);
  // the last row's last histogram and the last counts stay inside their areas
  REQUIRE((dd::hist_index(255, 3) + 256) * 4 == w.hist_bytes);
  REQUIRE((dd::counts_index(255, 15, 16) + 2) * 4 == w.counts_bytes);
  REQUIRE((dd::state_index(255, 4) + 2) * 4 == w.state_bytes);
  REQUIRE(dd::state_writer_chunk(dd::plan_row(100000, 500, 9000, 16, 100000, true), dd::kEvictChunk) == 1);
  REQUIRE(dd::state_writer_chunk(dd::plan_row(100000, 500, 4, 16, 100000, true), dd::kEvictChunk) == 0);

  REQUIRE(dd::one_block_smem_bytes(0) == 16);
  REQUIRE(dd::one_block_smem_bytes(4096) == 16384);
  REQUIRE(dd::one_block_smem_bytes(4097) == 16400);
  const std::size_t h100 = 232448, a100 = 166912;
  REQUIRE(dd::auto_one_block_per_row(256, 4096, 132, h100));     // many short rows
  REQUIRE(dd::auto_one_block_per_row(8, 4096, 132, h100));       // few short rows: one launch
  REQUIRE(dd::auto_one_block_per_row(256, 16384, 132, h100));    // many medium rows
  REQUIRE(!dd::auto_one_block_per_row(8, 16384, 132, h100));     // few medium rows: spread them
  REQUIRE(!dd::auto_one_block_per_row(256, 32768, 132, h100));   // long rows
  REQUIRE(!dd::auto_one_block_per_row(8, 131072, 132, h100));
  REQUIRE(dd::auto_one_block_per_row(256, 16384, 108, a100));
  REQUIRE(!dd::auto_one_block_per_row(256, 8192, 108, 16 * 1024));  // does not fit: never one block
}

TEST_CASE("copy unit follows row size, strides and alignment", "[evict][cuda][host]") {
  REQUIRE(dd::copy_unit_bytes(0) == 16);
  REQUIRE(dd::copy_unit_bytes(128 * 2) == 16);            // head_dim 128 bf16
  REQUIRE(dd::copy_unit_bytes(64 * 2 | 0x1000) == 16);    // head_dim 64 bf16, aligned base
  REQUIRE(dd::copy_unit_bytes(64 * 4 | 0x1008) == 8);     // 8-byte aligned base
  REQUIRE(dd::copy_unit_bytes(7 * 4) == 4);               // head_dim 7 float
  REQUIRE(dd::copy_unit_bytes(3 * 2) == 2);               // head_dim 3 half
  REQUIRE(dd::copy_unit_bytes(128 * 2 | 0x1001) == 1);
}

TEST_CASE("row validation and building over device-layer bookkeeping", "[evict][cuda][host]") {
  alignas(16) static std::uint16_t ks[2][4 * 64 * 8], vs[2][4 * 64 * 8];
  static std::int32_t ps[2][4 * 64];
  FakeLayer<std::uint16_t> src(ks[0], vs[0], ps[0], 4, 8, 64, 0);
  FakeLayer<std::uint16_t> dst(ks[1], vs[1], ps[1], 4, 8, 32, 0);
  src.set_size(0, 64);
  src.set_size(1, 10);
  src.set_size(2, 0);
  src.set_size(3, 40);
  REQUIRE(src.max_size() == 64);
  REQUIRE(src.bytes() == (64u + 10u + 0u + 40u) * 8u * 2u * 2u);
  REQUIRE(src.bytes_allocated() == 4u * 64u * 8u * 2u * 2u);
  REQUIRE(src.key(1, 3) == ks[0] + 64 * 8 + 3 * 8);
  REQUIRE(src.positions(2) == ps[0] + 128);
  REQUIRE_THROWS_AS(src.set_size(0, 65), depthkv::Error);
  REQUIRE_THROWS_AS(src.set_size(4, 1), depthkv::Error);

  float fake_scores[4 * 64];
  std::vector<dc::EvictRow> rows;
  {
    const int keep[4] = {20, 100, 0, 12};
    dc::append_evict_rows(rows, src, dst, fake_scores, 64, keep, 2, 8);
    REQUIRE(rows.size() == 4u);
    REQUIRE(dst.size(0) == 20);
    REQUIRE(dst.size(1) == 10);
    REQUIRE(dst.size(2) == 0);
    REQUIRE(dst.size(3) == 12);
    REQUIRE(rows[1].scores == fake_scores + 64);
    REQUIRE(rows[3].src_k == src.key(3, 0));
    REQUIRE(rows[3].dst_v == dst.value(3, 0));
    REQUIRE(rows[3].dst_positions == dst.positions(3));
    REQUIRE(rows[3].src_token_stride == 8);
    REQUIRE(rows[0].n == 64);
    REQUIRE(rows[0].k == 20);
  }
  {
    const int keep[4] = {20, 9, 0, 12};  // head 1: 9 < 2 + 8 protected, and 9 < 10 tokens
    REQUIRE_THROWS_AS(dc::append_evict_rows(rows, src, dst, fake_scores, 64, keep, 2, 8), depthkv::Error);
  }
  {
    const int keep[4] = {40, 10, 0, 12};  // head 0 keeps 40 > destination capacity 32
    REQUIRE_THROWS_AS(dc::append_evict_rows(rows, src, dst, fake_scores, 64, keep, 2, 8), depthkv::Error);
  }
  {
    const int keep[4] = {-1, 10, 0, 12};
    REQUIRE_THROWS_AS(dc::append_evict_rows(rows, src, dst, fake_scores, 64, keep, 2, 8), depthkv::Error);
  }
  {
    const int keep[4] = {20, 10, 0, 12};  // in place: rejected
    FakeLayer<std::uint16_t> same(ks[0], vs[0], ps[0], 4, 8, 64, 0);
    REQUIRE_THROWS_AS(dc::append_evict_rows(rows, src, same, fake_scores, 64, keep, 2, 8), depthkv::Error);
  }
  {
    const int keep[4] = {20, 10, 0, 12};
    FakeLayer<std::uint16_t> other(ks[1], vs[1], ps[1], 4, 16, 32, 0);  // head_dim differs
    REQUIRE_THROWS_AS(dc::append_evict_rows(rows, src, other, fake_scores, 64, keep, 2, 8), depthkv::Error);
  }
  REQUIRE(rows.size() == 4u);  // failed calls appended nothing

  dc::EvictRow r;
  r.n = 10;
  r.k = 5;
  REQUIRE_THROWS_AS(dd::check_evict_row(r, 0, 8, 0, 0), depthkv::Error);  // null scores
  r.scores = fake_scores;
  REQUIRE_NOTHROW(dd::check_evict_row(r, 0, 8, 0, 0));
  r.dst_k = ks[1];
  REQUIRE_THROWS_AS(dd::check_evict_row(r, 0, 8, 0, 0), depthkv::Error);  // no source keys
  r.src_k = ks[0];
  r.src_token_stride = 8;
  r.dst_token_stride = 4;
  REQUIRE_THROWS_AS(dd::check_evict_row(r, 0, 8, 0, 0), depthkv::Error);  // stride below head_dim
  r.dst_token_stride = 8;
  REQUIRE_NOTHROW(dd::check_evict_row(r, 0, 8, 0, 0));
  REQUIRE_THROWS_AS(dd::check_evict_row(r, 0, 8, -1, 0), depthkv::Error);
  r.k = 12;
  r.scores = nullptr;
  REQUIRE_NOTHROW(dd::check_evict_row(r, 0, 8, 0, 0));  // keep all: no scores needed

  // strided views and shape checks
  FakeLayer<float> strided(reinterpret_cast<float*>(ks[0]), reinterpret_cast<float*>(vs[0]), nullptr, 2, 8, 16, 3, 12);
  REQUIRE(strided.token_stride() == 12);
  REQUIRE(strided.head_stride() == 16 * 12);
  REQUIRE(strided.positions(1) == nullptr);
  REQUIRE(strided.size(1) == 3);
  REQUIRE_THROWS_AS(FakeLayer<float>(reinterpret_cast<float*>(ks[0]), reinterpret_cast<float*>(vs[0]), nullptr, 2, 8, 16, 3, 4),
                    depthkv::Error);
  REQUIRE_THROWS_AS(FakeLayer<float>(reinterpret_cast<float*>(ks[0]), reinterpret_cast<float*>(vs[0]), nullptr, 2, 8, 16, 17),
                    depthkv::Error);
}

TEST_CASE("device-layer bookkeeping over a token-major (llama.cpp) layout", "[evict][cuda][host]") {
  // [cap][n_kv_heads * head_dim] keys and values: head_stride = head_dim, token_stride = n_kv * head_dim
  alignas(16) static float k[64 * 4 * 8], v[64 * 4 * 8], dk[4 * 32 * 8], dv[4 * 32 * 8];
  FakeLayer<float> src(k, v, nullptr, 4, 8, 64, 64, /*token_stride=*/32, /*head_stride=*/8);
  FakeLayer<float> dst(dk, dv, nullptr, 4, 8, 32, 0);
  REQUIRE(src.key(2, 5) == k + 5 * 32 + 2 * 8);
  REQUIRE(src.value(3, 63) == v + 63 * 32 + 3 * 8);
  float fake_scores[4 * 64];
  std::vector<dc::EvictRow> rows;
  const int keep[4] = {20, 32, 1, 32};
  dc::append_evict_rows(rows, src, dst, fake_scores, 64, keep, 0, 0);
  REQUIRE(rows.size() == 4u);
  REQUIRE(rows[2].src_k == k + 16);
  REQUIRE(rows[2].src_token_stride == 32);
  REQUIRE(rows[2].dst_token_stride == 8);
  REQUIRE(dst.size(3) == 32);
  // overlapping strides: named, as on the host (detail/strided_rows.hpp)
  try {
    FakeLayer<float> bad(k, v, nullptr, 4, 8, 64, 0, /*token_stride=*/31, /*head_stride=*/8);
    FAIL("expected an error");
  } catch (const depthkv::Error& e) {
    REQUIRE(std::string(e.what()).find("head_stride 8") != std::string::npos);
  }
  REQUIRE_THROWS_AS(FakeLayer<float>(k, k + 4, nullptr, 4, 8, 64, 0, 32, 8), depthkv::Error);  // K/V overlap
  REQUIRE_NOTHROW(FakeLayer<float>(k, k + 16, nullptr, 2, 8, 64, 0, 32, 8));  // [cap][K|V][2][8] in one buffer
}

// ---- robustness: failed digit search, parameter checks, overrun sentinels ----------------------

namespace {

/// Emulates warp_find_digit with its no-bin fallback: the lane whose 8 bins hold `rank` walks
/// them; when no lane does (rank 0 or above the total), lane 0 writes {0, 0}. Returns the choice
/// and how many lanes wrote it (exactly one, always).
dd::DigitChoice emulate_warp_find_digit(const std::vector<std::uint32_t>& hist, std::uint32_t rank, int& writers) {
  dd::DigitChoice out{0xdeadbeefu, 0xdeadbeefu};  // "uninitialised shared memory"
  writers = 0;
  std::uint32_t incl = 0;
  bool any = false;
  std::vector<std::uint32_t> above_of(32), incl_of(32);
  for (int lane = 0; lane < 32; ++lane) {
    std::uint32_t sum = 0;
    for (int j = 0; j < 8; ++j) sum += hist[static_cast<std::size_t>(255 - 8 * lane - j)];
    above_of[static_cast<std::size_t>(lane)] = incl;
    incl += sum;
    incl_of[static_cast<std::size_t>(lane)] = incl;
    any = any || (above_of[static_cast<std::size_t>(lane)] < rank && rank <= incl);
  }
  if (!any) {
    out = dd::DigitChoice{0u, 0u};
    writers = 1;
    return out;
  }
  for (int lane = 0; lane < 32; ++lane) {
    std::uint32_t above = above_of[static_cast<std::size_t>(lane)];
    if (!(above < rank && rank <= incl_of[static_cast<std::size_t>(lane)])) continue;
    bool f = false;
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t c = hist[static_cast<std::size_t>(255 - 8 * lane - j)];
      if (!f && rank <= above + c) {
        out = dd::DigitChoice{static_cast<std::uint32_t>(255 - 8 * lane - j), rank - above};
        f = true;
        ++writers;
      }
      above += c;
    }
  }
  return out;
}

/// Replays copy_rows_unit's addressing for one CTA: output q (`slots[q]` its source slot) goes to
/// destination token dst_base + q, in units of `unit` bytes, `row_bytes / unit` units per token.
void replay_gather(const std::vector<unsigned char>& src, std::vector<unsigned char>& dst, const CtaOutput& cta,
                   std::size_t row_bytes, std::size_t src_stride, std::size_t dst_stride, int unit) {
  const std::uint32_t L = static_cast<std::uint32_t>(row_bytes) / static_cast<std::uint32_t>(unit);
  const std::uint32_t total = static_cast<std::uint32_t>(cta.second.size()) * L;
  for (std::uint32_t w = 0; w < total; ++w) {
    const std::uint32_t tok = w / L, part = w - tok * L;
    const std::size_t soff = static_cast<std::size_t>(cta.second[tok]) * src_stride + static_cast<std::size_t>(part) * static_cast<std::size_t>(unit);
    const std::size_t doff = static_cast<std::size_t>(cta.first + static_cast<std::int64_t>(tok)) * dst_stride +
                             static_cast<std::size_t>(part) * static_cast<std::size_t>(unit);
    REQUIRE(doff + static_cast<std::size_t>(unit) <= dst.size());  // inside the destination allocation
    std::memcpy(dst.data() + doff, src.data() + soff, static_cast<std::size_t>(unit));
  }
}

}  // namespace

TEST_CASE("digit search without a bin: lane 0 writes the failed choice, the select fails visibly", "[evict][cuda][host]") {
  REQUIRE(dc::EvictStatus::kSelectFailed != 0u);
  REQUIRE((dc::EvictStatus::kSelectFailed &
           (dc::EvictStatus::kNaNScore | dc::EvictStatus::kBadKeep | dc::EvictStatus::kBadRow)) == 0u);
  std::vector<std::uint32_t> h(256, 0u);
  h[255] = 2;
  h[100] = 3;
  h[0] = 1;  // total 6
  for (std::uint32_t rank : {0u, 7u, 100u, 0xffffffffu}) {
    INFO("rank " << rank);
    REQUIRE(dd::digit_not_found(dd::find_digit(h.data(), rank)));
    int writers = 0;
    const dd::DigitChoice w = emulate_warp_find_digit(h, rank, writers);
    REQUIRE(writers == 1);  // the shared choice is always written: no read of uninitialised memory
    REQUIRE(dd::digit_not_found(w));
    const dd::Threshold t = dd::radix_step(dd::Threshold{0u, rank}, w, 0, 32);
    REQUIRE(dd::select_failed(t));
  }
  for (std::uint32_t rank = 1; rank <= 6; ++rank) {
    int writers = 0;
    const dd::DigitChoice w = emulate_warp_find_digit(h, rank, writers);
    REQUIRE(writers == 1);
    REQUIRE(!dd::digit_not_found(w));
    REQUIRE(w.digit == dd::find_digit(h.data(), rank).digit);
    REQUIRE(w.rank == dd::find_digit(h.data(), rank).rank);
    REQUIRE(!dd::select_failed(dd::radix_step(dd::Threshold{0u, rank}, w, 0, 32)));
  }
  // a failed step stays failed through the later passes (they search for rank 0)
  dd::Threshold t = dd::failed_threshold();
  for (int pass = 1; pass < 4; ++pass) t = dd::radix_step(t, dd::find_digit(h.data(), t.need), pass, 32);
  REQUIRE(dd::select_failed(t));
  REQUIRE(t.key == 0xffffffffu);
  // the failed threshold keeps no middle key, whatever the keys (even 0xffffffff) and counts
  REQUIRE(!dd::keeps(0xffffffffu, t, 0u));
  REQUIRE(!dd::keeps(0u, t, 0u));
  REQUIRE(dd::mid_rank(0u, 12u, t.need) == 0u);
  std::vector<std::uint32_t> keys = {5u, 0xffffffffu, 7u, 0xffffffffu, 0u};
  REQUIRE(emulate_compact(keys, 0, 5, 10, t, 0u, 0u, 32) == 0);
  // a row whose select fails keeps its protected tokens only, at the usual output indices
  const dd::RowPlan p = dd::plan_row(100, 50, 4, 8, 100, true);
  REQUIRE(p.select);
  REQUIRE(dd::kept_before(p, p.hi, dd::mid_rank(0u, 0u, t.need)) == p.lo);
}

TEST_CASE("parameter checks: length limit of the grid, workspace alignment, clear reasons", "[evict][cuda][host]") {
  REQUIRE(dd::kEvictMaxN == 65535 * 8192);
  REQUIRE(dd::kEvictMaxN == 536862720);
  REQUIRE(dd::evict_chunks(dd::kEvictMaxN) == 65535);  // gridDim.y <= 65535
  REQUIRE(dd::evict_chunks(dd::kEvictMaxN + 1) == 65536);
  const auto problem = [](int n_rows, int max_n, int head_dim, const void* ws, std::size_t bytes, int sink = 0,
                          int recent = 0, bool rows_null = false) {
    return dd::evict_params_problem(n_rows, rows_null, max_n, head_dim, 2, sink, recent, ws, bytes);
  };
  const std::size_t need = dd::evict_workspace_layout(4, 100000).total_bytes;
  REQUIRE(need > 0);
  REQUIRE(need % dd::kEvictWorkspaceAlignment == 0u);
  const void* aligned = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
  REQUIRE(problem(4, 100000, 128, aligned, need) == nullptr);
  REQUIRE(problem(4, dd::kEvictMaxN, 128, aligned, dd::evict_workspace_layout(4, dd::kEvictMaxN).total_bytes) == nullptr);
  const auto has = [](const char* why, const char* word) { return why != nullptr && std::strstr(why, word) != nullptr; };
  REQUIRE(has(problem(4, dd::kEvictMaxN + 1, 128, aligned, std::size_t{1} << 40), "kEvictMaxN"));
  for (std::uintptr_t off : {1u, 4u, 16u, 128u})
    REQUIRE(has(problem(4, 100000, 128, reinterpret_cast<const void*>((std::uintptr_t{1} << 20) + off), need), "aligned"));
  REQUIRE(has(problem(4, 100000, 128, aligned, need - 1), "smaller"));
  REQUIRE(has(problem(4, 100000, 128, nullptr, need), "null workspace"));
  REQUIRE(has(problem(-1, 10, 128, aligned, need), "n_rows"));
  REQUIRE(has(problem(4, -1, 128, aligned, need), "max_n"));
  REQUIRE(has(problem(4, 10, 0, aligned, need), "head_dim"));
  REQUIRE(has(problem(4, 10, 128, aligned, need, -1), "n_sink"));
  REQUIRE(has(problem(4, 10, 128, aligned, need, 0, 0, true), "row table"));
  REQUIRE(has(problem(4, 10, 0x40000000, aligned, need), "head_dim"));
  // nothing to do: no workspace needed, any pointer (even null or misaligned) and head_dim 0 accepted
  REQUIRE(problem(0, 0, 0, nullptr, 0) == nullptr);
  REQUIRE(problem(0, 1000, 0, reinterpret_cast<const void*>(std::uintptr_t{3}), 0) == nullptr);
  // host-side row validation rejects a row the grid cannot hold
  dc::EvictRow r;
  r.n = dd::kEvictMaxN + 1;
  r.k = r.n;
  REQUIRE_THROWS_AS(dd::check_evict_row(r, 0, 8, 0, 0), depthkv::Error);
  r.n = dd::kEvictMaxN;
  REQUIRE_NOTHROW(dd::check_evict_row(r, 0, 8, 0, 0));
}

TEST_CASE("replayed gather and kept-slot writes leave every sentinel past n_kept and every stride pad", "[evict][cuda][host]") {
  std::mt19937_64 rng(1919);
  constexpr unsigned char kPattern = 0xa5;
  constexpr std::int32_t kSentinel = -1;
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6000);
    const int sink = static_cast<int>(rng() % 5), recent = static_cast<int>(rng() % 40);
    const int pc = std::min(n, sink + recent);
    const int k = pc + static_cast<int>(rng() % static_cast<std::uint64_t>(n - pc + 2));
    const RandomRow row = random_row(rng, n, dd::ScoreFormat::kF32);
    const std::vector<std::int32_t> ref = cpu_select(row.scores, row.positions, k, sink, recent);
    const int n_kept = static_cast<int>(ref.size());
    const std::size_t elem = (trial % 3 == 0) ? 4u : 2u;
    const std::size_t hd = std::vector<std::size_t>{7, 64, 100, 128}[rng() % 4];
    const std::size_t pad = std::vector<std::size_t>{0, 3, 8}[rng() % 3];
    const std::size_t row_bytes = hd * elem, src_stride = row_bytes, dst_stride = (hd + pad) * elem;
    const int cap = n + static_cast<int>(rng() % 50);  // destination capacity >= n_kept, with slack
    const int unit = dd::copy_unit_bytes(static_cast<std::uint64_t>(row_bytes) | src_stride | dst_stride);
    std::vector<unsigned char> src(static_cast<std::size_t>(n) * src_stride);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    const bool multi = trial % 2 == 1;
    std::vector<CtaOutput> ctas;
    std::vector<std::int32_t> sel;
    if (multi) {
      sel = emulate_multi_block(row.keys, k, sink, recent, 32, 512, 64, &ctas);
    } else {
      sel = emulate_one_block(row.keys, k, sink, recent, 32, 128);
      ctas.emplace_back(0, sel);
    }
    REQUIRE(sel == ref);
    std::vector<unsigned char> dst(static_cast<std::size_t>(cap) * dst_stride, kPattern);
    std::vector<std::int32_t> kept_slots(static_cast<std::size_t>(cap), kSentinel);
    for (const CtaOutput& cta : ctas) {
      replay_gather(src, dst, cta, row_bytes, src_stride, dst_stride, unit);
      for (std::size_t q = 0; q < cta.second.size(); ++q) {  // write_kept_meta
        const std::size_t d = static_cast<std::size_t>(cta.first) + q;
        REQUIRE(d < kept_slots.size());
        kept_slots[d] = cta.second[q];
      }
    }
    INFO("trial " << trial << " n " << n << " k " << k << " hd " << hd << " pad " << pad << " unit " << unit);
    bool ok = true;
    for (int q = 0; q < cap && ok; ++q) {
      const unsigned char* g = dst.data() + static_cast<std::size_t>(q) * dst_stride;
      std::size_t from = 0;
      if (q < n_kept) {
        ok = std::memcmp(g, src.data() + static_cast<std::size_t>(ref[static_cast<std::size_t>(q)]) * src_stride, row_bytes) == 0 &&
             kept_slots[static_cast<std::size_t>(q)] == ref[static_cast<std::size_t>(q)];
        from = row_bytes;
      } else {
        ok = kept_slots[static_cast<std::size_t>(q)] == kSentinel;
      }
      for (std::size_t b = from; b < dst_stride && ok; ++b) ok = g[b] == kPattern;
    }
    REQUIRE(ok);
    ++checked;
  }
  REQUIRE(checked == 40);
}
