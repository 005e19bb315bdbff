#pragma once
/// @file llama/gguf.hpp
/// @brief GGUF (v2 and v3) reader: metadata, tensor table, tensors as float (F32, F16, BF16 and
/// the block formats Q4_0 ... Q6_K, IQ4_NL, IQ4_XS) or as their stored bytes in place,
/// Llama-family models (the architectures of architecture.hpp) and their tokenizer vocabulary.
///
/// File layout (little-endian): magic "GGUF", uint32 version, uint64 tensor count, uint64
/// metadata count; metadata key/value pairs (key: uint64 length + bytes; uint32 value type;
/// value, strings as uint64 length + bytes, arrays as uint32 element type + uint64 count +
/// elements); tensor infos (name string, uint32 n_dims, uint64 ne[n_dims] fastest dimension
/// first, uint32 ggml type, uint64 offset into the data section); padding to
/// `general.alignment` (default 32); the data section.
///
/// `GgufFile` parses the whole header and validates every length, count, shape and offset
/// against the file size before anything is used: a truncated or corrupt file is a
/// `depthkv::Error`, never an out-of-bounds read. Tensor data of the types `ggml_type_readable`
/// lists is converted to float bit-exactly as llama.cpp does (`dequantize_row`,
/// quant/dequantize.hpp); other types are listed (their names and sizes are known, so their
/// extents are validated too) but reading them throws an Error naming the type.
/// `GgufFile::raw_tensor` gives any tensor's stored bytes and type in place (a pointer into the
/// mapped file), for products that work on the quantized blocks (quant/products.hpp).
///
/// `load_gguf` builds a `LlamaModel` from a file of an architecture of the table in
/// architecture.hpp (`llama`, `qwen2`, `qwen3`: keys, tensor names, RoPE pairing, optional
/// tensors), with hyper-parameters from the `<arch>.*` keys; a GGUF dimension list [ne0, ne1]
/// is the row-major matrix [ne1][ne0] (`[out][in]`). Any other architecture, an unsupported tensor type, a missing or misshapen tensor, or a tensor the
/// engine would not use is an Error naming it. Block-quantized weight matrices stay in their
/// stored blocks in the mapping (`QuantWeight`) unless `GgufLoadOptions::dequantize` is set.
///
/// @code
/// depthkv::llama::GgufFile f = depthkv::llama::GgufFile::open("stories260K.gguf");
/// std::string arch = f.get_string("general.architecture");        // "llama"
/// depthkv::llama::LlamaModel m = depthkv::llama::load_gguf(f);
/// depthkv::llama::Vocabulary v = depthkv::llama::read_vocabulary(f);  // kind "llama", 512 tokens
/// @endcode

#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/architecture.hpp"
#include "depthkv/llama/detail/mapped_file.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"

namespace depthkv {
namespace llama {

/// The tokenizer vocabulary stored in a GGUF file (`tokenizer.ggml.*` keys).
struct Vocabulary {
  std::string model;                     ///< `tokenizer.ggml.model`: "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
  std::string pre;                       ///< `tokenizer.ggml.pre` (pre-tokenizer name; empty when absent)
  std::vector<std::string> tokens;       ///< `tokenizer.ggml.tokens`: piece of each id
  std::vector<float> scores;             ///< `tokenizer.ggml.scores` (empty when absent)
  std::vector<std::int32_t> token_types; ///< `tokenizer.ggml.token_type` (empty when absent; 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)
  int bos_id = -1;                       ///< `tokenizer.ggml.bos_token_id`, -1 when absent
  int eos_id = -1;                       ///< `tokenizer.ggml.eos_token_id`, -1 when absent
  int unk_id = -1;                       ///< `tokenizer.ggml.unknown_token_id`, -1 when absent
  int eot_id = -1;                       ///< `tokenizer.ggml.eot_token_id` (end of turn), -1 when absent
  std::vector<std::string> merges;       ///< `tokenizer.ggml.merges` ("left right" per rank; byte-level BPE)
  bool has_merges = false;               ///< the file has a `tokenizer.ggml.merges` key (possibly empty)
  bool add_bos = true;                   ///< `tokenizer.ggml.add_bos_token` (default true)
  bool add_bos_set = false;              ///< the file has a `tokenizer.ggml.add_bos_token` key
  bool add_eos = false;                  ///< `tokenizer.ggml.add_eos_token` (default false)
  bool add_space_prefix = true;          ///< `tokenizer.ggml.add_space_prefix` (default true)

  /// @return number of tokens
  int size() const { return static_cast<int>(tokens.size()); }
};

/// GGUF metadata value types (the numbers stored in the file).
enum class GgufType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// @param t a metadata value type
/// @return its GGUF name ("uint32", "string", ...), or "unknown"
inline const char* to_string(GgufType t) {
  static const char* names[] = {"uint8", "int8",  "uint16", "int16",  "uint32", "int32",  "float32",
                                "bool",  "string", "array", "uint64", "int64",  "float64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

/// @param type a ggml type number
/// @return true for the types `GgufFile::read_tensor` converts to float: F32, F16, BF16, Q4_0,
///   Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (`ggml_type_dequantizable`)
inline bool ggml_type_readable(std::uint32_t type) { return ggml_type_dequantizable(type); }

/// One metadata value: a scalar, a string, or an array of values (possibly nested).
struct GgufValue {
  GgufType type = GgufType::kUint8;        ///< its type
  GgufType array_type = GgufType::kUint8;  ///< element type when `type == kArray`
  std::uint64_t u = 0;                     ///< value of unsigned integer types and bool
  std::int64_t i = 0;                      ///< value of signed integer types
  double f = 0;                            ///< value of float32 / float64
  std::string s;                           ///< value of a string
  std::vector<GgufValue> array;            ///< elements of an array

  /// @return true for the eight integer types
  bool is_integer() const {
    switch (type) {
      case GgufType::kUint8: case GgufType::kUint16: case GgufType::kUint32: case GgufType::kUint64:
      case GgufType::kInt8: case GgufType::kInt16: case GgufType::kInt32: case GgufType::kInt64:
        return true;
      default:
        return false;
    }
  }
  /// @return true for float32 / float64
  bool is_float() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }
  /// @return true for the unsigned integer types
  bool is_unsigned() const {
    return type == GgufType::kUint8 || type == GgufType::kUint16 || type == GgufType::kUint32 ||
           type == GgufType::kUint64;
  }
};

/// One entry of the tensor table.
struct GgufTensorInfo {
  std::string name;                 ///< e.g. "blk.0.attn_q.weight"
  std::vector<std::uint64_t> dims;  ///< ne[0] (fastest, columns) first
  std::uint32_t type = 0;           ///< ggml type number
  std::uint64_t offset = 0;         ///< offset of the data from the start of the data section
  std::uint64_t n_elements = 0;     ///< product of dims
  std::uint64_t n_bytes = 0;        ///< size of the data (0 when the type is unknown)
};

/// A parsed GGUF file: version, metadata, tensor table and access to the tensor data.
/// Cheap to copy (the bytes are shared). Usage:
/// @code
/// auto f = depthkv::llama::GgufFile::open("model.gguf");
/// for (const auto& t : f.tensors()) std::cout << t.name << " " << ggml_type_name(t.type) << "\n";
/// std::vector<float> w = f.read_tensor(*f.find_tensor("token_embd.weight"));
/// @endcode
class GgufFile {
 public:
  /// Limits that keep parsing bounded on hostile input.
  static constexpr std::uint64_t kMaxKeyLength = 65535;
  static constexpr std::uint64_t kMaxTensorNameLength = 64;
  static constexpr std::uint32_t kMaxDims = 4;
  static constexpr int kMaxArrayNesting = 8;

  /// Maps and parses `path`.
  /// @param path a GGUF file
  /// @return the parsed file (the mapping lives as long as any copy of it)
  /// @throws Error when the file cannot be read or is not a valid GGUF v2/v3 file
  static GgufFile open(const std::string& path) {
    auto mapped = std::make_shared<detail::MappedFile>(path);
    GgufFile f;
    f.data_ = mapped->data();
    f.size_ = mapped->size();
    f.keep_alive_ = mapped;
    f.source_ = path;
    f.parse();
    return f;
  }

  /// Parses a copy of `size` bytes at `data`.
  /// @param data the file's bytes (may be nullptr when size == 0)
  /// @param size their number
  /// @param source name for error messages
  /// @return the parsed file
  /// @throws Error when the bytes are not a valid GGUF v2/v3 file
  static GgufFile from_memory(const std::uint8_t* data, std::size_t size, const std::string& source = "<memory>") {
    auto copy = std::make_shared<std::vector<std::uint8_t>>(data, data + size);
    GgufFile f;
    f.data_ = copy->data();
    f.size_ = copy->size();
    f.keep_alive_ = copy;
    f.source_ = source;
    f.parse();
    return f;
  }

  /// @return the format version (2 or 3)
  std::uint32_t version() const { return version_; }
  /// @return the data alignment (`general.alignment`, default 32)
  std::uint64_t alignment() const { return alignment_; }
  /// @return offset of the data section from the start of the file
  std::uint64_t data_offset() const { return data_offset_; }
  /// @return size of the file in bytes
  std::size_t file_size() const { return size_; }
  /// @return path or name the file was read from
  const std::string& source() const { return source_; }
  /// @return FNV-1a 64 of the first min(size, 1 MiB) bytes
  std::uint64_t header_hash() const { return detail::model_header_hash(data_, size_); }

  /// @return all metadata pairs in file order
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// @return the tensor table in file order
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  /// @param key a metadata key
  /// @return its value, or nullptr when absent
  const GgufValue* find(const std::string& key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
  }
  /// @param name a tensor name
  /// @return its info, or nullptr when absent
  const GgufTensorInfo* find_tensor(const std::string& name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }

  /// @param key a metadata key holding a string
  /// @return the string
  /// @throws Error when absent or not a string
  std::string get_string(const std::string& key) const { return as_string(require(key), key); }
  /// @param key a metadata key
  /// @param fallback value when absent
  /// @return the string or `fallback`
  /// @throws Error when present but not a string
  std::string get_string(const std::string& key, const std::string& fallback) const {
    const GgufValue* v = find(key);
    return v ? as_string(*v, key) : fallback;
  }
  /// @param key a metadata key holding an integer (any of the 8 integer types)
  /// @return its value
  /// @throws Error when absent, not an integer, or above INT64_MAX
  std::int64_t get_int(const std::string& key) const { return as_int(require(key), key); }
  /// @param key a metadata key
  /// @param fallback value when absent
  /// @return the integer or `fallback`
  /// @throws Error when present but not an integer
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const {
    const GgufValue* v = find(key);
    return v ? as_int(*v, key) : fallback;
  }
  /// @param key a metadata key holding a float32/float64 (integers are accepted too)
  /// @return its value
  /// @throws Error when absent or not a number
  double get_float(const std::string& key) const { return as_float(require(key), key); }
  /// @param key a metadata key
  /// @param fallback value when absent
  /// @return the number or `fallback`
  /// @throws Error when present but not a number
  double get_float(const std::string& key, double fallback) const {
    const GgufValue* v = find(key);
    return v ? as_float(*v, key) : fallback;
  }
  /// @param key a metadata key
  /// @param fallback value when absent
  /// @return the bool or `fallback`
  /// @throws Error when present but not a bool
  bool get_bool(const std::string& key, bool fallback) const {
    const GgufValue* v = find(key);
    if (!v) return fallback;
    DEPTHKV_CHECK(v->type == GgufType::kBool, source_ << ": metadata '" << key << "' is " << to_string(v->type)
                                                      << ", expected bool");
    return v->u != 0;
  }
  /// @param key a metadata key holding an array of strings
  /// @return the strings
  /// @throws Error when absent or not an array of strings
  std::vector<std::string> get_string_array(const std::string& key) const {
    const GgufValue& v = require_array(key, "string");
    std::vector<std::string> out;
    out.reserve(v.array.size());
    for (const GgufValue& e : v.array) out.push_back(as_string(e, key));
    return out;
  }
  /// @param key a metadata key holding an array of numbers
  /// @return the values as float
  /// @throws Error when absent or not an array of numbers
  std::vector<float> get_float_array(const std::string& key) const {
    const GgufValue& v = require_array(key, "number");
    std::vector<float> out;
    out.reserve(v.array.size());
    for (const GgufValue& e : v.array) out.push_back(static_cast<float>(as_float(e, key)));
    return out;
  }
  /// @param key a metadata key holding an array of integers
  /// @return the values
  /// @throws Error when absent or not an array of integers
  std::vector<std::int64_t> get_int_array(const std::string& key) const {
    const GgufValue& v = require_array(key, "integer");
    std::vector<std::int64_t> out;
    out.reserve(v.array.size());
    for (const GgufValue& e : v.array) out.push_back(as_int(e, key));
    return out;
  }

  /// @param t a tensor of this file
  /// @return pointer to its raw data (validated to lie inside the file when its type is known)
  /// @throws Error when the tensor's type is unknown (its extent cannot be checked)
  const std::uint8_t* tensor_data(const GgufTensorInfo& t) const {
    GgmlTypeInfo info{};
    DEPTHKV_CHECK(ggml_type_info(t.type, info),
                  source_ << ": tensor '" << t.name << "' has unknown ggml type " << t.type);
    return data_ + data_offset_ + t.offset;
  }

  /// A tensor's stored bytes in place (no copy) and how to walk them: `rows` rows of `cols`
  /// values, each `row_bytes` long (see quant/dequantize.hpp for the block layouts). Valid while
  /// the file (or a copy of it, or `keep_alive()`) lives.
  struct RawTensor {
    GgmlType type = GgmlType::kF32;     ///< the stored type
    const std::uint8_t* data = nullptr; ///< first byte (no alignment beyond `alignment()` is implied)
    std::uint64_t n_bytes = 0;          ///< size of the data
    std::int64_t cols = 0;              ///< ne[0], values per row
    std::int64_t rows = 0;              ///< product of ne[1..], the number of rows
    std::uint64_t row_bytes = 0;        ///< bytes of one row
  };

  /// @param t a tensor of this file
  /// @return its stored bytes and type, in place in the mapped (or copied) file
  /// @throws Error when the tensor's type is unknown (its extent cannot be checked)
  RawTensor raw_tensor(const GgufTensorInfo& t) const {
    RawTensor r;
    r.data = tensor_data(t);
    r.type = static_cast<GgmlType>(t.type);
    r.n_bytes = t.n_bytes;
    r.cols = static_cast<std::int64_t>(t.dims.empty() ? 0 : t.dims[0]);
    r.rows = r.cols > 0 ? static_cast<std::int64_t>(t.n_elements) / r.cols : 0;
    r.row_bytes = r.rows > 0 ? t.n_bytes / static_cast<std::uint64_t>(r.rows) : 0;
    return r;
  }

  /// @return the owner of the file's bytes (the mapping or the copy): holding it keeps
  ///   `tensor_data` / `raw_tensor` pointers valid after every GgufFile copy is gone
  std::shared_ptr<const void> keep_alive() const { return keep_alive_; }

  /// Converts a tensor to float into `out` (n_elements values, in storage order: ne[0] fastest),
  /// bit-exact with llama.cpp (see `dequantize_row`).
  /// @param t a tensor of this file
  /// @param out destination of `t.n_elements` floats
  /// @throws Error when the type is not one of `ggml_type_readable`
  void read_tensor_into(const GgufTensorInfo& t, float* out) const {
    check_readable(t);
    dequantize_row(static_cast<GgmlType>(t.type), tensor_data(t), out, static_cast<std::int64_t>(t.n_elements));
  }

  /// Converts a tensor to float (see `read_tensor_into`).
  /// @param t a tensor of this file
  /// @return its `n_elements` values
  /// @throws Error when the type is not one of `ggml_type_readable`
  std::vector<float> read_tensor(const GgufTensorInfo& t) const {
    check_readable(t);
    std::vector<float> out(static_cast<std::size_t>(t.n_elements));
    read_tensor_into(t, out.data());
    return out;
  }

 private:
  GgufFile() = default;

  void check_readable(const GgufTensorInfo& t) const {
    DEPTHKV_CHECK(ggml_type_readable(t.type), source_ << ": tensor '" << t.name << "' has type " << ggml_type_name(t.type)
                                                      << ", which depthkv does not read (supported: "
                                                      << ggml_dequantizable_names() << ")");
  }

  const GgufValue& require(const std::string& key) const {
    const GgufValue* v = find(key);
    DEPTHKV_CHECK(v != nullptr, source_ << ": metadata key '" << key << "' is missing");
    return *v;
  }
  const GgufValue& require_array(const std::string& key, const char* what) const {
    const GgufValue& v = require(key);
    DEPTHKV_CHECK(v.type == GgufType::kArray,
                  source_ << ": metadata '" << key << "' is " << to_string(v.type) << ", expected an array of " << what);
    return v;
  }
  std::string as_string(const GgufValue& v, const std::string& key) const {
    DEPTHKV_CHECK(v.type == GgufType::kString,
                  source_ << ": metadata '" << key << "' is " << to_string(v.type) << ", expected string");
    return v.s;
  }
  std::int64_t as_int(const GgufValue& v, const std::string& key) const {
    DEPTHKV_CHECK(v.is_integer(), source_ << ": metadata '" << key << "' is " << to_string(v.type) << ", expected an integer");
    if (v.is_unsigned()) {
      DEPTHKV_CHECK(v.u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                    source_ << ": metadata '" << key << "' = " << v.u << " is too large");
      return static_cast<std::int64_t>(v.u);
    }
    return v.i;
  }
  double as_float(const GgufValue& v, const std::string& key) const {
    if (v.is_float()) return v.f;
    if (v.is_integer()) return v.is_unsigned() ? static_cast<double>(v.u) : static_cast<double>(v.i);
    DEPTHKV_FAIL(source_ << ": metadata '" << key << "' is " << to_string(v.type) << ", expected a number");
  }

  std::string read_string(detail::ByteReader& in, std::uint64_t max_len, const char* what) const {
    const std::uint64_t len = in.read<std::uint64_t>(what);
    DEPTHKV_CHECK(len <= max_len, source_ << ": " << what << " at offset " << in.offset() - 8 << " has length " << len
                                          << " (at most " << max_len << " allowed)");
    DEPTHKV_CHECK(len <= in.remaining(), source_ << ": " << what << " at offset " << in.offset() - 8 << " has length "
                                                 << len << " but only " << in.remaining() << " bytes remain");
    const std::uint8_t* p = in.take(len, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(len));
  }

  // Smallest encoded size of a value of type t (for bounding array counts before allocating).
  static std::uint64_t min_value_size(GgufType t) {
    switch (t) {
      case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
      case GgufType::kUint16: case GgufType::kInt16: return 2;
      case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
      case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: case GgufType::kString: return 8;
      case GgufType::kArray: return 12;
    }
    return 1;
  }

  GgufValue read_value(detail::ByteReader& in, GgufType type, const std::string& key, int depth) const {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::kUint8: v.u = in.read<std::uint8_t>("a uint8 value"); break;
      case GgufType::kInt8: v.i = in.read<std::int8_t>("an int8 value"); break;
      case GgufType::kUint16: v.u = in.read<std::uint16_t>("a uint16 value"); break;
      case GgufType::kInt16: v.i = in.read<std::int16_t>("an int16 value"); break;
      case GgufType::kUint32: v.u = in.read<std::uint32_t>("a uint32 value"); break;
      case GgufType::kInt32: v.i = in.read<std::int32_t>("an int32 value"); break;
      case GgufType::kUint64: v.u = in.read<std::uint64_t>("a uint64 value"); break;
      case GgufType::kInt64: v.i = in.read<std::int64_t>("an int64 value"); break;
      case GgufType::kFloat32: v.f = in.read<float>("a float32 value"); break;
      case GgufType::kFloat64: v.f = in.read<double>("a float64 value"); break;
      case GgufType::kBool: {
        const std::uint8_t b = in.read<std::uint8_t>("a bool value");
        DEPTHKV_CHECK(b <= 1, source_ << ": metadata '" << key << "': bool at offset " << in.offset() - 1
                                      << " has value " << static_cast<int>(b) << " (must be 0 or 1)");
        v.u = b;
        break;
      }
      case GgufType::kString: v.s = read_string(in, std::numeric_limits<std::uint64_t>::max(), "a string value"); break;
      case GgufType::kArray: {
        DEPTHKV_CHECK(depth < kMaxArrayNesting,
                      source_ << ": metadata '" << key << "': arrays nested deeper than " << kMaxArrayNesting);
        const std::uint32_t et = in.read<std::uint32_t>("an array element type");
        DEPTHKV_CHECK(et <= 12, source_ << ": metadata '" << key << "': array element type " << et << " at offset "
                                        << in.offset() - 4 << " is not a GGUF value type");
        v.array_type = static_cast<GgufType>(et);
        const std::uint64_t count = in.read<std::uint64_t>("an array length");
        const std::uint64_t min_size = min_value_size(v.array_type);
        DEPTHKV_CHECK(count <= in.remaining() / min_size,
                      source_ << ": metadata '" << key << "': array of " << count << " " << to_string(v.array_type)
                              << " values cannot fit in the " << in.remaining() << " bytes left");
        v.array.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t k = 0; k < count; ++k) v.array.push_back(read_value(in, v.array_type, key, depth + 1));
        break;
      }
    }
    return v;
  }

  void parse() {
    DEPTHKV_CHECK(detail::host_is_little_endian(), "GGUF files can only be read on little-endian hosts");
    detail::ByteReader in(data_, size_, source_);
    in.require(4, "the GGUF magic");
    DEPTHKV_CHECK(std::memcmp(data_, "GGUF", 4) == 0, source_ << ": not a GGUF file (bad magic)");
    in.skip(4);
    version_ = in.read<std::uint32_t>("the GGUF version");
    DEPTHKV_CHECK(version_ != 1, source_ << ": GGUF version 1 is not supported (only 2 and 3)");
    DEPTHKV_CHECK(version_ == 2 || version_ == 3,
                  source_ << ": unsupported GGUF version " << version_
                          << (version_ > 0xFFFF ? " (a big-endian file?)" : " (only 2 and 3)"));
    const std::uint64_t n_tensors = in.read<std::uint64_t>("the tensor count");
    const std::uint64_t n_kv = in.read<std::uint64_t>("the metadata count");
    // Each pair needs at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes; each
    // tensor info at least 8 + 1 + 4 + 4 + 8.
    DEPTHKV_CHECK(n_kv <= in.remaining() / 14,
                  source_ << ": metadata count " << n_kv << " cannot fit in a file of " << size_ << " bytes");
    DEPTHKV_CHECK(n_tensors <= in.remaining() / 25,
                  source_ << ": tensor count " << n_tensors << " cannot fit in a file of " << size_ << " bytes");
    parse_metadata(in, n_kv);
    read_alignment();
    tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t k = 0; k < n_tensors; ++k) {
      GgufTensorInfo t = parse_tensor_info(in, k);
      DEPTHKV_CHECK(tensor_index_.emplace(t.name, tensors_.size()).second,
                    source_ << ": duplicate tensor name '" << t.name << "'");
      tensors_.push_back(std::move(t));
    }
    check_data_section(in.offset());
  }

  void parse_metadata(detail::ByteReader& in, std::uint64_t n_kv) {
    metadata_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t k = 0; k < n_kv; ++k) {
      std::string key = read_string(in, kMaxKeyLength, "a metadata key");
      DEPTHKV_CHECK_AS("parse", !key.empty(), source_ << ": metadata pair " << k << " has an empty key");
      const std::uint32_t t = in.read<std::uint32_t>("a metadata value type");
      DEPTHKV_CHECK_AS(
          "parse", t <= 12,
          source_ << ": metadata '" << key << "' has value type " << t << ", which is not a GGUF value type");
      GgufValue v = read_value(in, static_cast<GgufType>(t), key, 0);
      DEPTHKV_CHECK_AS("parse", key_index_.emplace(key, metadata_.size()).second,
                       source_ << ": duplicate metadata key '" << key << "'");
      metadata_.emplace_back(std::move(key), std::move(v));
    }
  }

  void read_alignment() {
    alignment_ = 32;
    if (const GgufValue* a = find("general.alignment")) {
      DEPTHKV_CHECK_AS(
          "parse", a->is_integer() && a->is_unsigned(),
          source_ << ": general.alignment is " << to_string(a->type) << ", expected an unsigned integer");
      DEPTHKV_CHECK_AS("parse", a->u > 0 && a->u <= (1u << 30) && (a->u & (a->u - 1)) == 0,
                       source_ << ": general.alignment " << a->u << " is not a power of two in [1, 2^30]");
      alignment_ = a->u;
    }
  }

  // Reads tensor info `k`: name, dimensions, type, offset; sizes the data when the type is known.
  GgufTensorInfo parse_tensor_info(detail::ByteReader& in, std::uint64_t k) const {
    GgufTensorInfo t;
    t.name = read_string(in, kMaxTensorNameLength, "a tensor name");
    DEPTHKV_CHECK_AS("parse", !t.name.empty(), source_ << ": tensor " << k << " has an empty name");
    const std::uint32_t n_dims = in.read<std::uint32_t>("a tensor dimension count");
    DEPTHKV_CHECK_AS("parse", n_dims >= 1 && n_dims <= kMaxDims,
                     source_ << ": tensor '" << t.name << "' has " << n_dims << " dimensions (1 to "
                             << kMaxDims << " allowed)");
    t.n_elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t ne = in.read<std::uint64_t>("a tensor dimension");
      DEPTHKV_CHECK_AS("parse", ne >= 1,
                       source_ << ": tensor '" << t.name << "' has dimension " << d << " = 0");
      DEPTHKV_CHECK_AS(
          "parse",
          detail::checked_mul(t.n_elements, ne, t.n_elements) &&
              t.n_elements <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
          source_ << ": tensor '" << t.name << "' has too many elements");
      t.dims.push_back(ne);
    }
    t.type = in.read<std::uint32_t>("a tensor type");
    t.offset = in.read<std::uint64_t>("a tensor offset");
    GgmlTypeInfo info{};
    if (ggml_type_info(t.type, info)) {
      DEPTHKV_CHECK_AS("parse", t.dims[0] % info.block_size == 0,
                       source_ << ": tensor '" << t.name << "' of type " << info.name << " has ne[0] = "
                               << t.dims[0] << ", not a multiple of its block size " << info.block_size);
      DEPTHKV_CHECK_AS("parse",
                       detail::checked_mul(t.n_elements / info.block_size, info.type_size, t.n_bytes),
                       source_ << ": tensor '" << t.name << "' is too large");
    }
    DEPTHKV_CHECK_AS("parse", t.offset % alignment_ == 0,
                     source_ << ": tensor '" << t.name << "' has offset " << t.offset
                             << ", not a multiple of the alignment " << alignment_);
    return t;
  }

  // Data section: the end of the tensor infos (`end`), rounded up to the alignment; every
  // tensor must lie inside it.
  void check_data_section(std::uint64_t end) {
    const std::uint64_t pad = (alignment_ - end % alignment_) % alignment_;
    data_offset_ = end + pad;
    if (tensors_.empty()) return;
    DEPTHKV_CHECK_AS("parse", data_offset_ <= size_,
                     source_ << ": the data section would start at " << data_offset_
                             << ", past the end of the file (" << size_ << " bytes)");
    const std::uint64_t data_size = size_ - data_offset_;
    for (const GgufTensorInfo& t : tensors_) {
      std::uint64_t stop = 0;
      DEPTHKV_CHECK_AS(
          "parse",
          t.offset <= data_size && detail::checked_add(t.offset, t.n_bytes, stop) && stop <= data_size,
          source_ << ": tensor '" << t.name << "' (" << ggml_type_name(t.type) << ", " << t.n_bytes
                  << " bytes at data offset " << t.offset
                  << ") extends past the end of the file (data section of " << data_size << " bytes)");
    }
  }

  std::shared_ptr<const void> keep_alive_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::string source_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, std::size_t> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> tensor_index_;
};

/// Whether a file starts with the GGUF magic (to choose between `load_gguf` and
/// `load_llama2c`); the rest of the file is not validated.
/// @param path a file
/// @return true when its first 4 bytes are "GGUF"; false otherwise, also when it cannot be read
inline bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

/// Reads the tokenizer vocabulary (`tokenizer.ggml.*`).
/// @param f a parsed GGUF file
/// @return the vocabulary; ids equal to the uint32 0xFFFFFFFF (llama.cpp's "no token") or absent
///   mean "absent" (-1)
/// @throws Error when the file has no `tokenizer.ggml.model` / `tokenizer.ggml.tokens`, when
///   scores or token types do not have one entry per token, when a token type is outside 0..6,
///   when an id is negative or out of range, or when
///   `tokenizer.ggml.merges` is present but not an array of strings
inline Vocabulary read_vocabulary(const GgufFile& f) {
  Vocabulary v;
  const std::string& src = f.source();
  DEPTHKV_CHECK(f.find("tokenizer.ggml.model") != nullptr, src << ": the file holds no tokenizer (tokenizer.ggml.model is missing)");
  v.model = f.get_string("tokenizer.ggml.model");
  v.pre = f.get_string("tokenizer.ggml.pre", "");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  DEPTHKV_CHECK(!v.tokens.empty(), src << ": tokenizer.ggml.tokens is empty");
  DEPTHKV_CHECK(v.tokens.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()), src << ": too many tokens");
  const std::size_t n = v.tokens.size();
  if (f.find("tokenizer.ggml.scores")) {
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    DEPTHKV_CHECK(v.scores.size() == n, src << ": tokenizer.ggml.scores has " << v.scores.size() << " entries for " << n << " tokens");
  }
  if (f.find("tokenizer.ggml.token_type")) {
    const std::vector<std::int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    DEPTHKV_CHECK(types.size() == n, src << ": tokenizer.ggml.token_type has " << types.size() << " entries for " << n << " tokens");
    v.token_types.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t t = types[i];
      DEPTHKV_CHECK(t >= 0 && t <= 6, src << ": tokenizer.ggml.token_type of token " << i << " is " << t
                                          << ", not a token type (0 undefined, 1 normal, 2 unknown, 3 control, "
                                             "4 user-defined, 5 unused, 6 byte)");
      v.token_types.push_back(static_cast<std::int32_t>(t));
    }
  }
  auto id = [&](const char* key) {
    const GgufValue* val = f.find(key);
    if (!val) return -1;
    if (val->is_integer() && val->is_unsigned() && val->u == 0xFFFFFFFFull) return -1;  // llama.cpp's "no token"
    const std::int64_t x = f.get_int(key);
    DEPTHKV_CHECK(x >= 0, src << ": " << key << " = " << x
                              << " is not a token id (an absent token is written as the uint32 0xFFFFFFFF or left out)");
    DEPTHKV_CHECK(static_cast<std::uint64_t>(x) < n, src << ": " << key << " = " << x << " is out of range for " << n << " tokens");
    return static_cast<int>(x);
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.eot_id = id("tokenizer.ggml.eot_token_id");
  if (f.find("tokenizer.ggml.merges")) {
    v.merges = f.get_string_array("tokenizer.ggml.merges");
    v.has_merges = true;
  }
  v.add_bos_set = f.find("tokenizer.ggml.add_bos_token") != nullptr;
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", true);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  return v;
}

/// Reads the tokenizer vocabulary of a GGUF file.
/// @param path a GGUF file
/// @return its vocabulary (see `read_vocabulary`)
/// @throws Error when the file is invalid or has no tokenizer
inline Vocabulary load_gguf_vocabulary(const std::string& path) { return read_vocabulary(GgufFile::open(path)); }

/// Options of `load_gguf`.
struct GgufLoadOptions {
  /// false (default): weight matrices stored as F16, BF16 or a block type (Q4_0 ... Q6_K,
  /// IQ4_NL, IQ4_XS) stay as stored, in place in the mapped file (`QuantWeight`, no float
  /// copy); F32 matrices, norms and biases are float32. true: every tensor is converted to
  /// float32 (the dequantized twin of the model, e.g. to check the quantized products).
  bool dequantize = false;
};

namespace detail {

// Checks that tensor `name` exists with GGUF dims [cols, rows] (rows == 0: [cols]); trailing
// dimensions of 1 are allowed.
inline const GgufTensorInfo& gguf_shaped(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols) {
  const GgufTensorInfo* t = f.find_tensor(name);
  DEPTHKV_CHECK(t != nullptr, f.source() << ": tensor '" << name << "' is missing");
  std::vector<std::uint64_t> want = {static_cast<std::uint64_t>(cols)};
  if (rows > 0) want.push_back(static_cast<std::uint64_t>(rows));
  bool ok = t->dims.size() >= want.size();
  for (std::size_t d = 0; ok && d < t->dims.size(); ++d) ok = t->dims[d] == (d < want.size() ? want[d] : 1);
  if (!ok) {
    std::ostringstream got, exp;
    for (std::size_t d = 0; d < t->dims.size(); ++d) got << (d ? ", " : "") << t->dims[d];
    for (std::size_t d = 0; d < want.size(); ++d) exp << (d ? ", " : "") << want[d];
    DEPTHKV_FAIL(f.source() << ": tensor '" << name << "' has shape [" << got.str() << "], expected [" << exp.str()
                            << "] (GGUF order, ne[0] first)");
  }
  return *t;
}

// Loads the tensor `name` as a [rows][cols] row-major matrix (GGUF dims [cols, rows]) or a
// vector (rows == 0: dims [cols]); trailing dimensions of 1 are allowed. Non-finite values are
// rejected.
inline void gguf_load(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols,
                      float* (*resize)(void*, std::int64_t, std::int64_t), void* dst,
                      std::set<std::string>& used) {
  const GgufTensorInfo* t = &gguf_shaped(f, name, rows, cols);
  float* out = resize(dst, rows > 0 ? rows : cols, rows > 0 ? cols : 1);
  f.read_tensor_into(*t, out);
  for (std::uint64_t i = 0; i < t->n_elements; ++i) {
    DEPTHKV_CHECK(std::isfinite(out[i]), f.source() << ": tensor '" << name << "' has a non-finite value at element " << i);
  }
  used.insert(name);
}

inline void gguf_matrix(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols,
                        RowMatrix& m, std::set<std::string>& used) {
  gguf_load(f, name, rows, cols,
            [](void* p, std::int64_t r, std::int64_t c) {
              auto* mm = static_cast<RowMatrix*>(p);
              mm->resize(r, c);
              return mm->data();
            },
            &m, used);
}

// Whether a tensor of type `type` is kept in its stored blocks by the default load.
// Every stored type but F32 (F16 and BF16 rows are converted in registers by the products;
// F32 matrices go to Eigen's float32 product, faster than the FMA loop on F32 rows).
inline bool gguf_keep_quantized(std::uint32_t type) {
  return ggml_type_dequantizable(type) && type != static_cast<std::uint32_t>(GgmlType::kF32);
}

// Loads the weight matrix `name` [rows][cols]: in place as a QuantWeight `q` (m left empty)
// when its type is a block type, F16 or BF16 and `opt.dequantize` is false, else as float32
// into `m`.
// The quantized rows are dequantized one at a time into a scratch row to reject non-finite
// values (no copy of the matrix is kept).
inline void gguf_weight(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols, RowMatrix& m,
                        QuantWeight& q, const GgufLoadOptions& opt, std::set<std::string>& used) {
  const GgufTensorInfo& t = gguf_shaped(f, name, rows, cols);
  if (opt.dequantize || !gguf_keep_quantized(t.type)) {
    gguf_matrix(f, name, rows, cols, m, used);
    return;
  }
  const GgufFile::RawTensor raw = f.raw_tensor(t);
  DEPTHKV_CHECK(raw.rows == rows && raw.cols == cols && raw.row_bytes == ggml_row_bytes(raw.type, cols) &&
                    raw.n_bytes == raw.row_bytes * static_cast<std::uint64_t>(rows),
                f.source() << ": tensor '" << name << "' (" << ggml_type_name(t.type) << ") has " << raw.n_bytes
                           << " bytes for " << rows << " rows of " << cols << " values");
  std::vector<float> scratch(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    dequantize_row(raw.type, raw.data + static_cast<std::size_t>(r) * raw.row_bytes, scratch.data(), cols);
    for (std::int64_t k = 0; k < cols; ++k) {
      DEPTHKV_CHECK(std::isfinite(scratch[static_cast<std::size_t>(k)]),
                    f.source() << ": tensor '" << name << "' has a non-finite value at element " << r * cols + k);
    }
  }
  m.resize(0, 0);
  q.type = raw.type;
  q.data = raw.data;
  q.rows = rows;
  q.cols = cols;
  q.row_bytes = raw.row_bytes;
  q.keep_alive = f.keep_alive();
  used.insert(name);
}

inline void gguf_vector(const GgufFile& f, const std::string& name, std::int64_t n, Eigen::VectorXf& v,
                        std::set<std::string>& used) {
  gguf_load(f, name, 0, n,
            [](void* p, std::int64_t r, std::int64_t) {
              auto* vv = static_cast<Eigen::VectorXf*>(p);
              vv->resize(r);
              return vv->data();
            },
            &v, used);
}

inline int gguf_hparam(const GgufFile& f, const std::string& key, std::int64_t lo, std::int64_t hi) {
  const GgufValue* v = f.find(key);
  DEPTHKV_CHECK(v != nullptr, f.source() << ": metadata key '" << key << "' is missing");
  DEPTHKV_CHECK(v->type != GgufType::kArray,
                f.source() << ": metadata '" << key << "' is an array (per-layer values are not supported)");
  const std::int64_t x = f.get_int(key);
  DEPTHKV_CHECK(x >= lo && x <= hi, f.source() << ": metadata '" << key << "' = " << x << " is out of range [" << lo
                                               << ", " << hi << "]");
  return static_cast<int>(x);
}

// The per-layer tensors the loader reads, in reading order: which name of GgufTensorNames, which
// member of LlamaLayerWeights (a vector, or a matrix with its quantized form), the extents, and
// the architecture's TensorUse of its optional group (nullptr: always required).
enum class GgufExtent { kNone, kDim, kHiddenDim, kQDim, kKvDim, kHeadDim };

struct GgufLayerTensor {
  std::string GgufTensorNames::*name;
  Eigen::VectorXf LlamaLayerWeights::*vec;  // vectors; nullptr for matrices
  RowMatrix LlamaLayerWeights::*mat;        // matrices; nullptr for vectors
  QuantWeight LlamaLayerWeights::*quant;    // the matrix's quantized form
  GgufExtent rows;                          // kNone for vectors
  GgufExtent cols;                          // the vector's length for vectors
  TensorUse Architecture::*group;           // nullptr: required in every architecture
};

inline const std::vector<GgufLayerTensor>& gguf_layer_tensors() {
  using N = GgufTensorNames;
  using W = LlamaLayerWeights;
  using E = GgufExtent;
  static const std::vector<GgufLayerTensor> table = {
      {&N::attn_norm, &W::attn_norm, nullptr, nullptr, E::kNone, E::kDim, nullptr},
      {&N::attn_q, nullptr, &W::wq, &W::wq_quant, E::kQDim, E::kDim, nullptr},
      {&N::attn_k, nullptr, &W::wk, &W::wk_quant, E::kKvDim, E::kDim, nullptr},
      {&N::attn_v, nullptr, &W::wv, &W::wv_quant, E::kKvDim, E::kDim, nullptr},
      {&N::attn_output, nullptr, &W::wo, &W::wo_quant, E::kDim, E::kQDim, nullptr},
      {&N::attn_q_bias, &W::bq, nullptr, nullptr, E::kNone, E::kQDim, &Architecture::qkv_bias},
      {&N::attn_k_bias, &W::bk, nullptr, nullptr, E::kNone, E::kKvDim, &Architecture::qkv_bias},
      {&N::attn_v_bias, &W::bv, nullptr, nullptr, E::kNone, E::kKvDim, &Architecture::qkv_bias},
      {&N::attn_q_norm, &W::q_norm, nullptr, nullptr, E::kNone, E::kHeadDim, &Architecture::qk_norm},
      {&N::attn_k_norm, &W::k_norm, nullptr, nullptr, E::kNone, E::kHeadDim, &Architecture::qk_norm},
      {&N::attn_post_norm, &W::attn_post_norm, nullptr, nullptr, E::kNone, E::kDim, &Architecture::post_norms},
      {&N::ffn_norm, &W::ffn_norm, nullptr, nullptr, E::kNone, E::kDim, nullptr},
      {&N::ffn_post_norm, &W::ffn_post_norm, nullptr, nullptr, E::kNone, E::kDim, &Architecture::post_norms},
      {&N::ffn_gate, nullptr, &W::w1, &W::w1_quant, E::kHiddenDim, E::kDim, nullptr},
      {&N::ffn_down, nullptr, &W::w2, &W::w2_quant, E::kDim, E::kHiddenDim, nullptr},
      {&N::ffn_up, nullptr, &W::w3, &W::w3_quant, E::kHiddenDim, E::kDim, nullptr},
  };
  return table;
}

inline std::int64_t gguf_extent(const LlamaConfig& c, GgufExtent e) {
  switch (e) {
    case GgufExtent::kDim: return c.dim;
    case GgufExtent::kHiddenDim: return c.hidden_dim;
    case GgufExtent::kQDim: return static_cast<std::int64_t>(c.n_heads) * c.head_dim;
    case GgufExtent::kKvDim: return static_cast<std::int64_t>(c.n_kv_heads) * c.head_dim;
    case GgufExtent::kHeadDim: return c.head_dim;
    case GgufExtent::kNone: break;
  }
  return 0;
}

// Whether a tensor (group) of use `use` is loaded, `present` telling whether the file holds it
// (for a group: any member).
inline bool gguf_uses(TensorUse use, bool present) {
  return use == TensorUse::kRequired || (use == TensorUse::kOptional && present);
}

// Whether layer `l`'s tensors of the optional group `group` are loaded.
inline bool gguf_group_loaded(const GgufFile& f, const Architecture& a, int l, TensorUse Architecture::*group) {
  bool present = false;
  for (const GgufLayerTensor& t : gguf_layer_tensors()) {
    if (t.group == group && f.find_tensor(a.layer_tensor(l, a.tensors.*t.name))) present = true;
  }
  return gguf_uses(a.*group, present);
}

// Loads the tensors of layer `l` (`gguf_layer_tensors`) into `w`.
inline void gguf_load_layer(const GgufFile& f, const Architecture& a, const LlamaConfig& c, int l,
                            LlamaLayerWeights& w, const GgufLoadOptions& opt, std::set<std::string>& used) {
  for (const GgufLayerTensor& t : gguf_layer_tensors()) {
    if (t.group != nullptr && !gguf_group_loaded(f, a, l, t.group)) continue;
    const std::string name = a.layer_tensor(l, a.tensors.*t.name);
    if (t.vec != nullptr) {
      gguf_vector(f, name, gguf_extent(c, t.cols), w.*t.vec, used);
    } else {
      gguf_weight(f, name, gguf_extent(c, t.rows), gguf_extent(c, t.cols), w.*t.mat, w.*t.quant, opt, used);
    }
  }
  used.insert(a.layer_tensor(l, a.tensors.attn_rot_embd));  // legacy RoPE tables of old conversions: recomputed, ignored
}

// The shape hyper-parameters: dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim (checked
// against value_length and rope.dimension_count). Refuses mixture-of-experts models.
inline void gguf_read_shape(const GgufFile& f, const Architecture& a, LlamaConfig& c) {
  const std::string& src = f.source();
  const GgufHparamKeys& k = a.keys;
  DEPTHKV_CHECK_AS(
      "load_gguf", f.get_int(a.key(k.expert_count), 0) == 0,
      src << ": mixture-of-experts models (" << a.key(k.expert_count) << " > 0) are not supported");
  c.dim = gguf_hparam(f, a.key(k.embedding_length), 1, 1 << 16);
  c.hidden_dim = gguf_hparam(f, a.key(k.feed_forward_length), 1, 1 << 20);
  c.n_layers = gguf_hparam(f, a.key(k.block_count), 1, 1 << 10);
  c.n_heads = gguf_hparam(f, a.key(k.head_count), 1, 1 << 10);
  c.n_kv_heads = f.find(a.key(k.head_count_kv)) ? gguf_hparam(f, a.key(k.head_count_kv), 1, c.n_heads) : c.n_heads;
  DEPTHKV_CHECK_AS(
      "load_gguf", c.n_heads % c.n_kv_heads == 0,
      src << ": head_count " << c.n_heads << " is not a multiple of head_count_kv " << c.n_kv_heads);
  if (f.find(a.key(k.key_length))) {
    c.head_dim = gguf_hparam(f, a.key(k.key_length), 1, 1 << 12);
  } else {
    DEPTHKV_CHECK_AS("load_gguf", c.dim % c.n_heads == 0,
                     src << ": embedding_length " << c.dim << " is not divisible by head_count " << c.n_heads
                         << " and attention.key_length is absent");
    c.head_dim = c.dim / c.n_heads;
  }
  DEPTHKV_CHECK_AS("load_gguf", c.head_dim % 2 == 0,
                   src << ": head dimension " << c.head_dim << " must be even (RoPE pairs)");
  if (f.find(a.key(k.value_length))) {
    const int vl = gguf_hparam(f, a.key(k.value_length), 1, 1 << 12);
    DEPTHKV_CHECK_AS("load_gguf", vl == c.head_dim,
                     src << ": attention.value_length " << vl << " differs from key_length " << c.head_dim
                         << " (not supported)");
  }
  if (f.find(a.key(k.rope_dimension_count))) {
    const int rd = gguf_hparam(f, a.key(k.rope_dimension_count), 1, 1 << 12);
    DEPTHKV_CHECK_AS("load_gguf", rd == c.head_dim,
                     src << ": rope.dimension_count " << rd << " differs from the head dimension "
                         << c.head_dim << " (partial RoPE is not supported)");
  }
}

// RoPE pairing, linear scaling and base; the RMSNorm epsilon; the context length.
inline void gguf_read_rope_norm_context(const GgufFile& f, const Architecture& a, LlamaConfig& c) {
  const std::string& src = f.source();
  const GgufHparamKeys& k = a.keys;
  c.rope_neox = a.rope == RopeStyle::kNeox;
  const std::string scaling = f.get_string(a.key(k.rope_scaling_type), "none");
  const bool has_linear = f.find(a.key(k.rope_scale_linear)) != nullptr;
  double scale_factor = f.get_float(a.key(k.rope_scaling_factor), 1.0);
  if (!f.find(a.key(k.rope_scaling_factor)) && has_linear) scale_factor = f.get_float(a.key(k.rope_scale_linear));
  DEPTHKV_CHECK_AS("load_gguf", std::isfinite(scale_factor) && scale_factor > 0 && scale_factor < 1e6,
                   src << ": RoPE scaling factor " << scale_factor << " is out of range");
  DEPTHKV_CHECK_AS("load_gguf", scaling == "none" || scaling == "linear" || scale_factor == 1.0,
                   src << ": RoPE scaling '" << scaling << "' (factor " << scale_factor
                       << ") is not supported (supported: none, linear, and rope_freqs.weight factors)");
  if (scaling == "linear" || (scaling == "none" && has_linear)) c.rope_freq_scale = static_cast<float>(1.0 / scale_factor);
  const double theta = f.get_float(a.key(k.rope_freq_base), 10000.0);
  DEPTHKV_CHECK_AS("load_gguf", std::isfinite(theta) && theta > 1.0 && theta < 1e12,
                   src << ": rope.freq_base " << theta << " is out of range");
  c.rope_theta = static_cast<float>(theta);
  const double eps = f.get_float(a.key(k.rms_epsilon), 1e-5);
  DEPTHKV_CHECK_AS("load_gguf", std::isfinite(eps) && eps > 0 && eps < 1,
                   src << ": attention.layer_norm_rms_epsilon " << eps << " is out of range");
  c.rms_eps = static_cast<float>(eps);
  c.seq_len = gguf_hparam(f, a.key(k.context_length), 1, 1 << 24);
}

// The FFN activation, the embedding scale and the sliding-window layers: their window (a key the
// file must hold when the architecture has local layers), which layers are local (the file's
// per-layer pattern, else the architecture's period) and their RoPE base.
inline void gguf_read_block_variant(const GgufFile& f, const Architecture& a, LlamaConfig& c) {
  const std::string& src = f.source();
  const GgufHparamKeys& k = a.keys;
  c.ffn_activation = a.activation;
  c.embedding_scale = a.scale_embedding ? std::sqrt(static_cast<float>(c.dim)) : 1.0f;
  c.layer_window.clear();
  if (a.swa_period <= 0) return;
  const int window = gguf_hparam(f, a.key(k.sliding_window), 1, 1 << 24);
  std::vector<bool> local(static_cast<std::size_t>(c.n_layers));
  if (const GgufValue* p = f.find(a.key(k.sliding_window_pattern))) {
    DEPTHKV_CHECK_AS("load_gguf", p->type == GgufType::kArray && p->array.size() == local.size(),
                     src << ": " << a.key(k.sliding_window_pattern) << " must be an array of " << c.n_layers
                         << " bools (one per layer)");
    for (std::size_t l = 0; l < local.size(); ++l) {
      const GgufValue& e = p->array[l];
      DEPTHKV_CHECK_AS("load_gguf", e.type == GgufType::kBool,
                       src << ": " << a.key(k.sliding_window_pattern) << "[" << l << "] is not a bool");
      local[l] = e.u != 0;
    }
  } else {
    for (int l = 0; l < c.n_layers; ++l) local[static_cast<std::size_t>(l)] = (l + 1) % a.swa_period != 0;
  }
  for (bool b : local) c.layer_window.push_back(b ? window : 0);
  const double theta = f.get_float(a.key(k.rope_freq_base_swa), a.rope_theta_local);
  DEPTHKV_CHECK_AS("load_gguf", std::isfinite(theta) && theta > 1.0 && theta < 1e12,
                   src << ": " << a.key(k.rope_freq_base_swa) << " " << theta << " is out of range");
  c.rope_theta_local = static_cast<float>(theta);
  c.rope_freq_scale_local = 1.0f;
}

// The vocabulary size: the second dimension of the token embedding.
inline int gguf_vocab_size(const GgufFile& f, const Architecture& a) {
  const GgufTensorInfo* emb = f.find_tensor(a.tensors.token_embd);
  DEPTHKV_CHECK_AS("load_gguf", emb != nullptr,
                   f.source() << ": tensor '" << a.tensors.token_embd << "' is missing");
  DEPTHKV_CHECK_AS("load_gguf", emb->dims.size() >= 2 && emb->dims[1] >= 1 && emb->dims[1] <= (1u << 24),
                   f.source() << ": tensor '" << a.tensors.token_embd
                              << "' does not have a vocabulary dimension in [1, 2^24]");
  return static_cast<int>(emb->dims[1]);
}

// The tensors after the layers: output_norm, the classifier (tied to the embedding when not
// loaded), the RoPE frequency divisors.
inline void gguf_load_head(const GgufFile& f, const Architecture& a, LlamaModel& m, const GgufLoadOptions& opt,
                           std::set<std::string>& used) {
  const LlamaConfig& c = m.config;
  const GgufTensorNames& n = a.tensors;
  gguf_vector(f, n.output_norm, c.dim, m.final_norm, used);
  if (gguf_uses(a.output, f.find_tensor(n.output) != nullptr)) {
    gguf_weight(f, n.output, c.vocab_size, c.dim, m.classifier, m.classifier_quant, opt, used);
  } else {
    m.classifier = m.token_embedding;
    m.classifier_quant = m.token_embedding_quant;
  }
  if (gguf_uses(a.rope_freqs, f.find_tensor(n.rope_freqs) != nullptr)) {
    gguf_vector(f, n.rope_freqs, c.head_dim / 2, m.rope_freq_factors, used);
    for (Eigen::Index i = 0; i < m.rope_freq_factors.size(); ++i) {
      DEPTHKV_CHECK_AS("load_gguf", m.rope_freq_factors(i) > 0,
                       f.source() << ": " << n.rope_freqs << "[" << i << "] = " << m.rope_freq_factors(i)
                                  << " must be positive");
    }
  }
}

// Refuses a file with a tensor the engine would not use.
inline void gguf_check_all_used(const GgufFile& f, const Architecture& a, int n_layers, const std::set<std::string>& used) {
  for (const GgufTensorInfo& t : f.tensors()) {
    DEPTHKV_CHECK_AS("load_gguf", used.count(t.name) != 0,
                     f.source() << ": unexpected tensor '" << t.name << "' for architecture '" << a.name
                                << "' (" << n_layers << " blocks): the engine would "
                                << "ignore it, so the model is not supported");
  }
}

}  // namespace detail

/// Builds a Llama-family model from a parsed GGUF file.
///
/// The architecture (`general.architecture`) is looked up in the table of architecture.hpp
/// (`llama`, `qwen2`, `qwen3`), which says which hyper-parameter keys and tensor names are
/// read, the RoPE pairing (`config.rope_neox`) and which optional tensors are loaded.
/// Hyper-parameters (`<arch>.` + key): `embedding_length` (dim), `feed_forward_length`,
/// `block_count`, `attention.head_count`, `attention.head_count_kv` (default: head_count),
/// `attention.key_length` (head_dim, default dim / head_count; `attention.value_length` and
/// `rope.dimension_count` must equal it), `rope.freq_base` (default 10000),
/// `rope.scaling.type` none or linear with `rope.scaling.factor` (or the older
/// `rope.scale_linear`; positions divided by the factor), `attention.layer_norm_rms_epsilon`
/// (default 1e-5), `context_length` (seq_len, as the file states it). Tensors: token_embd,
/// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_down,
/// ffn_up}.weight, the architecture's q/k/v biases and per-head q/k norms `[head_dim]`,
/// output_norm, output (absent: tied to token_embd), rope_freqs (optional). Weight matrices
/// stored as F16, BF16 or a block type (Q4_0 ... Q6_K, IQ4_NL, IQ4_XS) stay as stored, in
/// place in the file (`QuantWeight`s holding `f.keep_alive()`; the RowMatrix is left empty; a
/// tied classifier shares the embedding's bytes; F16/BF16 rows are converted to float in
/// registers by the products, the block types multiplied with int8 activations, see
/// quant/products.hpp); F32 matrices are float32 (Eigen's products), and so is every type with
/// `opt.dequantize`.
/// @param f a parsed GGUF file
/// @param opt load options (`GgufLoadOptions::dequantize` forces float32 weights)
/// @return the model (`source_path`, `file_size`, `header_hash` describe the file)
/// @throws Error for an architecture not in the table (the message lists the supported ones),
///   mixture-of-experts models, RoPE scaling other than linear (YaRN, LongRoPE), missing
///   or out-of-range hyper-parameters, missing, misshapen, unsupported-type or unexpected
///   tensors, and non-finite weights
inline LlamaModel load_gguf(const GgufFile& f, const GgufLoadOptions& opt = {}) {
  const Architecture& a = architecture(f.get_string("general.architecture"), f.source());
  LlamaModel m;
  LlamaConfig& c = m.config;
  c.architecture = a.name;
  detail::gguf_read_shape(f, a, c);
  detail::gguf_read_rope_norm_context(f, a, c);
  detail::gguf_read_block_variant(f, a, c);
  c.vocab_size = detail::gguf_vocab_size(f, a);

  std::set<std::string> used;
  detail::gguf_weight(f, a.tensors.token_embd, c.vocab_size, c.dim, m.token_embedding, m.token_embedding_quant, opt, used);
  m.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) detail::gguf_load_layer(f, a, c, l, m.layers[static_cast<std::size_t>(l)], opt, used);
  detail::gguf_load_head(f, a, m, opt, used);
  detail::gguf_check_all_used(f, a, c.n_layers, used);

  m.source_path = f.source();
  m.file_size = f.file_size();
  m.header_hash = f.header_hash();
  return m;
}

/// Loads a Llama-family GGUF model file (see `load_gguf(const GgufFile&)`).
/// @param path a GGUF file
/// @return the model
/// @throws Error when the file cannot be read, is invalid, or holds an unsupported model
/// @param opt load options
inline LlamaModel load_gguf(const std::string& path, const GgufLoadOptions& opt = {}) {
  return load_gguf(GgufFile::open(path), opt);
}

/// Loads a Llama-family GGUF model from memory (the bytes are copied).
/// @param data the file's bytes
/// @param size their number
/// @param source name for `source_path` and error messages
/// @param opt load options
/// @return the model
/// @throws Error as `load_gguf(const GgufFile&)`
inline LlamaModel load_gguf_from_memory(const std::uint8_t* data, std::size_t size,
                                        const std::string& source = "<memory>", const GgufLoadOptions& opt = {}) {
  return load_gguf(GgufFile::from_memory(data, size, source), opt);
}

}  // namespace llama
}  // namespace depthkv
