// write_file_atomic replaces a file through a temporary one and a rename; the
// replaced file keeps its permissions (a 0600 checkpoint stays private), and
// a new file gets 0666 minus the umask.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mha/atomic_file.h"
#include "test_util.h"

namespace {

mode_t mode_of(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  return st.st_mode & 07777;
}

std::string scratch(const char* name) {
  return ::testing::TempDir() + "/mha-atomic-" + std::to_string(getpid()) + "-" + name;
}

}  // namespace

TEST(AtomicFile, ReplacedFileKeepsItsMode) {
  const std::vector<uint8_t> bytes = {1, 2, 3};
  for (const mode_t mode : {mode_t{0600}, mode_t{0640}, mode_t{0604}, mode_t{0755}}) {
    const std::string path = scratch("kept");
    mha::io::write_file_atomic(path, bytes);
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    mha::io::write_file_atomic(path, std::vector<uint8_t>{4, 5});
    EXPECT_EQ(mode_of(path), mode) << std::oct << mode;
    std::remove(path.c_str());
  }
}

TEST(AtomicFile, NewFileGetsTheUmasksMode) {
  const std::string path = scratch("new");
  std::remove(path.c_str());
  const mode_t old = umask(022);
  mha::io::write_file_atomic(path, std::vector<uint8_t>{1});
  EXPECT_EQ(mode_of(path), mode_t{0644});
  std::remove(path.c_str());
  umask(077);
  mha::io::write_file_atomic(path, std::vector<uint8_t>{1});
  EXPECT_EQ(mode_of(path), mode_t{0600});
  umask(old);
  std::remove(path.c_str());
}
