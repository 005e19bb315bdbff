// write_file_atomically: the destination holds its previous contents or the whole new file, never
// a part; failures (a full device, a file-size limit, a missing folder, a directory) throw naming
// the path and leave no temporary file; a device is written in place; a signal handler's
// remove_pending_temp_files removes the temporary file of a write in progress and makes later
// writes fail (the program is ending).

#include "depthkv/detail/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

namespace {

using depthkv::detail::write_file_atomically;
using depthkv_test::slurp;
using depthkv_test::TempDir;

/// The names in `dir` that carry the temporary-file mark.
std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(depthkv::detail::kTempFileMark) != std::string::npos) found.push_back(name);
  }
  return found;
}

/// Writes `text` to `path` with a plain stream (the test's own set-up, not the code under test).
void put(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  REQUIRE(f.good());
  f << text;
  REQUIRE(f.good());
}

std::string error_of(const std::string& path, const std::string& bytes) {
  try {
    write_file_atomically(path, bytes, "'" + path + "' (test)", "test_write");
  } catch (const depthkv::Error& e) {
    return e.message();
  }
  return std::string();
}

TEST_CASE("write_file_atomically writes a new file and replaces an old one, keeping its permissions",
          "[atomic_file]") {
  const TempDir dir;
  const std::string p = dir.file("out.json");
  write_file_atomically(p, "first\n", "'out.json'", "test_write");
  CHECK(slurp(p) == "first\n");
  ::chmod(p.c_str(), 0640);
  const std::string big(1 << 20, 'x');
  write_file_atomically(p, big, "'out.json'", "test_write");
  CHECK(slurp(p) == big);
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0640);
  write_file_atomically(p, "", "'out.json'", "test_write");  // empty contents: an empty file
  CHECK(slurp(p).empty());
  CHECK(temp_files_in(dir.path()).empty());
}

TEST_CASE("write_file_atomically follows a symbolic link to an existing target", "[atomic_file]") {
  const TempDir dir;
  const std::string target = dir.file("target.csv"), link = dir.file("link.csv");
  put(target, "old\n");
  std::filesystem::create_symlink(target, link);
  write_file_atomically(link, "new\n", "'link.csv'", "test_write");
  CHECK(std::filesystem::is_symlink(link));
  CHECK(slurp(target) == "new\n");
  CHECK(temp_files_in(dir.path()).empty());
}

TEST_CASE("write_file_atomically refuses a missing folder, a directory and an empty path, naming them",
          "[atomic_file]") {
  const TempDir dir;
  const std::string missing = dir.file("no/such/out.json");
  CHECK(error_of(missing, "x") == "test_write: cannot write '" + missing + "' (test): the folder '" +
                                      dir.file("no/such") + "' does not exist");
  CHECK(error_of(dir.path(), "x") ==
        "test_write: cannot write '" + dir.path() + "' (test): it is a directory");
  CHECK(error_of("", "x") == "test_write: cannot write '' (test): empty path");
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("a full device is an error and stays a device", "[atomic_file]") {
  REQUIRE(std::filesystem::is_character_file("/dev/full"));
  CHECK(error_of("/dev/full", "some bytes") ==
        "test_write: cannot write '/dev/full' (test): disk full or not writable (No space left on device)");
  CHECK(std::filesystem::is_character_file("/dev/full"));
  write_file_atomically("/dev/null", "some bytes", "'/dev/null'", "test_write");  // written in place
  CHECK(std::filesystem::is_character_file("/dev/null"));
  CHECK(temp_files_in("/dev").empty());
}

TEST_CASE("a descriptor's link under /dev/fd or /proc/self/fd is written in place", "[atomic_file]") {
  const TempDir dir;
  const std::string p = dir.file("redirected.txt");
  put(p, "what the shell wrote before\n");
  const int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  struct stat before {};
  struct stat after {};
  REQUIRE(::stat(p.c_str(), &before) == 0);
  for (const std::string link : {"/dev/fd/", "/proc/self/fd/"}) {
    write_file_atomically(link + std::to_string(fd), link, "'" + link + "'", "test_write");
    CHECK(slurp(p) == link);  // the file behind the descriptor, not a new one renamed over the link
  }
  REQUIRE(::stat(p.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  ::close(fd);
  CHECK(temp_files_in(dir.path()).empty());
}

/// Sets the soft file-size limit (RLIMIT_FSIZE) with SIGXFSZ ignored, and restores both: a write
/// past the limit then fails with EFBIG, as on a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    old_xfsz_ = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit r = old_;
    r.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &r) == 0);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_xfsz_);
  }

 private:
  struct rlimit old_ {};
  void (*old_xfsz_)(int) = SIG_DFL;
};

TEST_CASE("a write that runs out of space leaves the old file untouched and no temporary file",
          "[atomic_file]") {
  const TempDir dir;
  const std::string p = dir.file("profile.json");
  put(p, "the previous complete file\n");
  std::string message;
  {
    const FileSizeLimit limit(4096);
    message = error_of(p, std::string(64 * 1024, 'y'));
  }
  CHECK(message == "test_write: cannot write '" + p + "' (test): disk full or not writable (File too large)");
  CHECK(slurp(p) == "the previous complete file\n");
  CHECK(temp_files_in(dir.path()).empty());
  {
    const FileSizeLimit limit(4096);
    CHECK(error_of(dir.file("new.json"), std::string(64 * 1024, 'y')) != "");
  }
  CHECK(!std::filesystem::exists(dir.file("new.json")));
  CHECK(temp_files_in(dir.path()).empty());
}

TEST_CASE("remove_pending_temp_files removes exactly the registered files, and later writes fail",
          "[atomic_file]") {
  const TempDir dir;
  const std::string a = dir.file(".a.depthkv-tmp.1.0"), b = dir.file(".b.depthkv-tmp.1.1"),
                    c = dir.file("c.json");
  put(a, "a");
  put(b, "b");
  const pid_t child = ::fork();  // the call ends this process's writes: it runs in a child
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    { const depthkv::detail::PendingTempRegistration ended(b); }
    const depthkv::detail::PendingTempRegistration reg(a);
    depthkv::detail::remove_pending_temp_files();
    if (std::filesystem::exists(a)) code |= 1;   // registered: removed
    if (!std::filesystem::exists(b)) code |= 2;  // no longer registered: kept
    try {
      write_file_atomically(c, "c", "'c.json'", "test_write");
      code |= 4;
    } catch (const depthkv::Error& e) {
      if (e.message() !=
          "test_write: cannot write 'c.json': the program is ending (a signal handler removed its "
          "temporary files)")
        code |= 8;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // bits: 1 a kept, 2 b removed, 4 the write succeeded, 8 another message
  CHECK(!std::filesystem::exists(c));
  CHECK(temp_files_in(dir.path()) == std::vector<std::string>{".b.depthkv-tmp.1.1"});
}

extern "C" void remove_temps_and_die(int sig) {
  depthkv::detail::remove_pending_temp_files();
  ::raise(sig);
}

/// The first byte of `path` (0 when it cannot be read).
char first_byte(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  f.get(c);
  return f ? c : 0;
}

TEST_CASE(
    "SIGTERM at random moments of repeated writes leaves the old or the new file, whole, and no "
    "temporary file",
    "[atomic_file]") {
  const TempDir dir;
  const std::string p = dir.file("out.bin");
  constexpr std::size_t kSize = 2 << 20;
  std::mt19937 rng(45);
  for (int trial = 0; trial < 20; ++trial) {
    put(p, std::string(kSize, 'a'));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // rewrites the file with 'b', 'c', ... until killed; exits 3 if never killed
      struct sigaction sa {};
      sa.sa_handler = remove_temps_and_die;
      sa.sa_flags = SA_RESETHAND;
      ::sigaction(SIGTERM, &sa, nullptr);
      for (int i = 0; i < 2000; ++i)
        write_file_atomically(p, std::string(kSize, static_cast<char>('b' + i % 20)), "'out.bin'",
                              "test_write");
      ::_exit(3);
    }
    // even trials: from the start (the first write creates the temporary file beside the old
    // one); odd trials: after the first rename (later writes replace a file of this program)
    for (int poll = 0; trial % 2 == 1 && poll < 10000 && first_byte(p) == 'a'; ++poll) ::usleep(1000);
    const long delay_us = std::uniform_int_distribution<long>(0, 20000)(rng);
    ::usleep(static_cast<useconds_t>(delay_us));
    ::kill(child, SIGTERM);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM));
    const std::string got = slurp(p);
    REQUIRE(got.size() == kSize);
    CHECK(got.find_first_not_of(got[0]) == std::string::npos);  // one write's bytes, whole
    CHECK(temp_files_in(dir.path()).empty());
  }
}

}  // namespace
