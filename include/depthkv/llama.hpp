#pragma once
/// @file llama.hpp
/// @brief Umbrella header of the reference Llama engine (Eigen only): model and loaders
/// (llama2.c, GGUF), quantized tensors and their products, tokenizer, sampler, the engine, the
/// decode-loop and evaluation helpers, and the text-window utilities. Not included here, as they
/// need the `depthkv::llama` CMake target (PCRE2): llama/bpe_tokenizer.hpp and
/// llama/open_model.hpp (`open_model(path)`: format sniffing and tokenizer choice).
///
/// @code
/// #include <depthkv/llama.hpp>
/// depthkv::llama::LlamaModel model = depthkv::llama::load_llama2c("stories260K.bin");
/// depthkv::llama::Tokenizer tok("tok512.bin", model.config.vocab_size);
/// depthkv::llama::LlamaEngine engine(model);
/// @endcode

#include "depthkv/llama/model.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/architecture.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/quants.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/llama/sampler.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/llama/eval_config.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/text_windows.hpp"
