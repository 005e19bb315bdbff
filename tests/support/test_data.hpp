#pragma once
// Locating the real models and text of ../shared for tests.
//
// The folder is the environment variable DEPTHKV_DATA_DIR when set, else the CMake cache entry
// DEPTHKV_DATA_DIR (default: ../shared beside the project root). A missing file FAILS the test
// with a message naming the path, unless DEPTHKV_SKIP_MISSING_DATA=1 is set, which makes the
// test program exit with code 77 (reported by CTest as skipped).

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

namespace depthkv_test {

inline std::string data_dir() {
  if (const char* env = std::getenv("DEPTHKV_DATA_DIR")) return env;
#ifdef DEPTHKV_TEST_DATA_DIR
  return DEPTHKV_TEST_DATA_DIR;
#else
  return "../shared";
#endif
}

/// Full path of `rel` (e.g. "models/stories260K/stories260K.bin") inside the data folder;
/// fails (or skips, see above) when the file does not exist.
inline std::string data_path(const std::string& rel) {
  const std::string p = data_dir() + "/" + rel;
  if (!std::ifstream(p).good()) {
    const char* skip = std::getenv("DEPTHKV_SKIP_MISSING_DATA");
    if (skip && std::string(skip) == "1") {
      std::cerr << "SKIP: real data file missing: " << p << "\n";
      std::exit(77);
    }
    FAIL("real data file missing: " << p
                                     << " (put the shared/ folder beside the project or set DEPTHKV_DATA_DIR;"
                                        " DEPTHKV_SKIP_MISSING_DATA=1 skips such tests)");
  }
  return p;
}

/// The whole file at `path`, byte for byte (the file must exist).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace depthkv_test
