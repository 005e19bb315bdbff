// Exits with code 77: through depthkv_test::skip ("SKIP: <why>") when given a reason, else without
// a word. The test of the test set-up (tests/CMakeLists.txt, test ctest_skips_only_on_the_message)
// runs both under CTest with the skip properties of every test: only the first counts as skipped.
#include "support/skip.hpp"

int main(int argc, char* argv[]) {
  if (argc > 1) depthkv_test::skip(argv[1]);
  return 77;
}
