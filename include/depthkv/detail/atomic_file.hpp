#pragma once
/// @file detail/atomic_file.hpp
/// @brief Writing a file so that its path never holds a partial file (POSIX): the bytes go to a
/// new temporary file in the destination's folder, which is flushed to disk (fsync) and then
/// renamed over the destination. A reader, or a program interrupted at any moment, sees either
/// the previous file (or none) or the complete new one.
///
/// The temporary file is named `.<name>.depthkv-tmp.<pid>.<n>` beside the destination `<name>`.
/// It is removed when the write fails; a process killed while writing (SIGKILL, power loss) can
/// leave it behind, and such a file may be deleted. A program that handles SIGINT/SIGTERM calls
/// `remove_pending_temp_files()` from its handler to remove the files being written (the
/// depthkv program does, tools/depthkv.cpp).
///
/// A destination that exists and is not a regular file (a character device such as /dev/null
/// or /dev/full, a FIFO), or a symbolic link under /dev/ or /proc/ (/dev/stdout, /dev/fd/1: they
/// may lead to the regular file a shell redirected to), is written in place (opened with O_TRUNC,
/// as a plain open would): a rename would replace the device node or the file behind the open
/// descriptor. Any other symbolic link is followed to its target when the target exists (the
/// link stays a link). A replaced regular file keeps its permission bits; a new file gets 0666
/// minus the umask, as a plain open would. A rename replaces the file's inode, so hard links to
/// the old file keep the old contents, and the file's owner becomes the writing user.
///
/// @code
/// depthkv::detail::write_file_atomically("out.json", text, "'out.json' (results)", "save_results");
/// @endcode

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "depthkv/error.hpp"

namespace depthkv {
namespace detail {

/// The mark in the name of every temporary file of `write_file_atomically`.
inline constexpr char kTempFileMark[] = ".depthkv-tmp.";

/// One temporary file being written, as a signal handler may read it: a fixed buffer and a
/// lock-free state (0 free, 1 being claimed, 2 `path` valid), no allocation.
struct PendingTempFile {
  std::atomic<int> state{0};
  char path[4096] = {};
};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler reads the state");

/// How many temporary files can be registered at once (writes beyond that still work; a signal
/// handler then cannot remove their temporary files).
inline constexpr int kMaxPendingTempFiles = 16;

/// The temporary files being written by this program (one table per program: C++17 inline
/// variable).
inline PendingTempFile pending_temp_files[kMaxPendingTempFiles];

/// Set by `remove_pending_temp_files`: the program is ending, and `write_file_atomically` creates
/// no file that would outlive it.
inline std::atomic<bool> temp_files_removed{false};

/// Removes every temporary file being written right now, for a SIGINT/SIGTERM handler that then
/// ends the program; afterwards `write_file_atomically` fails instead of writing (a write on
/// another thread then removes its own temporary file). Async-signal-safe: lock-free atomics and
/// unlink(2) only.
inline void remove_pending_temp_files() noexcept {
  const int saved_errno = errno;
  temp_files_removed.store(true);
  for (PendingTempFile& p : pending_temp_files)
    if (p.state.load() == 2) ::unlink(p.path);
  errno = saved_errno;
}

/// Registers a temporary file's path in `pending_temp_files` for its lifetime (no registration
/// when the table is full or the path does not fit its buffer).
class PendingTempRegistration {
 public:
  explicit PendingTempRegistration(const std::string& path) {
    if (path.size() >= sizeof(PendingTempFile::path)) return;
    for (PendingTempFile& p : pending_temp_files) {
      int expected = 0;
      if (p.state.compare_exchange_strong(expected, 1)) {
        std::memcpy(p.path, path.c_str(), path.size() + 1);
        p.state.store(2);
        slot_ = &p;
        return;
      }
    }
  }
  PendingTempRegistration(const PendingTempRegistration&) = delete;
  PendingTempRegistration& operator=(const PendingTempRegistration&) = delete;
  ~PendingTempRegistration() {
    if (slot_) slot_->state.store(0);
  }

 private:
  PendingTempFile* slot_ = nullptr;
};

/// Writes all of `data` to `fd` (retrying short writes and EINTR).
/// @return 0, or the errno of the failed write
inline int write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

/// Why a write, fsync or close failed, for messages: "disk full or not writable (<strerror>)".
inline std::string write_failure(int err) {
  return std::string("disk full or not writable (") + std::strerror(err) + ")";
}

/// Where `write_file_atomically` writes `path`: its destination (a link's existing target), the
/// destination's status when it exists, and whether it is written in place (a device, a FIFO,
/// a link under /dev/ or /proc/).
struct AtomicDestination {
  std::string dest;
  struct stat st {};
  bool exists = false, in_place = false;
};

/// @throws Error on an empty path or a directory
inline AtomicDestination atomic_destination(const std::string& path, const std::string& what, const char* func) {
  DEPTHKV_CHECK_AS(func, !path.empty(), "cannot write " << what << ": empty path");
  AtomicDestination d;
  d.dest = path;
  const bool link = ::lstat(path.c_str(), &d.st) == 0 && S_ISLNK(d.st.st_mode);
  if (link) {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::canonical(path, ec);
    if (!ec) d.dest = target.string();
  }
  d.exists = ::stat(d.dest.c_str(), &d.st) == 0;
  DEPTHKV_CHECK_AS(func, !(d.exists && S_ISDIR(d.st.st_mode)), "cannot write " << what << ": it is a directory");
  const bool system_link = link && (path.rfind("/dev/", 0) == 0 || path.rfind("/proc/", 0) == 0);
  d.in_place = system_link || (d.exists && !S_ISREG(d.st.st_mode));
  return d;
}

/// Writes `bytes` over `path` in place (O_TRUNC, as a plain open would).
/// @throws Error when it cannot be opened or written
inline void write_in_place(const std::string& path, const std::string& bytes, const std::string& what,
                           const char* func) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  const int open_errno = fd >= 0 ? 0 : errno;
  DEPTHKV_CHECK_AS(func, fd >= 0, "cannot write " << what << ": cannot open it (" << std::strerror(open_errno) << ")");
  const int err = write_all(fd, bytes.data(), bytes.size());
  const int close_err = ::close(fd) == 0 ? 0 : errno;
  DEPTHKV_CHECK_AS(func, err == 0 && close_err == 0, "cannot write " << what << ": " << write_failure(err ? err : close_err));
}

/// Why a temporary file could not be created in `dir` (errno `err`), for messages.
inline std::string temp_create_failure(int err, const std::string& dir) {
  if (err == ENOENT || err == ENOTDIR) return "the folder '" + dir + "' does not exist";
  if (err == EACCES || err == EPERM || err == EROFS)
    return "the folder '" + dir + "' is not writable (" + std::strerror(err) + ")";
  if (err == ENOSPC || err == EDQUOT) return write_failure(err);
  return "cannot create a file in '" + dir + "' (" + std::strerror(err) + ")";
}

/// Creates a new temporary file beside `dest` (`.<name>.depthkv-tmp.<pid>.<n>`), its name
/// registered for signal handlers in `registration` before the file exists, and stays registered
/// until the file is renamed or removed (the registration outlives the file). A handler that runs
/// while the file is created either sees the registration and removes the file, or set
/// `temp_files_removed`, which the caller checks afterwards.
/// @return the open descriptor (>= 0), or -1 with `err` set
inline int create_temp_file(const std::filesystem::path& dest, std::optional<PendingTempRegistration>& registration,
                            std::string& tmp, int& err) {
  const std::string dir = dest.parent_path().string();
  const std::string base = dest.filename().string().substr(0, 200);  // the temporary name fits NAME_MAX (255)
  static std::atomic<unsigned> counter{0};
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = (dir.empty() ? std::string() : dir + "/") + "." + base + kTempFileMark + std::to_string(::getpid()) + "." +
          std::to_string(counter.fetch_add(1));
    registration.reset();
    registration.emplace(tmp);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    err = fd < 0 ? errno : 0;
    if (fd < 0 && err != EEXIST) break;
  }
  return fd;
}

/// Writes `bytes` to `path` atomically (file comment: a temporary file in the same folder,
/// fsync, rename; a device or FIFO is written in place).
/// @param path the destination (file comment: followed links, devices)
/// @param bytes the whole contents
/// @param what the destination in messages, e.g. "profile file 'p.json'" or "'out.csv' (CSV)"
/// @param func the function named at the start of messages (DEPTHKV_CHECK_AS)
/// @throws Error "cannot write <what>: <reason>" (reasons: an empty path, a directory, a folder
///   that does not exist or is not writable, disk full or not writable, the rename failed);
///   the temporary file is removed and an existing destination is untouched
inline void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what,
                                  const char* func) {
  const AtomicDestination d = atomic_destination(path, what, func);
  if (d.in_place) return write_in_place(path, bytes, what, func);
  const std::filesystem::path dest_path(d.dest);
  const std::string shown_dir = dest_path.parent_path().empty() ? std::string(".") : dest_path.parent_path().string();
  std::optional<PendingTempRegistration> registration;
  std::string tmp;
  int open_err = 0;
  const int fd = create_temp_file(dest_path, registration, tmp, open_err);
  DEPTHKV_CHECK_AS(func, fd >= 0, "cannot write " << what << ": " << temp_create_failure(open_err, shown_dir));
  struct TempFile {  // closed, and removed unless renamed, on every way out
    const std::string& path;
    int fd;
    bool renamed = false;
    ~TempFile() {
      if (fd >= 0) ::close(fd);
      if (!renamed) ::unlink(path.c_str());
    }
  } file{tmp, fd};
  DEPTHKV_CHECK_AS(
      func, !temp_files_removed.load(),
      "cannot write " << what << ": the program is ending (a signal handler removed its temporary files)");
  if (d.exists) ::fchmod(file.fd, d.st.st_mode & 07777);  // keeps the replaced file's permissions (best effort)
  int err = write_all(file.fd, bytes.data(), bytes.size());
  if (err == 0 && ::fsync(file.fd) != 0) err = errno;
  const int closing = file.fd;
  file.fd = -1;
  if (::close(closing) != 0 && err == 0) err = errno;
  DEPTHKV_CHECK_AS(func, err == 0, "cannot write " << what << ": " << write_failure(err));
  const int rename_err = std::rename(tmp.c_str(), d.dest.c_str()) == 0 ? 0 : errno;
  DEPTHKV_CHECK_AS(func, rename_err == 0,
                   "cannot write " << what << ": cannot rename '" << tmp << "' over it (" << std::strerror(rename_err)
                                   << ")");
  file.renamed = true;
  const int dir_fd = ::open(shown_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {  // the rename itself reaches the disk (best effort: some file systems refuse)
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace detail
}  // namespace depthkv
