#pragma once
// Skipping a test: it prints "SKIP: <why>" and exits with code 77. CTest counts a test as skipped
// only when its output holds "SKIP: " (SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt); exit code 77
// without the line is a failure. The whole program ends here: CTest runs every test case in a
// process of its own (catch_discover_tests), so only the test case that called it is skipped.

#include <cstdlib>
#include <iostream>
#include <string>

namespace depthkv_test {

/// Prints "SKIP: `why`" and ends the program with exit code 77 (CTest: skipped).
[[noreturn]] inline void skip(const std::string& why) {
  std::cout << "SKIP: " << why << std::endl;
  std::exit(77);
}

}  // namespace depthkv_test
