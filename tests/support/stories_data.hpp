#pragma once
// stories260K's tokenizer from ../shared, loaded once per test program (support/test_data.hpp
// finds the file).

#include "depthkv/llama/tokenizer.hpp"
#include "support/test_data.hpp"

namespace depthkv_test {

/// tok512.bin, stories260K's 512-piece llama2.c vocabulary.
inline const depthkv::llama::Tokenizer& stories_tok512() {
  static const depthkv::llama::Tokenizer t(data_path("models/stories260K/tok512.bin"), 512);
  return t;
}

}  // namespace depthkv_test
