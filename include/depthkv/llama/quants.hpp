#pragma once
/// @file llama/quants.hpp
/// @brief ggml quantized tensors: type numbers and layouts (quant/ggml_type.hpp), one header per
/// block type with its layout, bit-exact conversion to float and product kernels as traits
/// (quant/q4_0.hpp, ..., listed in quant/type_list.hpp), conversion of rows to float
/// (quant/dequantize.hpp), and matrix products on the stored blocks (quant/products.hpp).
///
/// Adding a block type touches one new header and one list: see quant/type_list.hpp.
///
/// Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
/// IQ4_XS. `dequantize_row` gives exactly the floats of llama.cpp's `dequantize_row_*` and of
/// the gguf Python package's `gguf.quants.dequantize`.
///
/// Products: for the block types, `quant_matvec` and `quant_matmul` quantize the activations
/// to int8 per 32 values (per 256 values for Q4_K, Q5_K, Q6_K, summing a whole block in int32)
/// and multiply blocks as integers (AVX2 `maddubs`), as llama.cpp does;
/// the float types (F32, F16, BF16) are converted in registers and multiplied with FMA. Why:
/// benchmarks/quant_bench.cpp measures both kernels per type at the TinyLlama-1.1B shapes
/// (benchmarks/RESULTS.md). Dequantizing each block to a float buffer first costs more
/// instructions per weight than reading the weight does: at one thread it ran at 1-8 GFLOP/s in
/// matvec, at or below Eigen's float32 matvec of the dequantized matrix (7-11 GFLOP/s on the
/// DRAM-sized shapes, memory bound), while the int8 kernel ran at 20-44 GFLOP/s for every block
/// type (2.1-4.5x float32 there, reading 4-8x fewer bytes). In the 512-token matmul, dequantizing
/// a tile and running Eigen's GEMM is at best as fast as float32 (the GEMM is the cost); the int8
/// kernel was ahead or level in all but three of the 36 type x shape cells. The int8 kernel's
/// cost is the activation rounding (each dot product is within sum |w| * max|x| / 254 per 32
/// values of the exact one; per 256 values for Q4_K, Q5_K, Q6_K, whose per-256 kernel ran 2-3x
/// the per-32 one in the 512-token matmul); `QuantKernel::kDequantize` keeps the float-exact products for
/// checks. F16/BF16 rows converted in registers beat the float32 matvec (half the bytes); for
/// F32 weights Eigen's own product is faster than this FMA loop.
///
/// @code
/// #include <depthkv/llama/quants.hpp>
/// auto f = depthkv::llama::GgufFile::open("model-Q4_K_M.gguf");          // llama/gguf.hpp
/// auto w = f.raw_tensor(*f.find_tensor("blk.0.ffn_up.weight"));
/// std::vector<float> y(w.rows);
/// depthkv::llama::quant_matvec(w.type, w.data, w.rows, w.cols, x.data(), y.data(),
///                               depthkv::llama::QuantProductOptions(depthkv::CpuOptions{2, 2}));  // 2 threads
/// @endcode

#include "depthkv/llama/quant/ggml_type.hpp"
#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/products.hpp"
