#pragma once
// A small GGUF writer for tests (synthetic and deliberately corrupt files), plus independent
// reference decoders of half, bfloat16 and Q8_0 written from the format definitions.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "llama/file_util.hpp"

namespace depthkv_test {

// Value type numbers of the GGUF specification.
enum : std::uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kStr, kArr, kU64, kI64, kF64 };
// ggml tensor type numbers.
enum : std::uint32_t { kTF32 = 0, kTF16 = 1, kTQ8_0 = 8, kTQ4_K = 12, kTIQ2_XXS = 16, kTBF16 = 30 };

class GgufWriter {
 public:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type;
    Bytes data;
  };

  std::uint32_t version = 3;
  std::uint64_t alignment = 32;  // used for the layout; write general.alignment yourself to change it
  std::vector<Bytes> kvs;        // encoded key/value pairs
  std::vector<Tensor> tensors;

  static void str(Bytes& b, const std::string& s) {
    put<std::uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void raw_kv(const std::string& key, std::uint32_t type, const Bytes& value) {
    Bytes b;
    str(b, key);
    put(b, type);
    b.insert(b.end(), value.begin(), value.end());
    kvs.push_back(b);
  }
  template <class T>
  void kv(const std::string& key, std::uint32_t type, T v) {
    Bytes b;
    put(b, v);
    raw_kv(key, type, b);
  }
  void kv_u32(const std::string& key, std::uint32_t v) { kv(key, kU32, v); }
  void kv_f32(const std::string& key, float v) { kv(key, kF32, v); }
  void kv_str(const std::string& key, const std::string& v) {
    Bytes b;
    str(b, v);
    raw_kv(key, kStr, b);
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    Bytes b;
    put<std::uint32_t>(b, kStr);
    put<std::uint64_t>(b, v.size());
    for (const auto& s : v) str(b, s);
    raw_kv(key, kArr, b);
  }
  void kv_f32_array(const std::string& key, const std::vector<float>& v) {
    Bytes b;
    put<std::uint32_t>(b, kF32);
    put<std::uint64_t>(b, v.size());
    for (float x : v) put(b, x);
    raw_kv(key, kArr, b);
  }
  void kv_i32_array(const std::string& key, const std::vector<std::int32_t>& v) {
    Bytes b;
    put<std::uint32_t>(b, kI32);
    put<std::uint64_t>(b, v.size());
    for (std::int32_t x : v) put(b, x);
    raw_kv(key, kArr, b);
  }
  void tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type, Bytes data) {
    tensors.push_back({name, std::move(dims), type, std::move(data)});
  }
  void f32_tensor(const std::string& name, std::vector<std::uint64_t> dims, const std::vector<float>& v) {
    Bytes b;
    for (float x : v) put(b, x);
    tensor(name, std::move(dims), kTF32, b);
  }

  /// Offsets of each tensor info's offset field in the last build (to corrupt them).
  std::vector<std::size_t> offset_field_pos;

  Bytes build() {
    Bytes b = {'G', 'G', 'U', 'F'};
    put(b, version);
    put<std::uint64_t>(b, tensors.size());
    put<std::uint64_t>(b, kvs.size());
    for (const auto& k : kvs) b.insert(b.end(), k.begin(), k.end());
    std::uint64_t off = 0;
    std::vector<std::uint64_t> offs;
    offset_field_pos.clear();
    for (const auto& t : tensors) {
      str(b, t.name);
      put<std::uint32_t>(b, static_cast<std::uint32_t>(t.dims.size()));
      for (auto d : t.dims) put(b, d);
      put(b, t.type);
      offset_field_pos.push_back(b.size());
      put(b, off);
      offs.push_back(off);
      off += t.data.size();
      off = (off + alignment - 1) / alignment * alignment;
    }
    while (b.size() % alignment) b.push_back(0);
    const std::size_t data_start = b.size();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      b.resize(data_start + offs[i], 0);
      b.insert(b.end(), tensors[i].data.begin(), tensors[i].data.end());
    }
    return b;
  }
};

// Reference decoders, from the bit layouts (not from the library).
inline double ref_half(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
  if (e == 31) v = m ? NAN : INFINITY;
  return s ? -v : v;
}
inline double ref_bf16(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
  double v = e == 0 ? std::ldexp(m / 128.0, -126) : std::ldexp(1.0 + m / 128.0, e - 127);
  if (e == 255) v = m ? NAN : INFINITY;
  return s ? -v : v;
}

}  // namespace depthkv_test
