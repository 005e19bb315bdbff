#pragma once
// Running the built `depthkv` program from a test (DEPTHKV_CLI_PATH is defined by tests/CMakeLists.txt
// when the tools are built; the tests that include this are left out otherwise).

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#ifndef DEPTHKV_CLI_PATH
#error "tests/tools/ run the depthkv program: built only with DEPTHKV_BUILD_TOOLS=ON (tests/CMakeLists.txt)"
#endif

namespace depthkv_test {

struct CliRun {
  std::string out;  ///< stdout (and stderr when redirected into it)
  int status = -1;  ///< exit code, -1 when killed
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
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// Single-quoted for the shell.
inline std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace depthkv_test
