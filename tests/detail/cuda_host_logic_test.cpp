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

#if !defined(DEPTHKV_TEST_NO_CPU_EVICTOR) && __has_include("depthkv/evictor.hpp")
#include "depthkv/evictor.hpp"
#define DEPTHKV_TEST_HAVE_EVICTOR 1
#endif

namespace dc = depthkv::cuda;
namespace dd = depthkv::cuda::detail;

namespace {

// ---- references --------------------------------------------------------------------------------

/// Naive select_keep: protected slots, then unprotected by (score desc, position asc), ascending.
std::vector<std::int32_t> naive_select_keep(const float* s, const std::int32_t* pos, int n, int k, int sink, int recent) {
  std::vector<std::int32_t> out;
  if (k >= n) {
    out.resize(static_cast<std::size_t>(n));
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  std::vector<std::int32_t> cand;
  for (int i = 0; i < n; ++i) {
    if (depthkv::detail::is_protected(i, n, sink, recent))
      out.push_back(i);
    else
      cand.push_back(i);
  }
  const int take = k - static_cast<int>(out.size());
  REQUIRE(take >= 0);
  std::sort(cand.begin(), cand.end(), [&](std::int32_t a, std::int32_t b) {
    return depthkv::detail::ranks_before(s[a], pos[a], s[b], pos[b]);
  });
  out.insert(out.end(), cand.begin(), cand.begin() + take);
  std::sort(out.begin(), out.end());
  return out;
}

/// The CPU path: the naive reference, cross-checked with depthkv::select_keep when it exists.
/// With 16-bit scores (`raw16` non-empty) the CPU evictor's 16-bit overload is checked too.
std::vector<std::int32_t> cpu_select(const std::vector<float>& s, const std::vector<std::int32_t>& pos, int k, int sink,
                                     int recent, const std::vector<std::uint16_t>& raw16 = {}, bool bf16 = false) {
  const int n = static_cast<int>(s.size());
  std::vector<std::int32_t> ref = naive_select_keep(s.data(), pos.data(), n, k, sink, recent);
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
std::vector<std::int32_t> emulate_multi_block(const std::vector<std::uint32_t>& key_of_slot, int k, int sink, int recent,
                                              int bits, int C, int NT) {
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
  const int mode = static_cast<int>(rng() % 5);
  std::int32_t pos = static_cast<std::int32_t>(rng() % 5);
  for (int i = 0; i < n; ++i) {
    r.positions.push_back(pos);
    pos += 1 + static_cast<std::int32_t>(rng() % 3);
    if (fmt == dd::ScoreFormat::kF32) {
      float f = 0;
      switch (mode) {
        case 0: f = std::uniform_real_distribution<float>(-2.f, 2.f)(rng); break;
        case 1: f = static_cast<float>(rng() % 4) * 0.5f; break;            // heavy ties
        case 2: f = 1.0f; break;                                            // all equal
        case 3: f = (rng() % 2) ? 0.0f : -0.0f; break;                      // signed zeros only
        default: {                                                          // raw bit patterns (no NaN)
          std::uint32_t u = static_cast<std::uint32_t>(rng());
          if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;
          std::memcpy(&f, &u, sizeof f);
        }
      }
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
      if (dd::is_nan16(u, fmt)) u = static_cast<std::uint16_t>(u & 0x7c00u);  // keep it finite-or-inf, not NaN
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
  FakeLayer(T* k, T* v, std::int32_t* p, int nh, int hd, int cap, int len, std::ptrdiff_t token_stride = -1) {
    this->init(k, v, p, nh, hd, cap, len, -1, token_stride, -1);
  }
};

}  // namespace

TEST_CASE("ordered_key16 orders half and bfloat16 like their float values", "[evict][cuda][host]") {
  for (dd::ScoreFormat fmt : {dd::ScoreFormat::kF16, dd::ScoreFormat::kBF16}) {
    std::vector<std::uint16_t> pats;
    for (std::uint32_t u = 0; u < 65536u; ++u)
      if (!dd::is_nan16(static_cast<std::uint16_t>(u), fmt)) pats.push_back(static_cast<std::uint16_t>(u));
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
  for (std::uint32_t u = 0; u < 65536u; ++u) nan_count += dd::is_nan16(static_cast<std::uint16_t>(u), dd::ScoreFormat::kF16) ? 1u : 0u;
  REQUIRE(nan_count == 2u * 1023u);
  REQUIRE(dd::is_nan16(0x7fc0u, dd::ScoreFormat::kBF16));
  REQUIRE(!dd::is_nan16(0x7f80u, dd::ScoreFormat::kBF16));  // +inf
  REQUIRE(!dd::is_nan16(0xfc00u, dd::ScoreFormat::kF16));   // -inf
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
  int cases = 0;
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
    ++cases;
  }
  REQUIRE(cases == 600);
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
