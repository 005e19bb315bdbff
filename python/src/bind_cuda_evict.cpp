// depthkv._cuda.evict and paged_compact: the batched top-k eviction (depthkv/cuda/evict.cuh) and
// the paged compaction (depthkv/cuda/paged_compact.cuh) on CUDA arrays. The row tables are built
// and checked on the host (the library's checks), uploaded into a caller-given device buffer,
// and the kernels run on the caller's stream.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common.hpp"
#include "cuda_bind_common.hpp"

namespace depthkv_py {
namespace {

namespace dc = depthkv::cuda;

/// Rows of a [R..., N, D] (K/V) or [R..., N] (scores, slots) array.
std::size_t leading_rows(const AnyArray& a, std::size_t tail_dims) {
  std::size_t rows = 1;
  for (std::size_t d = 0; d + tail_dims < a.ndim(); ++d) rows *= a.shape(d);
  return rows;
}

bool same_leading(const AnyArray& a, std::size_t a_tail, const AnyArray& b, std::size_t b_tail) {
  if (a.ndim() - a_tail != b.ndim() - b_tail) return false;
  for (std::size_t d = 0; d + a_tail < a.ndim(); ++d)
    if (a.shape(d) != b.shape(d)) return false;
  return true;
}

/// [begin, end) of an array's bytes.
std::pair<std::uintptr_t, std::uintptr_t> span_of(const AnyArray& a) {
  const auto b = reinterpret_cast<std::uintptr_t>(a.data());
  return {b, b + a.nbytes()};
}

bool overlap(const AnyArray& a, const AnyArray& b) {
  const auto x = span_of(a), y = span_of(b);
  return x.first < y.second && y.first < x.second;
}

/// The shapes of one eviction call: K/V [R..., N, D] in, [R..., C, D] out, scores [R..., N].
struct EvictShape {
  int rows = 0, n = 0, d = 0, cap = 0, elem_bytes = 0;
  cuda::Elem score_type = cuda::Elem::kF32;
};

EvictShape evict_shape(const AnyArray& keys, const AnyArray& values, const AnyArray& scores, const AnyArray& keys_out,
                       const AnyArray& values_out) {
  const char* f = "cuda.evict";
  check_cuda_array(keys, f, "keys", -1, 0);
  const int dev = keys.device_id();
  check_cuda_array(values, f, "values", dev, 0);
  check_cuda_array(keys_out, f, "keys_out", dev, 0);
  check_cuda_array(values_out, f, "values_out", dev, 0);
  check_cuda_array(scores, f, "scores", dev, 0);
  DEPTHKV_CHECK_AS(f, keys.ndim() >= 2, "keys must be [..., n, head_dim], got " << keys.ndim() << " dimension(s)");
  const cuda::Elem kt = elem_of(keys, f, "keys");
  DEPTHKV_CHECK_AS(f, values.dtype() == keys.dtype() && keys_out.dtype() == keys.dtype() &&
                          values_out.dtype() == keys.dtype(),
                   "keys, values, keys_out and values_out must share one dtype, got " << dtype_name(keys.dtype()) << ", "
                       << dtype_name(values.dtype()) << ", " << dtype_name(keys_out.dtype()) << ", "
                       << dtype_name(values_out.dtype()));
  DEPTHKV_CHECK_AS(f, values.ndim() == keys.ndim() && same_leading(keys, 0, values, 0), "values must have keys' shape");
  DEPTHKV_CHECK_AS(f, same_leading(keys, 2, keys_out, 2) && same_leading(keys, 2, values_out, 2) &&
                          keys_out.ndim() == keys.ndim() && values_out.ndim() == keys.ndim() &&
                          keys_out.shape(keys.ndim() - 1) == keys.shape(keys.ndim() - 1) &&
                          values_out.shape(keys.ndim() - 2) == keys_out.shape(keys.ndim() - 2) &&
                          values_out.shape(keys.ndim() - 1) == keys.shape(keys.ndim() - 1),
                   "keys_out and values_out must be [..., capacity, head_dim] with keys' leading dimensions");
  DEPTHKV_CHECK_AS(f, same_leading(keys, 1, scores, 0), "scores must be keys' shape without head_dim");
  EvictShape s;
  s.score_type = elem_of(scores, f, "scores");
  s.elem_bytes = kt == cuda::Elem::kF32 ? 4 : 2;
  s.rows = to_int(leading_rows(keys, 2), f, "rows");
  s.n = to_int(keys.shape(keys.ndim() - 2), f, "tokens");
  s.d = to_int(keys.shape(keys.ndim() - 1), f, "head_dim");
  s.cap = to_int(keys_out.shape(keys.ndim() - 2), f, "capacity");
  DEPTHKV_CHECK_AS(f, s.d >= 1, "head_dim must be >= 1");
  for (const auto* out : {&keys_out, &values_out})
    DEPTHKV_CHECK_AS(f, !overlap(*out, keys) && !overlap(*out, values) && !overlap(keys_out, values_out),
                     "keys_out and values_out must not overlap each other or the source (eviction is out-of-place)");
  return s;
}

/// The row table of an eviction; throws (nothing launched) on a bad keep count or capacity.
std::vector<dc::EvictRow> evict_rows(const EvictShape& s, const AnyArray& keys, const AnyArray& values,
                                     const AnyArray& scores, const std::int32_t* keep, const AnyArray& keys_out,
                                     const AnyArray& values_out, std::int32_t* kept_slots, int n_sink, int n_recent,
                                     std::vector<std::int32_t>& n_kept) {
  const auto at = [](const AnyArray& a, std::int64_t elems, int eb) {
    return static_cast<unsigned char*>(const_cast<void*>(a.data())) + elems * eb;
  };
  const int sb = s.score_type == cuda::Elem::kF32 ? 4 : 2;
  std::vector<dc::EvictRow> rows(static_cast<std::size_t>(s.rows));
  n_kept.assign(rows.size(), 0);
  for (int r = 0; r < s.rows; ++r) {
    dc::EvictRow& row = rows[static_cast<std::size_t>(r)];
    const std::int64_t src = static_cast<std::int64_t>(r) * s.n, dst = static_cast<std::int64_t>(r) * s.cap;
    row.scores = at(scores, src, sb);
    row.src_k = at(keys, src * s.d, s.elem_bytes);
    row.src_v = at(values, src * s.d, s.elem_bytes);
    row.dst_k = at(keys_out, dst * s.d, s.elem_bytes);
    row.dst_v = at(values_out, dst * s.d, s.elem_bytes);
    row.kept_slots = kept_slots == nullptr ? nullptr : kept_slots + dst;
    row.src_token_stride = row.dst_token_stride = s.d;
    row.n = s.n;
    row.k = keep[r];
    dc::detail::check_evict_row(row, r, s.d, n_sink, n_recent);
    n_kept[static_cast<std::size_t>(r)] = std::min(row.k, row.n);
    DEPTHKV_CHECK_AS("cuda.evict", n_kept[static_cast<std::size_t>(r)] <= s.cap,
                     "row " << r << ": " << n_kept[static_cast<std::size_t>(r)]
                            << " kept tokens exceed the output capacity " << s.cap);
  }
  return rows;
}

nb::object evict(const AnyArray& keys, const AnyArray& values, const AnyArray& scores, const AnyArray& keep,
                 const AnyArray& keys_out, const AnyArray& values_out, nb::handle kept_slots, int n_sink, int n_recent,
                 const AnyArray& rows_buf, const AnyArray& workspace, const AnyArray& status, std::uintptr_t stream) {
  const char* f = "cuda.evict";
  const EvictShape s = evict_shape(keys, values, scores, keys_out, values_out);
  const int dev = keys.device_id();
  check_host_rows(keep, f, "keep", 1);
  check_dtype(keep, nb::dtype<std::int32_t>(), f, "keep");
  DEPTHKV_CHECK_AS(f, keep.shape(0) == static_cast<std::size_t>(s.rows),
                   "keep must have one count per row (" << s.rows << "), got " << keep.shape(0));
  std::int32_t* slots = nullptr;
  if (!kept_slots.is_none()) {
    const AnyArray ks = nb::cast<AnyArray>(kept_slots);
    check_cuda_array(ks, f, "kept_slots", dev, 0);
    check_dtype(ks, nb::dtype<std::int32_t>(), f, "kept_slots");
    DEPTHKV_CHECK_AS(f, same_leading(keys_out, 1, ks, 0), "kept_slots must be keys_out's shape without head_dim");
    slots = static_cast<std::int32_t*>(const_cast<void*>(ks.data()));
  }
  std::vector<std::int32_t> n_kept;
  const std::vector<dc::EvictRow> rows = evict_rows(s, keys, values, scores, static_cast<const std::int32_t*>(keep.data()),
                                                    keys_out, values_out, slots, n_sink, n_recent, n_kept);
  const std::size_t ws_bytes = cuda::evict_workspace_bytes(s.rows, s.n);
  void* ws = ws_bytes == 0 ? nullptr : byte_buffer(workspace, f, "workspace", dev, ws_bytes);
  auto* d_rows = static_cast<dc::EvictRow*>(byte_buffer(rows_buf, f, "rows_buf", dev, rows.size() * sizeof(dc::EvictRow)));
  std::uint32_t* st = status_word(status, f, dev);
  if (!rows.empty()) check_launch(f, cuda::upload(d_rows, rows.data(), rows.size() * sizeof(dc::EvictRow), stream));
  check_launch(f, cuda::evict(d_rows, s.rows, s.n, s.d, s.elem_bytes, s.score_type, n_sink, n_recent, st, ws, ws_bytes,
                              stream));
  const std::size_t count = n_kept.size();
  return owning_array(std::move(n_kept), {count});
}

}  // namespace

void bind_cuda_evict(nb::module_& m) {
  m.def("evict_workspace_bytes", &cuda::evict_workspace_bytes, nb::arg("n_rows"), nb::arg("max_n"));
  m.def("evict_row_bytes", [] { return sizeof(dc::EvictRow); });
  m.def("evict", &evict, nb::arg("keys"), nb::arg("values"), nb::arg("scores"), nb::arg("keep"), nb::arg("keys_out"),
        nb::arg("values_out"), nb::arg("kept_slots").none(), nb::arg("n_sink"), nb::arg("n_recent"),
        nb::arg("rows_buf"), nb::arg("workspace"), nb::arg("status"), nb::arg("stream"),
        "Top-k eviction of every row (depthkv/cuda/evict.cuh Evict); returns the kept count per row.");
}

}  // namespace depthkv_py
