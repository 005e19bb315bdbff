#pragma once
// Locating the real models and text of ../shared for tests.
//
// The folder is the environment variable DEPTHKV_DATA_DIR when set, else the CMake cache entry
// DEPTHKV_DATA_DIR (default: ../shared beside the project root). A missing file FAILS the test
// with a message naming the path, unless DEPTHKV_SKIP_MISSING_DATA=1 is set, which skips the test
// (skip.hpp: "SKIP: ..." and exit code 77, reported by CTest as skipped).

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

#include "support/skip.hpp"

namespace depthkv_test {

inline std::string data_dir() {
  if (const char* env = std::getenv("DEPTHKV_DATA_DIR")) return env;
#ifdef DEPTHKV_TEST_DATA_DIR
  return DEPTHKV_TEST_DATA_DIR;
#else
  return "../shared";
#endif
}

/// `path` when the file exists; else FAILS naming `what` and `hint`, or with
/// DEPTHKV_SKIP_MISSING_DATA=1 skips the test (skip.hpp).
inline std::string require_file(const std::string& path, const std::string& what, const std::string& hint) {
  if (!std::ifstream(path).good()) {
    const char* env = std::getenv("DEPTHKV_SKIP_MISSING_DATA");
    if (env && std::string(env) == "1") skip(what + " missing: " + path);
    FAIL(what << " missing: " << path << " (" << hint << "; DEPTHKV_SKIP_MISSING_DATA=1 skips such tests)");
  }
  return path;
}

/// Full path of `rel` (e.g. "models/stories260K/stories260K.bin") inside the data folder;
/// fails (or skips, see above) when the file does not exist.
inline std::string data_path(const std::string& rel) {
  return require_file(data_dir() + "/" + rel, "real data file",
                      "put the shared/ folder beside the project or set DEPTHKV_DATA_DIR");
}

/// The whole file at `path`, byte for byte (the file must exist).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace depthkv_test
