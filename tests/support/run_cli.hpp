#pragma once
// Running the built `depthkv` program from a test, and checking how it failed (DEPTHKV_CLI_PATH is
// defined by tests/CMakeLists.txt when the tools are built; the tests that include this are left
// out otherwise).

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "support/test_data.hpp"

#ifndef DEPTHKV_CLI_PATH
#error "tests/tools/ run the depthkv program: built only with DEPTHKV_BUILD_TOOLS=ON (tests/CMakeLists.txt)"
#endif

namespace depthkv_test {

struct CliRun {
  std::string out;  ///< stdout (and stderr when redirected into it)
  int status = -1;  ///< exit code; 128 + the signal number when killed by a signal (as the shell reports it)
};

/// Runs `depthkv <args> <redirect>` through the shell and captures stdout.
inline CliRun run_cli(const std::string& args, const std::string& redirect = "2>/dev/null") {
  const std::string cmd = std::string("'") + DEPTHKV_CLI_PATH + "' " + args + " " + redirect;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  REQUIRE(st != -1);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  return r;
}

/// The first line of `out` that starts with "depthkv: error: " ("" when there is none).
inline std::string error_line(const std::string& out) {
  const std::string tag = "depthkv: error: ";
  std::size_t at = out.compare(0, tag.size(), tag) == 0 ? 0 : out.find("\n" + tag);
  if (at == std::string::npos) return "";
  if (out[at] == '\n') ++at;
  return out.substr(at, out.find('\n', at) - at);
}

/// Requires that `r` (run with stderr joined to stdout) failed as the program reports an error:
/// exit code 1 and an error line holding `message`.
inline void require_error(const CliRun& r, const std::string& message) {
  INFO("output: " << r.out);
  REQUIRE(r.status == 1);
  REQUIRE_THAT(error_line(r.out), Catch::Contains(message));
}

/// Single-quoted for the shell.
inline std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

/// stories260K.bin's path, single-quoted for the shell.
inline std::string stories_model_arg() { return shell_quoted(data_path("models/stories260K/stories260K.bin")); }

}  // namespace depthkv_test
