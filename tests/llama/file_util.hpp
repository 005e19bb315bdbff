#pragma once
// Helpers for the loader tests: whole-file reads and little-endian byte building (scratch
// files: support/temp_dir.hpp).

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/temp_dir.hpp"

namespace depthkv_test {

using Bytes = std::vector<std::uint8_t>;

inline Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

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
