#pragma once
// Scratch files for tests: a private folder under the system temp dir (TMPDIR, else /tmp),
// created with mkdtemp and removed with its contents on destruction. Tests never write into the
// shared data folder or a fixed path.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <stdlib.h>  // mkdtemp (POSIX)

#include <catch2/catch.hpp>

namespace depthkv_test {

/// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const std::string templ = (std::filesystem::temp_directory_path() / "depthkv_test_XXXXXX").string();
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  /// Full path of `name` inside the folder (the file is not created).
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Writes `bytes` to `name` inside the folder and returns the full path.
  std::string write(const std::string& name, const std::vector<std::uint8_t>& bytes) const {
    const std::string p = file(name);
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    REQUIRE(f.good());
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(f.good());
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// One TempDir per test program, created on first use and removed at exit.
inline const TempDir& scratch_dir() {
  static const TempDir dir;
  return dir;
}

/// Full path of `name` in the program's scratch folder (the file is not created).
inline std::string tmp_path(const std::string& name) { return scratch_dir().file(name); }

}  // namespace depthkv_test
