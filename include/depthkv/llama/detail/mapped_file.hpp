#pragma once
/// @file llama/detail/mapped_file.hpp
/// @brief Read-only memory-mapped files (POSIX) and a bounded little-endian byte reader, the
/// base of depthkv's model and tokenizer loaders.
///
/// Every read goes through `ByteReader`, which throws `depthkv::Error` (naming the source and
/// the offset) instead of reading past the end, so a truncated or corrupt file can never make a
/// loader touch memory outside the file.
///
/// @code
/// depthkv::llama::detail::MappedFile file("model.bin");
/// depthkv::llama::detail::ByteReader in(file.data(), file.size(), file.path());
/// std::int32_t dim = in.read<std::int32_t>();
/// @endcode

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "depthkv/error.hpp"

namespace depthkv {
namespace llama {
namespace detail {

/// True when the host stores integers little-endian (the byte order of every file format
/// depthkv reads; the loaders refuse to run on big-endian hosts).
inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

/// A whole file mapped read-only into memory; move-only RAII (unmaps on destruction).
/// An empty file is valid and has `data() == nullptr`, `size() == 0`.
class MappedFile {
 public:
  MappedFile() = default;

  /// Maps `path` read-only.
  /// @param path file to map
  /// @throws Error when the file cannot be opened, is not a regular file, or cannot be mapped
  explicit MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DEPTHKV_CHECK(fd >= 0, "cannot open '" << path << "': " << std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      DEPTHKV_FAIL("cannot stat '" << path << "': " << std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      DEPTHKV_FAIL("'" << path << "' is not a regular file");
    }
    if (st.st_size > 0) {
      if (static_cast<std::uint64_t>(st.st_size) > std::numeric_limits<std::size_t>::max()) {
        ::close(fd);
        DEPTHKV_FAIL("'" << path << "' is too large to map");
      }
      size_ = static_cast<std::size_t>(st.st_size);
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        size_ = 0;
        DEPTHKV_FAIL("cannot map '" << path << "': " << std::strerror(err));
      }
      data_ = static_cast<const std::uint8_t*>(p);
    }
    ::close(fd);
  }

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), path_(std::move(o.path_)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  ~MappedFile() { unmap(); }

  /// @return first byte of the mapping (nullptr for an empty file)
  const std::uint8_t* data() const { return data_; }
  /// @return size of the file in bytes
  std::size_t size() const { return size_; }
  /// @return the path it was opened from
  const std::string& path() const { return path_; }

 private:
  void unmap() {
    if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

/// Reads a whole file into a string: the one reader of depthkv's text inputs (text files, token
/// files). Regular files, pipes and devices are read; a directory is refused (an std::ifstream
/// opens one and reads no bytes, which looked like empty text).
/// @param path the file
/// @param kind what the file is, for messages ("text", "token")
/// @return its bytes
/// @throws Error "cannot open <kind> file 'path': <reason>", "'path' is a directory, not a
///   <kind> file", or "error reading <kind> file 'path': <reason>"
inline std::string read_whole_file(const std::string& path, const char* kind) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DEPTHKV_CHECK(fd >= 0, "cannot open " << kind << " file '" << path << "': " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    const int err = errno;
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    DEPTHKV_CHECK(!dir, "'" << path << "' is a directory, not a " << kind << " file");
    DEPTHKV_FAIL("cannot stat " << kind << " file '" << path << "': " << std::strerror(err));
  }
  std::string out;
  if (S_ISREG(st.st_mode) && st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      DEPTHKV_FAIL("error reading " << kind << " file '" << path << "': " << std::strerror(err));
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

/// Bounded cursor over a byte range; every read checks the remaining length first and throws
/// `Error` ("<source>: truncated at offset N: need K bytes for <what>, M left") otherwise.
/// Values are read little-endian with memcpy (no alignment requirement).
class ByteReader {
 public:
  /// @param data first byte (may be nullptr when size == 0)
  /// @param size number of readable bytes
  /// @param source name used in error messages (a path or "<memory>")
  ByteReader(const std::uint8_t* data, std::size_t size, std::string source)
      : data_(data), size_(size), source_(std::move(source)) {}

  /// @return current offset from the start
  std::size_t offset() const { return pos_; }
  /// @return bytes left after the current offset
  std::size_t remaining() const { return size_ - pos_; }
  /// @return total size of the range
  std::size_t size() const { return size_; }
  /// @return the name used in error messages
  const std::string& source() const { return source_; }

  /// Throws unless `n` more bytes are available.
  /// @param n bytes needed
  /// @param what what they are for (error message)
  /// @throws Error when fewer than `n` bytes remain
  void require(std::uint64_t n, const char* what) const {
    DEPTHKV_CHECK(n <= remaining(), source_ << ": truncated at offset " << pos_ << ": need " << n
                                            << " bytes for " << what << ", " << remaining() << " left");
  }

  /// Reads one trivially copyable value.
  /// @param what what it is (error message)
  /// @return the value
  /// @throws Error when fewer than sizeof(T) bytes remain
  template <class T>
  T read(const char* what = "a value") {
    static_assert(std::is_trivially_copyable<T>::value, "ByteReader::read needs a trivially copyable type");
    require(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  /// Returns a pointer to the next `n` bytes and advances past them.
  /// @param n number of bytes
  /// @param what what they are (error message)
  /// @return pointer into the range, valid while the underlying storage lives
  /// @throws Error when fewer than `n` bytes remain
  const std::uint8_t* take(std::uint64_t n, const char* what = "data") {
    require(n, what);
    const std::uint8_t* p = data_ + pos_;
    pos_ += static_cast<std::size_t>(n);
    return p;
  }

  /// Advances by `n` bytes.
  /// @throws Error when fewer than `n` bytes remain
  void skip(std::uint64_t n, const char* what = "data") { take(n, what); }

  /// Moves to absolute offset `off` (== size() allowed).
  /// @throws Error when `off` > size()
  void seek(std::uint64_t off) {
    DEPTHKV_CHECK(off <= size_, source_ << ": offset " << off << " is past the end (" << size_ << " bytes)");
    pos_ = static_cast<std::size_t>(off);
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string source_;
};

/// FNV-1a 64-bit hash of `n` bytes (used for `LlamaModel::header_hash`).
/// @param data bytes (may be nullptr when n == 0)
/// @param n number of bytes
/// @return the hash
inline std::uint64_t fnv1a64(const std::uint8_t* data, std::size_t n) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 1099511628211ull;
  }
  return h;
}

/// Identity hash of a model file: FNV-1a 64 of its first min(size, 1 MiB) bytes.
inline std::uint64_t model_header_hash(const std::uint8_t* data, std::size_t n) {
  const std::size_t limit = std::size_t{1} << 20;
  return fnv1a64(data, n < limit ? n : limit);
}

/// `a * b` into `out`; false on unsigned 64-bit overflow.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

/// `a + b` into `out`; false on unsigned 64-bit overflow.
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (b > std::numeric_limits<std::uint64_t>::max() - a) return false;
  out = a + b;
  return true;
}

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
