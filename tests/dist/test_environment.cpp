// mha::dist::Environment: MPI runs while the tests run (main.cpp made the
// Environment), and an Environment made while MPI runs leaves it running.
#include <mpi.h>

#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

TEST(Environment, RunningWhileTheTestsRun) { EXPECT_TRUE(Environment::running()); }

TEST(Environment, ASecondEnvironmentLeavesMpiRunning) {
  { Environment inner; }  // MPI was started by main.cpp's: this one must not finalise it
  EXPECT_TRUE(Environment::running());
  int size = 0;
  EXPECT_EQ(MPI_Comm_size(MPI_COMM_WORLD, &size), MPI_SUCCESS);
  EXPECT_GE(size, 1);
}

}  // namespace
}  // namespace mha::dist::test
