#pragma once
// A small GGUF writer for tests (synthetic and deliberately corrupt files, and re-encoded copies of
// a parsed file), plus independent reference decoders of half, bfloat16 and Q8_0 and encoders of
// F16 and Q8_0, written from the format definitions.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "depthkv/llama/gguf.hpp"
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
  void kv_bool_array(const std::string& key, const std::vector<bool>& v) {
    Bytes b;
    put<std::uint32_t>(b, 7);  // GGUF bool
    put<std::uint64_t>(b, v.size());
    for (bool x : v) put<std::uint8_t>(b, x ? 1 : 0);
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

// Bits of a positive normal half close to v (truncated mantissa; v clamped to >= 6.2e-5).
inline std::uint16_t half_near(float v) {
  int e = 0;
  const float m = std::frexp(std::max(v, 6.2e-5f), &e);  // v = m 2^e, m in [0.5, 1)
  return static_cast<std::uint16_t>(((e - 1 + 15) << 10) | static_cast<int>((2.0f * m - 1.0f) * 1024.0f));
}

// F16 data of n floats: each the half_near of its magnitude, with its sign.
inline Bytes f16_bytes(const float* x, std::size_t n) {
  Bytes b;
  for (std::size_t i = 0; i < n; ++i)
    put(b, static_cast<std::uint16_t>(half_near(std::fabs(x[i])) | (x[i] < 0 ? 0x8000 : 0)));
  return b;
}

// Q8_0 data of n floats (n a multiple of 32): per block of 32 the half d = half_near(max |x| / 127)
// and q = round(x / d) clamped to [-127, 127].
inline Bytes q8_0_bytes(const float* x, std::size_t n) {
  REQUIRE(n % 32 == 0);
  Bytes b;
  for (std::size_t blk = 0; blk < n / 32; ++blk) {
    float amax = 0.0f;
    for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
    const std::uint16_t d = half_near(amax / 127.0f);
    put(b, d);
    for (std::size_t j = 0; j < 32; ++j) {
      const double q = std::round(x[blk * 32 + j] / ref_half(d));
      put(b, static_cast<std::int8_t>(std::max(-127.0, std::min(127.0, q))));
    }
  }
  return b;
}

// The payload of a metadata value (without its type tag).
inline void put_value(Bytes& b, const depthkv::llama::GgufValue& v) {
  using depthkv::llama::GgufType;
  switch (v.type) {
    case GgufType::kUint8: put(b, static_cast<std::uint8_t>(v.u)); break;
    case GgufType::kInt8: put(b, static_cast<std::int8_t>(v.i)); break;
    case GgufType::kUint16: put(b, static_cast<std::uint16_t>(v.u)); break;
    case GgufType::kInt16: put(b, static_cast<std::int16_t>(v.i)); break;
    case GgufType::kUint32: put(b, static_cast<std::uint32_t>(v.u)); break;
    case GgufType::kInt32: put(b, static_cast<std::int32_t>(v.i)); break;
    case GgufType::kFloat32: put(b, static_cast<float>(v.f)); break;
    case GgufType::kBool: put(b, static_cast<std::uint8_t>(v.u)); break;
    case GgufType::kString: GgufWriter::str(b, v.s); break;
    case GgufType::kArray:
      put(b, static_cast<std::uint32_t>(v.array_type));
      put<std::uint64_t>(b, v.array.size());
      for (const auto& e : v.array) put_value(b, e);
      break;
    case GgufType::kUint64: put(b, static_cast<std::uint64_t>(v.u)); break;
    case GgufType::kInt64: put(b, static_cast<std::int64_t>(v.i)); break;
    case GgufType::kFloat64: put(b, v.f); break;
  }
}

// A writer holding f's metadata and tensors (their stored bytes), to re-encode some of them.
inline GgufWriter copy_of(const depthkv::llama::GgufFile& f) {
  GgufWriter w;
  w.version = f.version();
  w.alignment = f.alignment();
  for (const auto& kv : f.metadata()) {
    Bytes v;
    put_value(v, kv.second);
    w.raw_kv(kv.first, static_cast<std::uint32_t>(kv.second.type), v);
  }
  for (const auto& t : f.tensors()) {
    const std::uint8_t* p = f.tensor_data(t);
    w.tensor(t.name, t.dims, t.type, Bytes(p, p + t.n_bytes));
  }
  return w;
}

// The bytes of a copy of f whose 2-D F32 tensors are re-encoded: with `q8_0`, as Q8_0 where a row
// holds whole blocks of 32 values (F16 otherwise), else all as F16.
inline Bytes requantized_copy(const depthkv::llama::GgufFile& f, bool q8_0) {
  GgufWriter w = copy_of(f);
  for (auto& t : w.tensors) {
    if (t.dims.size() != 2 || t.type != kTF32) continue;
    std::vector<float> x(t.data.size() / sizeof(float));
    std::memcpy(x.data(), t.data.data(), t.data.size());
    const bool blocks = q8_0 && t.dims[0] % 32 == 0;
    t.type = blocks ? kTQ8_0 : kTF16;
    t.data = blocks ? q8_0_bytes(x.data(), x.size()) : f16_bytes(x.data(), x.size());
  }
  return w.build();
}

}  // namespace depthkv_test
