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
/// the float types (F32, F16, BF16) are converted in registers and multiplied with FMA (the
/// engine multiplies F32 weights with Eigen's float32 product instead: llama/gguf.hpp). The int8
/// kernel's error is the activation rounding: each dot product is within sum |w| * max|x| / 254
/// per 32 values of the exact one (per 256 values for Q4_K, Q5_K, Q6_K); `QuantKernel::kDequantize` keeps the float-exact
/// products for checks. Why these kernels (measurements of benchmarks/quant_bench.cpp):
/// benchmarks/RESULTS.md, "Quantized matrix products".
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
