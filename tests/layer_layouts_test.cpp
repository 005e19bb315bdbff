// Tests of LayerView over every strided layout (kv_cache.hpp, detail/strided_rows.hpp):
// head-major (HF), token-major (llama.cpp), padded, K and V interleaved in one buffer; append,
// per-head append, eviction and compaction against the owning HostLayer and a naive reference;
// the stride checks against a brute-force overlap test.
#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "depthkv/evictor.hpp"
#include "depthkv/kv_cache.hpp"

using I32 = std::int32_t;

namespace {

/// One engine layout of a layer: strides, and where values start relative to keys in one buffer.
struct Layout {
  std::string name;
  int n_kv_heads, head_dim, capacity;
  std::ptrdiff_t head_stride, token_stride;
  std::ptrdiff_t value_offset;  // values = buffer + value_offset; keys = buffer (one shared buffer)
  std::ptrdiff_t elements;      // buffer length
};

Layout head_major(int nh, int hd, int cap) {
  const std::ptrdiff_t per = static_cast<std::ptrdiff_t>(nh) * cap * hd;
  return {"HF head-major [nh][cap][hd]", nh, hd, cap, static_cast<std::ptrdiff_t>(cap) * hd, hd, per, 2 * per};
}
Layout token_major(int nh, int hd, int cap) {
  const std::ptrdiff_t per = static_cast<std::ptrdiff_t>(nh) * cap * hd;
  return {"llama.cpp token-major [cap][nh*hd]", nh, hd, cap, hd, static_cast<std::ptrdiff_t>(nh) * hd, per, 2 * per};
}
Layout padded_token_major(int nh, int hd, int cap) {  // each head row padded by 8, each token by 8 more
  const std::ptrdiff_t hs = hd + 8, ts = static_cast<std::ptrdiff_t>(nh) * hs + 8, per = cap * ts;
  return {"padded token-major", nh, hd, cap, hs, ts, per, 2 * per};
}
Layout padded_head_major(int nh, int hd, int cap) {
  const std::ptrdiff_t ts = hd + 8, hs = cap * ts + 24, per = nh * hs;
  return {"padded head-major", nh, hd, cap, hs, ts, per, 2 * per};
}
Layout kv_interleaved(int nh, int hd, int cap) {  // [cap][K|V][nh][hd] in one buffer
  const std::ptrdiff_t hs = hd, ts = 2 * static_cast<std::ptrdiff_t>(nh) * hd;
  return {"K/V interleaved [cap][2][nh][hd]", nh, hd, cap, hs, ts, static_cast<std::ptrdiff_t>(nh) * hd, cap * ts};
}

constexpr float kSentinel = -1000.0f;  // exact in half and bfloat16

/// The engine's buffer: 64-byte aligned (so the streaming path of the compaction runs), filled with
/// a sentinel, and a map of which elements belong to some (head, slot) row.
template <typename T>
struct EngineBuffer {
  std::vector<T> raw;
  T* base = nullptr;
  std::vector<char> in_row;
  explicit EngineBuffer(const Layout& L) : raw(static_cast<std::size_t>(L.elements) + 64, T(kSentinel)) {
    std::size_t off = 0;
    while (reinterpret_cast<std::uintptr_t>(raw.data() + off) % 64 != 0) ++off;
    base = raw.data() + off;
    in_row.assign(static_cast<std::size_t>(L.elements), 0);
    for (int h = 0; h < L.n_kv_heads; ++h)
      for (int s = 0; s < L.capacity; ++s)
        for (int d = 0; d < L.head_dim; ++d) {
          const std::ptrdiff_t e = h * L.head_stride + s * L.token_stride + d;
          in_row[static_cast<std::size_t>(e)] = 1;
          in_row[static_cast<std::size_t>(e + L.value_offset)] = 1;
        }
  }
  /// True when every element outside the rows still holds the sentinel.
  bool padding_untouched() const {
    for (std::size_t e = 0; e < in_row.size(); ++e)
      if (!in_row[e] && static_cast<float>(base[e]) != kSentinel) return false;
    return true;
  }
};

/// What a head should hold: positions and the float rows given to append.
struct RefHead {
  std::vector<I32> pos;
  std::vector<std::vector<float>> k, v;
};

template <typename T, class A, class B>
void require_same(const A& a, const B& b, const std::vector<RefHead>& ref) {
  REQUIRE(a.n_kv_heads() == b.n_kv_heads());
  REQUIRE(a.bytes() == b.bytes());
  REQUIRE(a.max_size() == b.max_size());
  std::size_t tokens = 0;
  for (int h = 0; h < a.n_kv_heads(); ++h) {
    const RefHead& r = ref[static_cast<std::size_t>(h)];
    const int n = static_cast<int>(r.pos.size());
    tokens += r.pos.size();
    REQUIRE(a.size(h) == n);
    REQUIRE(b.size(h) == n);
    bool same = true;  // one assertion per head (the test runs under the sanitizers too)
    for (int i = 0; i < n; ++i) {
      same = same && a.positions(h)[i] == r.pos[static_cast<std::size_t>(i)] &&
             b.positions(h)[i] == r.pos[static_cast<std::size_t>(i)];
      for (int d = 0; d < a.head_dim(); ++d) {
        const float wk = static_cast<float>(static_cast<T>(r.k[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)]));
        const float wv = static_cast<float>(static_cast<T>(r.v[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)]));
        same = same && static_cast<float>(a.key(h, i)[d]) == wk && static_cast<float>(a.value(h, i)[d]) == wv &&
               static_cast<float>(b.key(h, i)[d]) == wk && static_cast<float>(b.value(h, i)[d]) == wv;
      }
    }
    INFO("head " << h);
    REQUIRE(same);
  }
  REQUIRE(a.bytes() == tokens * static_cast<std::size_t>(a.head_dim()) * 2 * sizeof(T));
}

/// Random append / append_head / evict rounds on a LayerView over `L` and on a HostLayer, with the
/// same data and scores; every round compares both with the reference.
template <typename T>
void run_layout(const Layout& L, std::uint32_t seed, const depthkv::EvictOptions& opt) {
  INFO(L.name << " nh " << L.n_kv_heads << " hd " << L.head_dim << " cap " << L.capacity << " threads "
              << opt.n_threads << " streaming " << opt.streaming_min_bytes);
  EngineBuffer<T> buf(L);
  depthkv::LayerView<T> view(buf.base, buf.base + L.value_offset, L.n_kv_heads, L.head_dim, L.capacity, 0,
                             L.head_stride, L.token_stride);
  REQUIRE(view.head_stride() == L.head_stride);
  REQUIRE(view.token_stride() == L.token_stride);
  depthkv::HostLayer<T> host(L.n_kv_heads, L.head_dim);
  std::vector<RefHead> ref(static_cast<std::size_t>(L.n_kv_heads));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  auto row = [&]() {
    std::vector<float> r(static_cast<std::size_t>(L.head_dim));
    for (auto& x : r) x = u(rng);
    return r;
  };
  I32 next_pos = 0;
  for (int round = 0; round < 4; ++round) {
    // 1. whole-layer appends while every head has room
    std::uniform_int_distribution<int> n_app(0, L.capacity / 2);
    const int appends = std::min(n_app(rng), L.capacity - view.max_size());
    for (int t = 0; t < appends; ++t) {
      std::vector<float> k, v;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        std::vector<float> kr = row(), vr = row();
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
        RefHead& r = ref[static_cast<std::size_t>(h)];
        r.pos.push_back(next_pos);
        r.k.push_back(kr);
        r.v.push_back(vr);
      }
      view.append(k.data(), v.data(), next_pos);
      host.append(k.data(), v.data(), next_pos);
      next_pos += 1 + static_cast<I32>(rng() % 3);
    }
    // 2. per-head appends: heads of different lengths
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const int extra = static_cast<int>(rng() % 4);
      for (int t = 0; t < extra && view.size(h) < L.capacity; ++t) {
        std::vector<float> kr = row(), vr = row();
        view.append_head(h, kr.data(), vr.data(), next_pos);
        host.append_head(h, kr.data(), vr.data(), next_pos);
        RefHead& r = ref[static_cast<std::size_t>(h)];
        r.pos.push_back(next_pos);
        r.k.push_back(kr);
        r.v.push_back(vr);
        ++next_pos;
      }
    }
    require_same<T>(view, host, ref);
    // 3. eviction with per-head budgets (0, all, random), tie-heavy scores
    depthkv::LayerScores scores(static_cast<std::size_t>(L.n_kv_heads));
    std::vector<int> keep(static_cast<std::size_t>(L.n_kv_heads));
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const int n = view.size(h);
      for (int i = 0; i < n; ++i) scores[static_cast<std::size_t>(h)].push_back(static_cast<float>(rng() % 5));
      const int kind = static_cast<int>(rng() % 5);
      keep[static_cast<std::size_t>(h)] = kind == 0 ? 0 : kind == 1 ? n + 1 : static_cast<int>(rng() % (n + 1));
    }
    const depthkv::LayerEviction ev_view = depthkv::evict_layer(view, scores, keep, {}, opt);
    const depthkv::LayerEviction ev_host = depthkv::evict_layer(host, scores, keep, {}, opt);
    REQUIRE(ev_view.kept_slots == ev_host.kept_slots);
    REQUIRE(ev_view.kept_positions == ev_host.kept_positions);
    for (int h = 0; h < L.n_kv_heads; ++h) {
      RefHead& r = ref[static_cast<std::size_t>(h)];
      RefHead kept;
      for (I32 s : ev_view.kept_slots[static_cast<std::size_t>(h)]) {
        kept.pos.push_back(r.pos[static_cast<std::size_t>(s)]);
        kept.k.push_back(r.k[static_cast<std::size_t>(s)]);
        kept.v.push_back(r.v[static_cast<std::size_t>(s)]);
      }
      REQUIRE(kept.pos == ev_view.kept_positions[static_cast<std::size_t>(h)]);
      r = kept;
    }
    require_same<T>(view, host, ref);
    REQUIRE(buf.padding_untouched());
  }
  REQUIRE(view.capacity() == L.capacity);
  REQUIRE(view.bytes_allocated() ==
          static_cast<std::size_t>(L.n_kv_heads) * L.capacity * L.head_dim * 2 * sizeof(T));
}

std::vector<Layout> all_layouts(int nh, int hd, int cap) {
  return {head_major(nh, hd, cap), token_major(nh, hd, cap), padded_token_major(nh, hd, cap),
          padded_head_major(nh, hd, cap), kv_interleaved(nh, hd, cap)};
}

/// Brute force: do two (head, slot) rows of the strided layout overlap?
bool rows_overlap(int nh, int hd, int cap, std::ptrdiff_t hs, std::ptrdiff_t ts) {
  for (int h1 = 0; h1 < nh; ++h1)
    for (int s1 = 0; s1 < cap; ++s1)
      for (int h2 = 0; h2 < nh; ++h2)
        for (int s2 = 0; s2 < cap; ++s2) {
          if (h1 == h2 && s1 == s2) continue;
          const std::ptrdiff_t a = h1 * hs + s1 * ts, b = h2 * hs + s2 * ts;
          if (a < b + hd && b < a + hd) return true;
        }
  return false;
}
/// Brute force: does a key row overlap a value row (values `off` elements after keys)?
bool kv_overlap(int nh, int hd, int cap, std::ptrdiff_t hs, std::ptrdiff_t ts, std::ptrdiff_t off) {
  for (int h1 = 0; h1 < nh; ++h1)
    for (int s1 = 0; s1 < cap; ++s1)
      for (int h2 = 0; h2 < nh; ++h2)
        for (int s2 = 0; s2 < cap; ++s2) {
          const std::ptrdiff_t a = h1 * hs + s1 * ts, b = off + h2 * hs + s2 * ts;
          if (a < b + hd && b < a + hd) return true;
        }
  return false;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const depthkv::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEMPLATE_TEST_CASE("LayerView over every strided layout matches HostLayer under append, evict, compact",
                   "[kv_cache][layout][evict]", float, Eigen::half) {
  // head_dim 8 floats / 16 halves: 32-byte rows, so the non-temporal path runs with streaming 0
  const int hd = sizeof(TestType) == 4 ? 8 : 16;
  std::uint32_t seed = 11;
  for (int nh : {1, 2, 5})
    for (int cap : {0, 1, 7, 40})
      for (const Layout& L : all_layouts(nh, hd, cap))
        for (int threads : {1, 3})
          for (std::size_t streaming : {std::size_t{0}, std::numeric_limits<std::size_t>::max()}) {
            depthkv::EvictOptions opt;
            opt.n_threads = threads;
            opt.streaming_min_bytes = streaming;
            run_layout<TestType>(L, ++seed, opt);
          }
}

TEST_CASE("LayerView layouts: odd head_dim (memmove path) and a whole cache of mixed layouts", "[kv_cache][layout]") {
  std::uint32_t seed = 99;
  for (int nh : {3, 4})
    for (const Layout& L : all_layouts(nh, 3, 25)) run_layout<float>(L, ++seed, depthkv::EvictOptions{});

  // KVCache<LayerView>: layers in different layouts, evicted together with per-head budgets
  const int nh = 3, hd = 4, cap = 12;
  const std::vector<Layout> layouts = all_layouts(nh, hd, cap);
  std::vector<EngineBuffer<float>> bufs;
  for (const Layout& L : layouts) bufs.emplace_back(L);
  depthkv::KVCache<depthkv::LayerView<float>> views;
  depthkv::KVCache<depthkv::HostLayer<float>> hosts;
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    const Layout& L = layouts[l];
    views.add_layer(depthkv::LayerView<float>(bufs[l].base, bufs[l].base + L.value_offset, nh, hd, cap, 0,
                                              L.head_stride, L.token_stride));
    hosts.add_layer(depthkv::HostLayer<float>(nh, hd));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int t = 0; t < cap; ++t)
    for (int l = 0; l < views.n_layers(); ++l) {
      std::vector<float> k(nh * hd), v(nh * hd);
      for (auto& x : k) x = u(rng);
      for (auto& x : v) x = u(rng);
      views.layer(l).append(k.data(), v.data(), 3 * t);
      hosts.layer(l).append(k.data(), v.data(), 3 * t);
    }
  std::vector<depthkv::LayerScores> scores(layouts.size(), depthkv::LayerScores(nh));
  std::vector<std::vector<int>> keep(layouts.size(), std::vector<int>(nh));
  for (std::size_t l = 0; l < layouts.size(); ++l)
    for (int h = 0; h < nh; ++h) {
      for (int i = 0; i < cap; ++i) scores[l][static_cast<std::size_t>(h)].push_back(u(rng));
      // at least the 3 protected tokens; some heads keep all
      keep[l][static_cast<std::size_t>(h)] =
          (l + h) % 4 == 0 ? cap + 1 : 3 + static_cast<int>((l + 2 * h) % static_cast<std::size_t>(cap - 3));
    }
  depthkv::EvictOptions opt;
  opt.n_threads = 4;
  const auto ev_v = depthkv::evict(views, scores, keep, {1, 2}, opt);
  const auto ev_h = depthkv::evict(hosts, scores, keep, {1, 2}, opt);
  REQUIRE(views.bytes() == hosts.bytes());
  REQUIRE(views.bytes_per_layer() == hosts.bytes_per_layer());
  REQUIRE(views.lengths() == hosts.lengths());
  for (int l = 0; l < views.n_layers(); ++l) {
    REQUIRE(ev_v[static_cast<std::size_t>(l)].kept_slots == ev_h[static_cast<std::size_t>(l)].kept_slots);
    REQUIRE(ev_v[static_cast<std::size_t>(l)].kept_positions == ev_h[static_cast<std::size_t>(l)].kept_positions);
    for (int h = 0; h < nh; ++h) {
      REQUIRE(views.layer(l).size(h) == hosts.layer(l).size(h));
      for (int i = 0; i < views.layer(l).size(h); ++i) {
        REQUIRE(views.layer(l).positions(h)[i] == hosts.layer(l).positions(h)[i]);
        REQUIRE(std::memcmp(views.layer(l).key(h, i), hosts.layer(l).key(h, i), hd * sizeof(float)) == 0);
        REQUIRE(std::memcmp(views.layer(l).value(h, i), hosts.layer(l).value(h, i), hd * sizeof(float)) == 0);
      }
    }
    REQUIRE(bufs[static_cast<std::size_t>(l)].padding_untouched());
  }
}

TEST_CASE("LayerView stride checks: exactly the overlapping layouts are rejected, naming the stride",
          "[kv_cache][layout]") {
  std::vector<float> mem(4096, 0.f);
  float* k = mem.data();
  float* v = mem.data() + 2048;  // far apart: only row/row overlaps matter

  SECTION("documented layouts are accepted") {
    for (const Layout& L : all_layouts(4, 8, 16)) {
      INFO(L.name);
      REQUIRE_NOTHROW(depthkv::LayerView<float>(mem.data(), mem.data() + L.value_offset, 4, 8, 16, 0,
                                                L.head_stride, L.token_stride));
    }
    REQUIRE_NOTHROW(depthkv::LayerView<float>(k, v, 1, 8, 16, 0, 0, 8));   // one head: any head_stride
    REQUIRE_NOTHROW(depthkv::LayerView<float>(k, v, 4, 8, 1, 0, 8, 0));    // one slot: any token_stride
    REQUIRE_NOTHROW(depthkv::LayerView<float>(k, v, 4, 8, 0, 0, 0, 0));    // no slots: nothing to overlap
    REQUIRE_NOTHROW(depthkv::LayerView<float>(k, v, 2, 3, 4, 0, 7, 14));   // heads between the slots, odd strides
  }
  SECTION("messages name the bad stride") {
    std::string e = error_of([&] { depthkv::LayerView<float>(k, v, 4, 8, 16, 0, 8, 31); });
    REQUIRE(e.find("head_stride 8") != std::string::npos);  // token-major with a token stride one short
    REQUIRE(e.find("overlaps") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, v, 4, 8, 16, 0, -1, 7); });
    REQUIRE(e.find("token_stride 7 < head_dim 8") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, v, 4, 8, 16, 0, 15 * 8, 8); });  // HF, head_stride one slot short
    REQUIRE(e.find("head_stride 120") != std::string::npos);
    REQUIRE(e.find("row (head 1, slot 0) overlaps row (head 0, slot 15)") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, v, 4, 8, 16, 0, 4, 32); });  // heads half a row apart
    REQUIRE(e.find("head_stride 4") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, v, 2, 8, 16, 0, -8, 16); });
    REQUIRE(e.find("head_stride -8 is negative") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, v, 2, 8, 16, 0, 8, -16); });
    REQUIRE(e.find("token_stride -16 is negative") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, k + 4, 2, 8, 16, 0, 8, 32); });  // V 4 elements after K
    REQUIRE(e.find("keys and values overlap") != std::string::npos);
    e = error_of([&] { depthkv::LayerView<float>(k, k + 40, 2, 8, 16, 0, 8, 16); });  // V on a later key row
    REQUIRE(e.find("keys and values overlap") != std::string::npos);
  }
  SECTION("random strides: the check agrees with a brute-force overlap test") {
    std::mt19937 rng(2024);
    int accepted = 0, rejected = 0;
    for (int rep = 0; rep < 4000; ++rep) {
      const int nh = 1 + static_cast<int>(rng() % 4), hd = 1 + static_cast<int>(rng() % 5),
                cap = static_cast<int>(rng() % 6);
      const std::ptrdiff_t hs = static_cast<std::ptrdiff_t>(rng() % 40), ts = static_cast<std::ptrdiff_t>(rng() % 24);
      const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(rng() % 160);
      INFO("nh " << nh << " hd " << hd << " cap " << cap << " hs " << hs << " ts " << ts << " off " << off);
      const bool bad_rows = rows_overlap(nh, hd, cap, hs, ts);
      const bool bad = bad_rows || kv_overlap(nh, hd, cap, hs, ts, off);
      float* base = mem.data() + 200;
      bool threw = false;
      try {
        depthkv::LayerView<float> view(base, base + off, nh, hd, cap, 0, hs, ts);
      } catch (const depthkv::Error&) {
        threw = true;
      }
      REQUIRE(threw == bad);
      (bad ? rejected : accepted) += 1;
      // values before keys: the same distances, mirrored
      threw = false;
      try {
        depthkv::LayerView<float> view(base + off, base, nh, hd, cap, 0, hs, ts);
      } catch (const depthkv::Error&) {
        threw = true;
      }
      REQUIRE(threw == bad);
      // the row check alone, keys and values far apart
      REQUIRE(error_of([&] { depthkv::detail::check_row_strides(nh, hd, cap, hs, ts); }).empty() == !bad_rows);
    }
    REQUIRE(accepted > 300);
    REQUIRE(rejected > 300);
  }
}

TEST_CASE("LayerView errors leave the view and the engine memory unchanged", "[kv_cache][layout]") {
  const Layout L = token_major(2, 4, 3);
  EngineBuffer<float> buf(L);
  depthkv::LayerView<float> view(buf.base, buf.base + L.value_offset, 2, 4, 3, 0, L.head_stride, L.token_stride);
  const float kv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  view.append(kv, kv, 0);
  view.append_head(1, kv, kv, 1);
  view.append_head(1, kv, kv, 2);
  const std::vector<float> before(buf.raw);
  REQUIRE_THROWS_AS(view.append(kv, kv, 3), depthkv::Error);  // head 1 is full: head 0 not appended either
  REQUIRE_THROWS_AS(view.append_head(1, kv, kv, 3), depthkv::Error);
  REQUIRE_THROWS_AS(view.append_head(0, kv, kv, 0), depthkv::Error);  // position does not increase
  REQUIRE_THROWS_AS(view.append_head(2, kv, kv, 5), depthkv::Error);
  const I32 unsorted[] = {1, 0};
  REQUIRE_THROWS_AS(view.compact(1, unsorted, 2), depthkv::Error);
  REQUIRE_THROWS_AS(view.compact(1, nullptr, 1), depthkv::Error);
  const I32 bad_pos[] = {2, 2, 3};
  REQUIRE_THROWS_AS(view.set_positions(1, bad_pos), depthkv::Error);
  REQUIRE(buf.raw == before);
  REQUIRE(view.size(0) == 1);
  REQUIRE(view.size(1) == 3);
  REQUIRE(view.positions(1)[2] == 2);
  const I32 good_pos[] = {4, 9, 10};
  view.set_positions(1, good_pos);
  REQUIRE(view.positions(1)[1] == 9);
}
