#pragma once
/// @file llama/detail/pcre2_regex.hpp
/// @brief A compiled PCRE2 pattern (8-bit, UTF + UCP, invalid UTF-8 allowed in subjects) and
/// the per-call scratch its matches need. Internal to the byte-level BPE pre-tokenizers; needs
/// the `depthkv::llama` CMake target (PCRE2).

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "depthkv/error.hpp"

static_assert(PCRE2_CODE_UNIT_WIDTH == 8, "depthkv's pre-tokenizers use the 8-bit PCRE2 library (pcre2-8)");

namespace depthkv {
namespace llama {
namespace detail {

/// The text of a PCRE2 error code.
inline std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
}

/// Match data, a match context and a JIT stack for one thread's matches (not shared).
class Pcre2Scratch {
 public:
  Pcre2Scratch() {
    match_data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context_ != nullptr && jit_stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
    if (match_data_ == nullptr || context_ == nullptr) {
      release();
      throw Error("PCRE2: out of memory creating match data");
    }
  }
  ~Pcre2Scratch() { release(); }
  Pcre2Scratch(const Pcre2Scratch&) = delete;
  Pcre2Scratch& operator=(const Pcre2Scratch&) = delete;

  pcre2_match_data* match_data() const { return match_data_; }
  pcre2_match_context* context() const { return context_; }

 private:
  void release() {
    if (match_data_ != nullptr) pcre2_match_data_free(match_data_);
    if (context_ != nullptr) pcre2_match_context_free(context_);
    if (jit_stack_ != nullptr) pcre2_jit_stack_free(jit_stack_);
    match_data_ = nullptr;
    context_ = nullptr;
    jit_stack_ = nullptr;
  }
  pcre2_match_data* match_data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

/// A pattern compiled with PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF (JIT-compiled where
/// the platform allows): \\s, \\p{L}, \\p{N}... follow Unicode properties, and subjects may hold
/// invalid UTF-8, which no pattern item matches. Immutable after construction; share it freely
/// across threads (each thread brings its own Pcre2Scratch).
class Pcre2Regex {
 public:
  /// @param pattern the pattern (PCRE2 syntax)
  /// @throws Error naming the pattern and the offset when it does not compile
  explicit Pcre2Regex(const std::string& pattern) : pattern_(pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
    DEPTHKV_CHECK(code_ != nullptr, "PCRE2 cannot compile the pattern '" << pattern << "' at offset " << offset << ": "
                                                                          << pcre2_error_text(code));
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // the interpreter runs the pattern where JIT is unavailable
  }
  ~Pcre2Regex() { pcre2_code_free(code_); }
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  /// @return the pattern's source
  const std::string& pattern() const { return pattern_; }

  /// Finds the first match in `subject[start, length)`.
  /// @param subject the bytes (need not be valid UTF-8)
  /// @param length their number (the end of the subject for anchors and lookarounds)
  /// @param start where the search begins (at a character boundary)
  /// @param scratch the calling thread's scratch
  /// @param begin set to the match's first byte
  /// @param end set to one past its last byte
  /// @return false when there is no match
  /// @throws Error on a matching error (e.g. a resource limit)
  bool find(const char* subject, std::size_t length, std::size_t start, Pcre2Scratch& scratch, std::size_t& begin,
            std::size_t& end) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject), length, start, 0, scratch.match_data(),
                               scratch.context());
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    DEPTHKV_CHECK(rc >= 0, "PCRE2 match of '" << pattern_ << "' failed on " << length << " bytes: " << pcre2_error_text(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data());
    begin = ov[0];
    end = ov[1];
    return true;
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
