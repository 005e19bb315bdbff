// depthkv._core.select_keep: the evictor's ranking rule (depthkv/evictor.hpp select_keep) over
// score rows given as arrays (float32, float16 or bfloat16; one row per KV head), read in place.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "depthkv/evictor.hpp"

namespace depthkv_py {
namespace {

enum class ScoreType { kFloat32, kFloat16, kBFloat16 };

/// Rows of scores (or positions) read in place: row h starts at data + h * row_stride elements.
struct Rows {
  const void* data = nullptr;
  std::int64_t row_stride = 0;  ///< elements between rows
  int n_rows = 1, n = 0;
  bool matrix = false;           ///< given as [rows, n] (else [n])
};

/// The rows of a checked 1-D or 2-D host array whose last dimension is contiguous.
Rows host_rows(const AnyArray& a, const char* what) {
  check_host_rows(a, "select_keep", what, 2);
  Rows r;
  r.data = a.data();
  r.matrix = a.ndim() == 2;
  const std::size_t n = a.shape(a.ndim() - 1), rows = r.matrix ? a.shape(0) : 1;
  DEPTHKV_CHECK_AS("select_keep", n <= static_cast<std::size_t>(std::numeric_limits<int>::max()) &&
                                      rows <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                   what << " has " << rows << " rows of " << n << ": too large");
  r.n = static_cast<int>(n);
  r.n_rows = static_cast<int>(rows);
  r.row_stride = r.matrix ? a.stride(0) : 0;
  return r;
}

ScoreType score_type(const AnyArray& a) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<float>()) return ScoreType::kFloat32;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return ScoreType::kFloat16;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return ScoreType::kBFloat16;
  DEPTHKV_CHECK_AS("select_keep", false, "scores must be float32, float16 or bfloat16, got " << dtype_name(t));
}

/// Positions: none, one row shared by every head, or one row per head (int32, n per row).
Rows position_rows(const nb::handle& positions, const Rows& scores) {
  Rows p;
  if (positions.is_none()) return p;
  AnyArray a;
  DEPTHKV_CHECK_AS("select_keep", nb::try_cast(positions, a),
                   "positions must be an int32 array (numpy, or DLPack), got " << nb::inst_name(positions).c_str());
  DEPTHKV_CHECK_AS("select_keep", a.dtype() == nb::dtype<std::int32_t>(),
                   "positions must be int32, got " << dtype_name(a.dtype()));
  p = host_rows(a, "positions");
  DEPTHKV_CHECK_AS("select_keep", p.n == scores.n && (!p.matrix || p.n_rows == scores.n_rows),
                   "positions have shape " << (p.matrix ? std::to_string(p.n_rows) + "x" : std::string()) << p.n
                                           << ", scores " << (scores.matrix ? std::to_string(scores.n_rows) + "x" : std::string())
                                           << scores.n);
  return p;
}

/// The library's select_keep on row h.
std::vector<std::int32_t> select_row(const Rows& s, ScoreType type, const Rows& p, int h, int k,
                                     depthkv::Protection prot) {
  const std::int64_t off = h * s.row_stride;
  const std::int32_t* pos =
      p.data == nullptr ? nullptr : static_cast<const std::int32_t*>(p.data) + (p.matrix ? h * p.row_stride : 0);
  switch (type) {
    case ScoreType::kFloat16:
      return depthkv::select_keep(static_cast<const Eigen::half*>(s.data) + off, pos, s.n, k, prot);
    case ScoreType::kBFloat16:
      return depthkv::select_keep(static_cast<const Eigen::bfloat16*>(s.data) + off, pos, s.n, k, prot);
    case ScoreType::kFloat32: break;
  }
  return depthkv::select_keep(static_cast<const float*>(s.data) + off, pos, s.n, k, prot);
}

/// "NaN score at slot 3" from "select_keep: NaN score at slot 3" (the function prefix of a
/// library message, when it has one).
std::string without_function(const std::string& msg) {
  const std::size_t colon = msg.find(": ");
  if (colon == std::string::npos) return msg;
  for (std::size_t i = 0; i < colon; ++i) {
    const char c = msg[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return msg;
  }
  return msg.substr(colon + 2);
}

/// Kept slots of every row: (a list of int32 arrays, one per row (head); whether the scores
/// were given as a matrix [heads, n]).
/// @param keep one keep count per row, or one for all
nb::tuple select_keep(const AnyArray& scores, const std::vector<long long>& keep, int n_sink, int n_recent,
                     const nb::handle& positions) {
  const ScoreType type = score_type(scores);
  const Rows s = host_rows(scores, "scores");
  const Rows p = position_rows(positions, s);
  DEPTHKV_CHECK_AS("select_keep", keep.size() == 1 || keep.size() == static_cast<std::size_t>(s.n_rows),
                   "k has " << keep.size() << " entries for " << s.n_rows << " heads (give one, or one per head)");
  nb::list out;
  for (int h = 0; h < s.n_rows; ++h) {
    const long long k = keep.size() == 1 ? keep[0] : keep[static_cast<std::size_t>(h)];
    const std::string where = s.matrix ? "head " + std::to_string(h) + ": " : "";
    DEPTHKV_CHECK_AS("select_keep", k >= 0 && k <= std::numeric_limits<int>::max(),
                     where << "keep count must be in [0, 2^31), got " << k);
    std::vector<std::int32_t> kept;
    try {
      kept = select_row(s, type, p, h, static_cast<int>(k), {n_sink, n_recent});
    } catch (const depthkv::Error& e) {
      throw depthkv::Error("select_keep: " + where + without_function(e.message()));
    }
    const std::size_t m = kept.size();
    out.append(owning_array(std::move(kept), {m}));
  }
  return nb::make_tuple(out, s.matrix);
}

}  // namespace

void bind_select(nb::module_& m) {
  m.def("select_keep", &select_keep, nb::arg("scores"), nb::arg("keep"), nb::arg("n_sink"), nb::arg("n_recent"),
        nb::arg("positions").none(),
        "Kept slots of each row of scores ([n] or [heads, n]) by the evictor's rule: (a list of int32 "
        "arrays, one per row; whether scores was [heads, n]). Use depthkv.select_keep.");
}

}  // namespace depthkv_py
