// depthkv._cuda.paged_compact: the paged compaction (depthkv/cuda/paged_compact.cuh) of a pool
// in CUDA memory. The head table is built and checked on the host (counts, capacities, heads
// inside a block); table entries and kept lists live on the device and are checked by the
// kernel, which skips a bad head without writing it and reports it in the status word.

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

/// A host int32 array of `n` elements.
const std::int32_t* host_ints(const AnyArray& a, const char* what, std::size_t n) {
  const char* f = "cuda.paged_compact";
  check_host_rows(a, f, what, 1);
  check_dtype(a, nb::dtype<std::int32_t>(), f, what);
  DEPTHKV_CHECK_AS(f, a.shape(0) == n, what << " must have one entry per head (" << n << "), got " << a.shape(0));
  return static_cast<const std::int32_t*>(a.data());
}

/// A device int32 [n_heads, width] array.
std::int32_t* device_rows(const AnyArray& a, const char* what, int dev, std::size_t n_heads) {
  const char* f = "cuda.paged_compact";
  check_cuda_array(a, f, what, dev, 2);
  check_dtype(a, nb::dtype<std::int32_t>(), f, what);
  DEPTHKV_CHECK_AS(f, a.shape(0) == n_heads, what << " must have " << n_heads << " rows, got " << a.shape(0));
  return static_cast<std::int32_t*>(const_cast<void*>(a.data()));
}

/// The pool's geometry from its 4-D shape: NHD [blocks, block_size, kv_heads, d], HND [blocks, kv_heads, block_size, d].
struct Pool {
  int num_blocks = 0, block_size = 0, n_kv_heads = 0, d = 0, elem_bytes = 0;
};

Pool pool_of(const AnyArray& k, const AnyArray& v, bool hnd) {
  const char* f = "cuda.paged_compact";
  check_cuda_array(k, f, "k_blocks", -1, 4);
  check_cuda_array(v, f, "v_blocks", k.device_id(), 4);
  DEPTHKV_CHECK_AS(f, k.dtype() == v.dtype(), "k_blocks and v_blocks must share one dtype");
  for (std::size_t d = 0; d < 4; ++d) DEPTHKV_CHECK_AS(f, k.shape(d) == v.shape(d), "v_blocks must have k_blocks' shape");
  Pool p;
  p.elem_bytes = elem_of(k, f, "k_blocks") == cuda::Elem::kF32 ? 4 : 2;
  p.num_blocks = to_int(k.shape(0), f, "blocks");
  p.block_size = to_int(k.shape(hnd ? 2 : 1), f, "block_size");
  p.n_kv_heads = to_int(k.shape(hnd ? 1 : 2), f, "heads per block");
  p.d = to_int(k.shape(3), f, "head_dim");
  DEPTHKV_CHECK_AS(f, p.block_size >= 1 && p.n_kv_heads >= 1 && p.d >= 1, "the pool's block_size, heads and head_dim must be >= 1");
  return p;
}

void paged_compact(const AnyArray& k_blocks, const AnyArray& v_blocks, bool hnd, const AnyArray& tables,
                   const AnyArray& kept, const AnyArray& n, const AnyArray& n_kept, const AnyArray& head_in_block,
                   nb::handle positions, const AnyArray& heads_buf, const AnyArray& status, std::uintptr_t stream) {
  const char* f = "cuda.paged_compact";
  const Pool p = pool_of(k_blocks, v_blocks, hnd);
  const int dev = k_blocks.device_id();
  const std::size_t nh = n.ndim() == 1 ? n.shape(0) : 0;
  const std::int32_t *hn = host_ints(n, "n", nh), *hk = host_ints(n_kept, "n_kept", nh),
                     *hb = host_ints(head_in_block, "head_in_block", nh);
  std::int32_t* d_tables = device_rows(tables, "tables", dev, nh);
  std::int32_t* d_kept = device_rows(kept, "kept", dev, nh);
  std::int32_t* d_pos = nullptr;
  std::size_t pos_width = 0;
  if (!positions.is_none()) {
    const AnyArray pa = nb::cast<AnyArray>(positions);
    d_pos = device_rows(pa, "positions", dev, nh);
    pos_width = pa.shape(1);
  }
  std::vector<dc::PagedCompactHead> heads(nh);
  const std::int64_t table_len = static_cast<std::int64_t>(tables.shape(1));
  for (std::size_t h = 0; h < nh; ++h) {
    DEPTHKV_CHECK_AS(f, hn[h] >= 0 && hk[h] >= 0 && hk[h] <= hn[h] && static_cast<std::size_t>(hk[h]) <= kept.shape(1),
                     "head " << h << ": n_kept " << hk[h] << " must lie in [0, n = " << hn[h] << "] and fit kept's "
                             << kept.shape(1) << " columns");
    DEPTHKV_CHECK_AS(f, hn[h] <= table_len * p.block_size,
                     "head " << h << ": n = " << hn[h] << " exceeds its table's " << table_len << " blocks of " << p.block_size);
    DEPTHKV_CHECK_AS(f, hb[h] >= 0 && hb[h] < p.n_kv_heads,
                     "head " << h << ": head_in_block " << hb[h] << " outside [0, " << p.n_kv_heads << ")");
    DEPTHKV_CHECK_AS(f, d_pos == nullptr || static_cast<std::size_t>(hn[h]) <= pos_width,
                     "head " << h << ": positions has " << pos_width << " columns, fewer than n = " << hn[h]);
    dc::PagedCompactHead& e = heads[h];
    e.table = d_tables + static_cast<std::int64_t>(h) * table_len;
    e.kept = d_kept + static_cast<std::int64_t>(h) * static_cast<std::int64_t>(kept.shape(1));
    e.positions = d_pos == nullptr ? nullptr : d_pos + static_cast<std::int64_t>(h) * static_cast<std::int64_t>(pos_width);
    e.n = hn[h];
    e.n_kept = hk[h];
    e.table_len = static_cast<std::int32_t>(table_len);
    e.head_in_block = hb[h];
  }
  auto* d_heads = static_cast<dc::PagedCompactHead*>(
      byte_buffer(heads_buf, f, "heads_buf", dev, heads.size() * sizeof(dc::PagedCompactHead)));
  std::uint32_t* st = status_word(status, f, dev);
  if (!heads.empty())
    check_launch(f, cuda::upload(d_heads, heads.data(), heads.size() * sizeof(dc::PagedCompactHead), stream));
  check_launch(f, cuda::paged_compact(d_heads, to_int(nh, f, "heads"), const_cast<void*>(k_blocks.data()),
                                      const_cast<void*>(v_blocks.data()), p.num_blocks, p.block_size, p.n_kv_heads, p.d,
                                      p.elem_bytes, hnd, st, stream));
}

}  // namespace

void bind_cuda_paged(nb::module_& m) {
  m.def("paged_head_bytes", [] { return sizeof(dc::PagedCompactHead); });
  m.def("paged_compact", &paged_compact, nb::arg("k_blocks"), nb::arg("v_blocks"), nb::arg("hnd"), nb::arg("tables"),
        nb::arg("kept"), nb::arg("n"), nb::arg("n_kept"), nb::arg("head_in_block"), nb::arg("positions").none(),
        nb::arg("heads_buf"), nb::arg("status"), nb::arg("stream"),
        "Moves each head's kept slots to its first slots, in place (depthkv/cuda/paged_compact.cuh PagedCompact).");
}

}  // namespace depthkv_py
