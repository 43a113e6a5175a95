#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/memory.h"
#include "mha/error.h"

namespace mha::io {

namespace {

const char* kWrite = "write";

// The folder `path` is in, for a temporary file that rename() can move onto it.
std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of `bytes` to `fd`; false (errno set) on failure.
bool write_all(int fd, const uint8_t* bytes, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// A name in the folder of `path` that is not taken yet (for linkat, which
// will not replace a file). It does not repeat the file's own name: a name
// near the system's limit (NAME_MAX, 255 bytes) plus a suffix would not fit.
std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  char name[64];
  std::snprintf(name, sizeof name, "/.tmp-mha-%ld-%u", static_cast<long>(getpid()), counter++);
  return folder_of(path) + name;
}

// The permissions the written file gets: those of the file it replaces, so
// that a 0600 checkpoint stays private; for a new file the usual 0666 minus
// the umask.
mode_t mode_for(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return st.st_mode & 07777;
  const mode_t mask = umask(0);
  umask(mask);
  return 0666 & ~mask;
}

[[noreturn]] void fail_errno(const char* what, const std::string& path, int err) {
  fail(kWrite, what, " '", path, "': ", std::strerror(err));
}

// The preferred way: an unnamed file (O_TMPFILE) in the target's folder. Until
// it is complete and flushed it has no name, so a crash or a SIGKILL while
// writing leaves nothing behind at all; then it is linked under a temporary
// name and renamed over `path`. Returns false, having changed nothing, where
// the file system or the kernel cannot do this (the caller falls back).
bool write_via_unnamed_file(const std::string& path, const uint8_t* bytes, size_t size) {
#ifdef O_TMPFILE
  const int fd = open(folder_of(path).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  if (fd < 0) {
    if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) return false;
    fail_errno("cannot create a temporary file beside", path, errno);
  }
  if (!write_all(fd, bytes, size)) {
    const int err = errno;
    close(fd);
    fail_errno("cannot write", path, err);
  }
  // Failing to set the mode is not worth an error: the file keeps 0666 minus the umask.
  (void)fchmod(fd, mode_for(path));
  if (fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    fail_errno("cannot flush", path, err);
  }
  // linkat(fd, "", ..., AT_EMPTY_PATH) needs a privilege; the /proc link does not.
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  std::string tmp;
  for (int attempt = 0;; ++attempt) {
    tmp = temporary_name(path);
    if (linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0) break;
    const int err = errno;
    if (err == EEXIST && attempt < 100) continue;
    close(fd);
    if (err == ENOENT || err == EPERM || err == EXDEV) return false;  // no /proc, or not allowed
    fail_errno("cannot name the temporary file for", path, err);
  }
  close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    fail_errno("cannot rename the temporary file onto", path, err);
  }
  return true;
#else
  (void)path, (void)bytes, (void)size;
  return false;
#endif
}

// The portable way: mkstemp beside `path`, write, flush, rename. A kill while
// writing leaves the (partial) temporary file, never a partial `path`.
void write_via_named_file(const std::string& path, const uint8_t* bytes, size_t size) {
  std::string tmpl = folder_of(path) + "/.tmp-mha-XXXXXX";  // short: see temporary_name
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) fail_errno("cannot create a temporary file beside", path, errno);
  auto abandon = [&](const char* what) {
    const int err = errno;
    close(fd);
    unlink(name.data());
    fail_errno(what, path, err);
  };
  if (!write_all(fd, bytes, size)) abandon("cannot write");
  // mkstemp makes the file 0600; give it the replaced file's mode, or the usual 0666 minus the umask.
  (void)fchmod(fd, mode_for(path));
  if (fsync(fd) != 0) abandon("cannot flush");
  if (close(fd) != 0) {
    const int err = errno;
    unlink(name.data());
    fail_errno("cannot close", path, err);
  }
  if (std::rename(name.data(), path.c_str()) != 0) {
    const int err = errno;
    unlink(name.data());
    fail_errno("cannot rename the temporary file onto", path, err);
  }
}

}  // namespace

void check_output_path(const std::string& path) {
  if (path.empty()) fail(kWrite, "the output path is empty");
  if (path.find('\0') != std::string::npos)
    fail(kWrite, "the output path '", path.substr(0, path.find('\0')), "\\0...' contains a NUL byte");
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail(kWrite, "'", path, "' is a folder, not a file");
  // The rename would replace a symbolic link, a FIFO or a device node by a
  // regular file: refused, so that a link is never silently cut.
  if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(kWrite, "'", path, "' is not a regular file (a symbolic link, FIFO, socket or device); "
                 "mha replaces regular files only");
  const std::string folder = folder_of(path);
  if (stat(folder.c_str(), &st) != 0) fail_errno("cannot create a temporary file beside", path, errno);
  if (!S_ISDIR(st.st_mode)) fail_errno("cannot create a temporary file beside", path, ENOTDIR);
  if (access(folder.c_str(), W_OK | X_OK) != 0) fail_errno("cannot create a temporary file beside", path, errno);
}

void write_file_atomic(const std::string& path, const uint8_t* bytes, size_t size) {
  check_output_path(path);
  if (!write_via_unnamed_file(path, bytes, size)) write_via_named_file(path, bytes, size);
  // Make the rename itself durable; failing to is not worth an error.
  const int dir = open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  if (path.find('\0') != std::string::npos)
    fail("read", "the path '", path.substr(0, path.find('\0')), "\\0...' contains a NUL byte");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) fail("read", "cannot open '", path, "': ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("read", "'", path, "' is not a regular file");
  core::check_bytes("read", "'" + path + "'", static_cast<uint64_t>(st.st_size));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("read", "cannot open '", path, "': ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) fail("read", "cannot size '", path, "' (is it a regular file?)");
  in.seekg(0, std::ios::beg);
  std::vector<uint8_t> data(static_cast<size_t>(end));
  if (end > 0 && !in.read(reinterpret_cast<char*>(data.data()), end))
    fail("read", "cannot read '", path, "'");
  return data;
}

}  // namespace mha::io
