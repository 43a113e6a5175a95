#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "mha/error.h"

namespace mha::io {

void write_file_atomic(const std::string& path, const uint8_t* bytes, size_t size) {
  static const char* op = "write";
  std::string tmpl = path + ".tmp-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) fail(op, "cannot create a temporary file beside '", path, "': ", std::strerror(errno));
  auto abandon = [&](const char* what) {
    const int err = errno;
    close(fd);
    unlink(name.data());
    fail(op, what, " '", path, "': ", std::strerror(err));
  };
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp makes the file 0600; give it the usual 0644 minus the umask.
  const mode_t mask = umask(0);
  umask(mask);
  fchmod(fd, 0666 & ~mask);
  if (fsync(fd) != 0) abandon("cannot flush");
  if (close(fd) != 0) {
    unlink(name.data());
    fail(op, "cannot close '", path, "': ", std::strerror(errno));
  }
  if (std::rename(name.data(), path.c_str()) != 0) {
    const int err = errno;
    unlink(name.data());
    fail(op, "cannot rename the temporary file onto '", path, "': ", std::strerror(err));
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) fail("read", "cannot open '", path, "': ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("read", "'", path, "' is not a regular file");
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
