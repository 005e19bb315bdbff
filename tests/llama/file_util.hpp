#pragma once
// Helpers for the loader tests: whole-file reads, writes into a private temporary folder
// (never into ../shared), and little-endian byte building.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

namespace depthkv_test {

using Bytes = std::vector<std::uint8_t>;

inline Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "depthkv_llama_XXXXXX").string();
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
  /// Writes `bytes` to `name` inside the folder and returns the full path.
  std::string write(const std::string& name, const Bytes& bytes) const {
    const std::string p = path_ + "/" + name;
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

/// Appends the little-endian bytes of a trivially copyable value.
template <class T>
void put(Bytes& b, const T& v) {
  const std::size_t o = b.size();
  b.resize(o + sizeof(T));
  std::memcpy(b.data() + o, &v, sizeof(T));
}

/// Overwrites sizeof(T) bytes at `offset`.
template <class T>
void poke(Bytes& b, std::size_t offset, const T& v) {
  REQUIRE(offset + sizeof(T) <= b.size());
  std::memcpy(b.data() + offset, &v, sizeof(T));
}

/// Reads a value at `offset`.
template <class T>
T peek(const Bytes& b, std::size_t offset) {
  REQUIRE(offset + sizeof(T) <= b.size());
  T v;
  std::memcpy(&v, b.data() + offset, sizeof(T));
  return v;
}

}  // namespace depthkv_test
