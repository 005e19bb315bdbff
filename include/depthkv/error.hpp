#pragma once
/// @file error.hpp
/// @brief The one exception type of depthkv and the check macro that throws it.
///
/// Invalid input anywhere in depthkv (a budget that cannot be met, NaN scores, mismatched
/// shapes, a corrupt model file) throws `depthkv::Error`, whose message says what was wrong and
/// where. Internal invariants use `assert`; library code never calls `exit()`.
///
/// @code
/// DEPTHKV_CHECK(k >= 0, "keep count must be >= 0, got " << k);
/// @endcode

#include <sstream>
#include <stdexcept>
#include <string>

namespace depthkv {

/// Thrown for every invalid input: the message names what was wrong and where. `what()` is
/// "depthkv: " + `message()`.
class Error : public std::runtime_error {
 public:
  /// @param message human-readable description, e.g. "evict: layer 3 head 1: keep 40 < 48 protected tokens"
  explicit Error(const std::string& message) : std::runtime_error("depthkv: " + message), message_(message) {}
  /// @return the description without the "depthkv: " of `what()` (for wrapping it in another
  ///   message, e.g. the command-line program's "depthkv: error: ...")
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

namespace detail {
[[noreturn]] inline void throw_error(const char* func, const std::string& msg) {
  throw Error(std::string(func) + ": " + msg);
}
}  // namespace detail

}  // namespace depthkv

/// Throws `depthkv::Error` when `cond` is false; `msg` is a stream expression
/// (`"got " << x`) and the message is prefixed with the calling function's name.
#define DEPTHKV_CHECK(cond, msg)                                  \
  do {                                                            \
    if (!(cond)) {                                                \
      std::ostringstream depthkv_check_os_;                       \
      depthkv_check_os_ << msg;                                   \
      ::depthkv::detail::throw_error(__func__, depthkv_check_os_.str()); \
    }                                                             \
  } while (0)

/// `DEPTHKV_CHECK` whose message is prefixed with `func` (a string) instead of the calling
/// function's name: for checks moved into a helper that still speak for the public function.
#define DEPTHKV_CHECK_AS(func, cond, msg)                         \
  do {                                                            \
    if (!(cond)) {                                                \
      std::ostringstream depthkv_check_os_;                       \
      depthkv_check_os_ << msg;                                   \
      ::depthkv::detail::throw_error(func, depthkv_check_os_.str()); \
    }                                                             \
  } while (0)

/// Throws `depthkv::Error` unconditionally with a stream-expression message.
#define DEPTHKV_FAIL(msg) DEPTHKV_CHECK(false, msg)
