#pragma once
// The memory and work formulas of long_context_bench: the KV bytes a cache of a given shape holds,
// and the work of one decode step (weight bytes read, KV bytes read, FLOPs), from which the
// speedup of a pruned cache over the full cache is bounded.
//
// One decode step of a Llama-family model reads every weight matrix once (the embedding only one
// row, the classifier all of it: its rows are counted in `weight_params`/`weight_bytes`), and in
// every layer each query head reads the keys and values its KV head holds. With S the slots held
// summed over layers and KV heads, g = n_heads / n_kv_heads query heads per KV head, d = head_dim
// and e bytes per stored K or V element:
//   KV bytes read      = 2 * S * d * e                  (K and V, each read once per KV head)
//   attention FLOPs    = 4 * g * S * d                  (q.k and p.v, a multiply-add = 2 FLOPs)
//   weight FLOPs       = 2 * weight_params              (one multiply-add per weight)
// The work bound of a pruned cache against the full one (the same step, S_full slots):
//   bytes-only speedup = (W + KV_full) / (W + KV_pruned)   (W = weight bytes; a bandwidth-bound step)
//   FLOPs-only speedup = (F_w + A_full) / (F_w + A_pruned) (a compute-bound step)
// The KV bytes one token adds to a whole cache: 2 * n_layers * n_kv_heads * d * e.
//
//   depthkv_bench::DecodeShape s{24, 14, 2, 64, 494e6, 525e6};      // Qwen2.5-0.5B shape, Q8_0 weights
//   const double full = 24.0 * 2 * 16384;                            // slots of a 16K full cache
//   depthkv_bench::DecodeBound b = depthkv_bench::bound_speedup(
//       depthkv_bench::decode_work(s, full, 2), depthkv_bench::decode_work(s, 0.1 * full, 2));
//   // b.bytes_only ~ 1.33, b.flops_only ~ 2.1

namespace depthkv_bench {

/// What the formulas need of a model: its attention shape and the weights a decode step reads.
struct DecodeShape {
  int n_layers = 0;
  int n_heads = 0;             ///< query heads
  int n_kv_heads = 0;
  int head_dim = 0;
  double weight_params = 0;    ///< weights multiplied per step (layer matrices + classifier)
  double weight_bytes = 0;     ///< their stored bytes
};

/// The work of one decode step.
struct DecodeWork {
  double weight_bytes = 0;     ///< weight bytes read
  double kv_bytes = 0;         ///< K and V bytes read
  double weight_flops = 0;     ///< 2 per weight
  double attention_flops = 0;  ///< 4 * g * slots * head_dim
  double bytes() const { return weight_bytes + kv_bytes; }
  double flops() const { return weight_flops + attention_flops; }
};

/// The speedups a pruned cache's step work implies over the full cache's.
struct DecodeBound {
  double bytes_only = 1;  ///< (W + KV_full) / (W + KV_pruned)
  double flops_only = 1;  ///< (F_w + A_full) / (F_w + A_pruned)
};

/// @param kv_element_bytes bytes of one stored K or V element (4 for float32, 2 for F16)
/// @return the K and V bytes one token adds to a cache of every layer
inline double kv_bytes_per_token(const DecodeShape& s, double kv_element_bytes) {
  return 2.0 * s.n_layers * s.n_kv_heads * s.head_dim * kv_element_bytes;
}

/// @param kv_slots slots held, summed over layers and KV heads (n_layers * n_kv_heads * T for a
///   full cache of T tokens)
/// @param kv_element_bytes bytes of one stored K or V element
/// @return the work of one decode step over that cache
inline DecodeWork decode_work(const DecodeShape& s, double kv_slots, double kv_element_bytes) {
  DecodeWork w;
  const double group = static_cast<double>(s.n_heads) / s.n_kv_heads;
  w.weight_bytes = s.weight_bytes;
  w.kv_bytes = 2.0 * kv_slots * s.head_dim * kv_element_bytes;
  w.weight_flops = 2.0 * s.weight_params;
  w.attention_flops = 4.0 * group * kv_slots * s.head_dim;
  return w;
}

/// @return the bytes-only and FLOPs-only speedups of `pruned` over `full`
inline DecodeBound bound_speedup(const DecodeWork& full, const DecodeWork& pruned) {
  return DecodeBound{full.bytes() / pruned.bytes(), full.flops() / pruned.flops()};
}

}  // namespace depthkv_bench
