#pragma once
// Locating the real models that scripts/get-models.sh fetches (SmolLM2-135M-Instruct.Q4_1.gguf,
// gemma-3-270m-q4_k_m.gguf) for tests.
//
// The folder is the environment variable DEPTHKV_MODEL_DIR when set (as get-models.sh uses it),
// else ~/.cache/depthkv/models. A missing file FAILS the test with a message naming the path and
// telling to run scripts/get-models.sh, unless DEPTHKV_SKIP_MISSING_DATA=1 is set, which makes
// the test program exit with code 77 (reported by CTest as skipped), the rule of test_data.hpp.

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <catch2/catch.hpp>

#include "support/test_data.hpp"

namespace depthkv_test {

/// The folder of the real models: $DEPTHKV_MODEL_DIR, else $HOME/.cache/depthkv/models.
inline std::string model_dir() {
  if (const char* env = std::getenv("DEPTHKV_MODEL_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/depthkv/models";
}

/// Full path of the model file `name` (e.g. "SmolLM2-135M-Instruct.Q4_1.gguf") in `model_dir()`;
/// fails (or skips, see above) when the file does not exist.
inline std::string model_path(const std::string& name) {
  return require_file(model_dir() + "/" + name, "real model file",
                      "run scripts/get-models.sh, which fetches it into $DEPTHKV_MODEL_DIR or ~/.cache/depthkv/models");
}

}  // namespace depthkv_test
