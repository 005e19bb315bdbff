// depthkv._core.TokenScorer: the library's token scorers (depthkv/token_scorer.hpp) fed with
// attention probabilities given as arrays ([n_heads, n_queries, n_keys] float32, read in place),
// scoring the slots of a layer given by its size or by key/value arrays
// ([n_kv_heads, n, head_dim] float32, read in place); and keep_tokens (eviction_schedule.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/scorer_registry.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv_py {
namespace {

constexpr const char* kFunc = "TokenScorer";

/// A host layer over key/value arrays [n_kv_heads, n, head_dim] (rows of head_dim contiguous
/// floats, any head and token strides), or, without arrays, a layer of `n` slots per head whose
/// rows are never read (head_dim 1). The Layer members a scorer reads (kv_cache.hpp's concept):
/// n_kv_heads, head_dim, size, key, value.
struct ArrayLayer {
  using Scalar = float;
  const float* keys = nullptr;
  const float* values = nullptr;
  std::int64_t head_stride = 0, token_stride = 0;  ///< elements (keys and values share them)
  int kv_heads = 0, dim = 1;
  std::vector<int> sizes;
  float zero = 0.0f;  ///< the row of a layer without arrays

  int n_kv_heads() const { return kv_heads; }
  int head_dim() const { return dim; }
  int size(int h) const { return sizes[static_cast<std::size_t>(h)]; }
  const float* key(int h, int slot) const { return row(keys, h, slot); }
  const float* value(int h, int slot) const { return row(values, h, slot); }
  const float* row(const float* base, int h, int slot) const {
    return base == nullptr ? &zero : base + h * head_stride + slot * token_stride;
  }
};

/// A checked float32 host array of `ndim` dimensions whose last dimension is contiguous.
void check_float_array(const AnyArray& a, const char* what, std::size_t ndim, const char* shape) {
  DEPTHKV_CHECK_AS(kFunc, a.device_type() == nb::device::cpu::value,
                   what << " must be in host (CPU) memory, got device type " << a.device_type()
                        << " (copy it to the CPU first)");
  DEPTHKV_CHECK_AS(kFunc, a.dtype() == nb::dtype<float>(),
                   what << " must be float32, got " << dtype_name(a.dtype()) << " (convert it: .float() / .astype(numpy.float32))");
  DEPTHKV_CHECK_AS(kFunc, a.ndim() == ndim, what << " must have " << ndim << " dimensions " << shape << ", got " << a.ndim());
  for (std::size_t d = 0; d < ndim; ++d)
    DEPTHKV_CHECK_AS(kFunc, a.shape(d) <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                     what << " dimension " << d << " is too large (" << a.shape(d) << ")");
  if (a.size() == 0) return;  // an empty array: nothing is read (its strides may be 0)
  const std::size_t last = ndim - 1;
  DEPTHKV_CHECK_AS(kFunc, a.shape(last) <= 1 || a.stride(last) == 1,
                   what << " must be contiguous in its last dimension (stride " << a.stride(last)
                        << " elements): pass a contiguous copy");
  for (std::size_t d = 0; d < last; ++d)
    DEPTHKV_CHECK_AS(kFunc, a.shape(d) <= 1 || a.stride(d) > 0,
                     what << " has a non-positive stride in dimension " << d << ": pass a contiguous copy");
}

int dim_of(const AnyArray& a, std::size_t d) { return static_cast<int>(a.shape(d)); }

/// The Python-facing scorer: a TokenScorer plus the checks and array handling of the binding.
class PyScorer {
 public:
  PyScorer(const std::string& scorer, int n_heads, int n_kv_heads, int window, int kernel, const std::string& pooling,
           bool output_aware, int lookahead, double context_weight)
      : scorer_(make_config(scorer, window, kernel, pooling, output_aware, lookahead, context_weight), n_heads,
                n_kv_heads) {}

  const depthkv::TokenScorer& scorer() const { return scorer_; }
  void reset() { scorer_.reset(); }
  void begin_lookahead() { scorer_.begin_lookahead(); }

  /// Attention rows of every query head ([n_heads, n_queries, n_keys]) or of query head `q_head`
  /// ([n_queries, n_keys]), positions q_pos0, q_pos0 + 1, ...; all or nothing.
  void observe(const AnyArray& probs, long long q_pos0, std::optional<int> q_head) {
    const std::size_t nd = q_head ? 2 : 3;
    check_float_array(probs, "probs", nd, q_head ? "[n_queries, n_keys] (one query head)" : "[n_heads, n_queries, n_keys]");
    const int heads = q_head ? 1 : dim_of(probs, 0);
    DEPTHKV_CHECK_AS(kFunc, q_head || heads == scorer_.n_heads(),
                     "probs has " << heads << " query heads, the scorer " << scorer_.n_heads());
    DEPTHKV_CHECK_AS(kFunc, !q_head || (*q_head >= 0 && *q_head < scorer_.n_heads()),
                     "q_head " << *q_head << " outside [0, " << scorer_.n_heads() << ")");
    DEPTHKV_CHECK_AS(kFunc, q_pos0 >= 0 && q_pos0 <= std::numeric_limits<std::int32_t>::max(),
                     "q_pos0 must be in [0, 2^31), got " << q_pos0);
    const int nq = dim_of(probs, nd - 2), n = dim_of(probs, nd - 1);
    const std::int64_t ld = nq <= 1 ? n : probs.stride(nd - 2);
    DEPTHKV_CHECK_AS(kFunc, ld >= n, "probs rows overlap (row stride " << ld << " < " << n << " keys)");
    const auto* base = static_cast<const float*>(probs.data());
    const depthkv::TokenScorer backup = scorer_;  // all or nothing over the heads
    try {
      for (int i = 0; i < heads; ++i) {
        const int q = q_head ? *q_head : i;
        const float* p = base + (q_head ? 0 : i * probs.stride(0));
        scorer_.observe_block(q, static_cast<std::int32_t>(q_pos0), nq, p, static_cast<int>(ld), n);
      }
    } catch (const depthkv::Error& e) {
      scorer_ = backup;
      throw depthkv::Error(std::string(kFunc) + ".observe: " + e.message());
    }
  }

  /// Scores of every slot of a layer: [n_kv_heads, n] float32, or a list of rows when the heads
  /// hold different counts.
  nb::object scores(const nb::handle& n, const nb::handle& keys, const nb::handle& values, const nb::handle& wo) {
    ArrayLayer layer;
    layer.kv_heads = scorer_.n_kv_heads();
    layer.sizes = sizes(n);
    attach(layer, keys, values);
    const std::optional<depthkv::OutputProjection> proj = projection(wo, layer);
    check_reads(layer);
    depthkv::LayerScores s;
    try {
      s = scorer_.scores(layer, proj ? &*proj : nullptr);
    } catch (const depthkv::Error& e) {
      throw depthkv::Error(std::string(kFunc) + ".scores: " + e.message());
    }
    return to_arrays(std::move(s));
  }

 private:
  static depthkv::ScorerConfig make_config(const std::string& scorer, int window, int kernel, const std::string& pooling,
                                           bool output_aware, int lookahead, double context_weight) {
    depthkv::ScorerConfig c = depthkv::scorer_config(scorer);
    c.window = window;
    c.kernel = kernel;
    c.pooling = depthkv::parse_pooling(pooling);
    c.output_aware = output_aware;
    c.lookahead = lookahead;
    c.context_weight = context_weight;
    return c;
  }

  /// Slots per KV head: `n` (one int or one per head), else the observed count of each head.
  std::vector<int> sizes(const nb::handle& n) const {
    const int H = scorer_.n_kv_heads();
    std::vector<int> out;
    long long one = 0;
    std::vector<long long> many;
    if (n.is_none()) {
      for (int h = 0; h < H; ++h) out.push_back(scorer_.observed_size(h));
      return out;
    }
    if (nb::try_cast(n, one)) {
      many.assign(static_cast<std::size_t>(H), one);
    } else {
      DEPTHKV_CHECK_AS(kFunc, nb::try_cast(n, many), "n must be an int or a list of ints (one per KV head)");
      DEPTHKV_CHECK_AS(kFunc, many.size() == static_cast<std::size_t>(H),
                       "n has " << many.size() << " entries for " << H << " KV heads");
    }
    for (long long x : many) {
      DEPTHKV_CHECK_AS(kFunc, x >= 0 && x <= std::numeric_limits<int>::max(), "n must be in [0, 2^31), got " << x);
      out.push_back(static_cast<int>(x));
    }
    return out;
  }

  /// An optional array argument (None: false).
  static bool optional_array(const nb::handle& h, const char* what, AnyArray& out) {
    if (h.is_none()) return false;
    DEPTHKV_CHECK_AS(kFunc, nb::try_cast(h, out), what << " must be an array, got " << nb::inst_name(h).c_str());
    check_float_array(out, what, 3, "[n_kv_heads, n, head_dim]");
    return true;
  }

  /// Points the layer at the key/value arrays (when given), checking their shapes against each
  /// other, the scorer's KV heads and the sizes.
  void attach(ArrayLayer& layer, const nb::handle& keys, const nb::handle& values) const {
    AnyArray k, v;
    const bool has_k = optional_array(keys, "keys", k), has_v = optional_array(values, "values", v);
    if (!has_k && !has_v) return;
    const AnyArray& a = has_k ? k : v;
    DEPTHKV_CHECK_AS(kFunc, !(has_k && has_v) || (k.shape(0) == v.shape(0) && k.shape(1) == v.shape(1) &&
                                                   k.shape(2) == v.shape(2) && k.stride(0) == v.stride(0) &&
                                                   k.stride(1) == v.stride(1)),
                     "keys and values must have the same shape and strides");
    DEPTHKV_CHECK_AS(kFunc, dim_of(a, 0) == layer.kv_heads,
                     "keys/values have " << a.shape(0) << " KV heads, the scorer " << layer.kv_heads);
    for (int s : layer.sizes)
      DEPTHKV_CHECK_AS(kFunc, s <= dim_of(a, 1), "n " << s << " exceeds the " << a.shape(1) << " slots of keys/values");
    DEPTHKV_CHECK_AS(kFunc, a.shape(2) >= 1, "keys/values have head_dim 0 (empty rows)");
    layer.dim = dim_of(a, 2);
    layer.head_stride = a.shape(0) <= 1 ? 0 : a.stride(0);
    layer.token_stride = a.shape(1) <= 1 ? 0 : a.stride(1);
    if (has_k) layer.keys = static_cast<const float*>(k.data());
    if (has_v) layer.values = static_cast<const float*>(v.data());
    check_finite_rows(layer, layer.keys, "keys");
    check_finite_rows(layer, layer.values, "values");
  }

  /// Refuses a NaN or infinite element in the rows of `base` (keys or values) the scores read.
  static void check_finite_rows(const ArrayLayer& layer, const float* base, const char* what) {
    if (base == nullptr) return;
    for (int h = 0; h < layer.kv_heads; ++h)
      for (int j = 0; j < layer.sizes[static_cast<std::size_t>(h)]; ++j) {
        const float* row = base + h * layer.head_stride + j * layer.token_stride;
        for (int d = 0; d < layer.dim; ++d)
          DEPTHKV_CHECK_AS(kFunc, std::isfinite(row[d]),
                           what << " hold " << row[d] << " at KV head " << h << ", slot " << j << ", element " << d
                                << " (scores need finite keys and values)");
      }
  }

  /// The output projection (o_proj.weight, [dim, n_heads * head_dim]) for output-aware scorers.
  std::optional<depthkv::OutputProjection> projection(const nb::handle& wo, const ArrayLayer& layer) const {
    if (wo.is_none()) return std::nullopt;
    AnyArray w;
    DEPTHKV_CHECK_AS(kFunc, nb::try_cast(wo, w), "wo must be an array, got " << nb::inst_name(wo).c_str());
    check_float_array(w, "wo", 2, "[dim, n_heads * head_dim]");
    const std::size_t cols = static_cast<std::size_t>(scorer_.n_heads()) * static_cast<std::size_t>(layer.dim);
    DEPTHKV_CHECK_AS(kFunc, w.shape(1) == cols,
                     "wo has " << w.shape(1) << " columns, n_heads * head_dim = " << cols);
    for (std::size_t r = 0; r < w.shape(0); ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const float x = static_cast<const float*>(w.data())[static_cast<std::int64_t>(r) * (w.shape(0) <= 1 ? 0 : w.stride(0)) +
                                                            static_cast<std::int64_t>(c)];
        DEPTHKV_CHECK_AS(kFunc, std::isfinite(x), "wo holds " << x << " at row " << r << ", column " << c);
      }
    depthkv::OutputProjection p;
    p.data = static_cast<const float*>(w.data());
    p.dim = dim_of(w, 0);
    p.n_heads = scorer_.n_heads();
    p.head_dim = layer.dim;
    p.row_stride = w.shape(0) <= 1 ? static_cast<std::int64_t>(cols) : w.stride(0);
    return p;
  }

  /// Refuses a scorer that would read rows the layer does not have.
  void check_reads(const ArrayLayer& layer) const {
    const depthkv::ScorerConfig& c = scorer_.config();
    if (!c.name.empty()) return;
    const bool needs_v = c.kind == depthkv::ScorerKind::kH2OValueL1 || c.kind == depthkv::ScorerKind::kH2OValueL2 ||
                         c.output_aware;
    const bool needs_k = c.kind == depthkv::ScorerKind::kKeyNorm || c.kind == depthkv::ScorerKind::kKeyDiff ||
                         c.kind == depthkv::ScorerKind::kSnapKVKeyDiff;
    DEPTHKV_CHECK_AS(kFunc, !needs_k || layer.keys != nullptr,
                     "scorer " << depthkv::scorer_name(c) << " reads the keys: pass keys=[n_kv_heads, n, head_dim]");
    DEPTHKV_CHECK_AS(kFunc, !needs_v || layer.values != nullptr,
                     "scorer " << depthkv::scorer_name(c) << (c.output_aware ? " (output-aware)" : "")
                               << " reads the values: pass values=[n_kv_heads, n, head_dim]");
  }

  static nb::object to_arrays(depthkv::LayerScores&& s) {
    bool equal = true;
    for (const auto& row : s) equal &= row.size() == s.front().size();
    if (equal && !s.empty()) {
      const std::size_t H = s.size(), n = s.front().size();
      std::vector<float> flat;
      flat.reserve(H * n);
      for (const auto& row : s) flat.insert(flat.end(), row.begin(), row.end());
      return owning_array(std::move(flat), {H, n});
    }
    nb::list out;
    for (auto& row : s) {
      const std::size_t n = row.size();
      out.append(owning_array(std::move(row), {n}));
    }
    return out;
  }

  depthkv::TokenScorer scorer_;
};

}  // namespace

void bind_scorer(nb::module_& m) {
  nb::class_<PyScorer>(m, "TokenScorer", "The library's depthkv::TokenScorer; use depthkv.TokenScorer")
      .def(nb::init<const std::string&, int, int, int, int, const std::string&, bool, int, double>(), nb::arg("scorer"),
           nb::arg("n_heads"), nb::arg("n_kv_heads"), nb::arg("window"), nb::arg("kernel"), nb::arg("pooling"),
           nb::arg("output_aware"), nb::arg("lookahead"), nb::arg("context_weight"))
      .def("begin_lookahead", &PyScorer::begin_lookahead)
      .def("observe", &PyScorer::observe, nb::arg("probs"), nb::arg("q_pos0"), nb::arg("q_head").none())
      .def("scores", &PyScorer::scores, nb::arg("n").none(), nb::arg("keys").none(), nb::arg("values").none(),
           nb::arg("wo").none())
      .def("reset", &PyScorer::reset)
      .def("observed_size", [](const PyScorer& s, int h) { return s.scorer().observed_size(h); }, nb::arg("kv_head"))
      .def_prop_ro("scorer", [](const PyScorer& s) { return depthkv::scorer_name(s.scorer().config()); })
      .def_prop_ro("n_heads", [](const PyScorer& s) { return s.scorer().n_heads(); })
      .def_prop_ro("n_kv_heads", [](const PyScorer& s) { return s.scorer().n_kv_heads(); })
      .def_prop_ro("window", [](const PyScorer& s) { return s.scorer().config().window; })
      .def_prop_ro("kernel", [](const PyScorer& s) { return s.scorer().config().kernel; })
      .def_prop_ro("pooling", [](const PyScorer& s) { return depthkv::to_string(s.scorer().config().pooling); })
      .def_prop_ro("output_aware", [](const PyScorer& s) { return s.scorer().config().output_aware; })
      .def_prop_ro("lookahead", [](const PyScorer& s) { return s.scorer().config().lookahead; })
      .def_prop_ro("context_weight", [](const PyScorer& s) { return s.scorer().config().context_weight; });
  m.def(
      "keep_tokens",
      [](double ratio, int n, int n_sink, int n_recent) {
        DEPTHKV_CHECK_AS("keep_tokens", std::isfinite(ratio), "ratio must be finite, got " << ratio);
        DEPTHKV_CHECK_AS("keep_tokens", n >= 0, "n must be >= 0, got " << n);
        return depthkv::keep_tokens(ratio, n, {n_sink, n_recent});
      },
      nb::arg("ratio"), nb::arg("n"), nb::arg("n_sink"), nb::arg("n_recent"));
}

}  // namespace depthkv_py
