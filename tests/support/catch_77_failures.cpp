// A test program that fails on purpose with exactly 77 failed checks: the test of the test set-up
// (tests/CMakeLists.txt, test catch_main_77_failures_fail) requires it to exit 1, not the skip's
// code 77. Not a *_test.cpp: it is not registered as a test of its own.
#include <catch2/catch.hpp>

TEST_CASE("77 failed checks", "[selftest]") {
  for (int i = 0; i < 77; ++i) CHECK(i < 0);
}
