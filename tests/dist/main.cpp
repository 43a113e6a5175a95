// The dist tests' main: starts MPI and runs every test on every rank (ctest
// passes --gtest_brief=1: each rank prints its failures and a summary); the
// exit status is the worst of the ranks'.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "dist_test_util.h"
#include "mha/dist.h"
#include "mha/threads.h"

int main(int argc, char** argv) {
  // Before MPI starts: the catalogue row of a Communicator made too early
  // (test_errors.cpp checks the message it recorded).
  try {
    mha::dist::Communicator::world();
  } catch (const mha::Error& e) {
    mha::dist::test::early_errors()["dist.not_running"] = e.what();
  }
  int status = 0;
  {
    mha::dist::Environment mpi(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    mha::set_num_threads(1);  // 4 ranks on 2 cores: one thread each
    const mha::dist::Communicator world = mha::dist::Communicator::world();
    int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (local != 0) std::fprintf(stderr, "rank %d of %d: some mha::dist test failed\n", world.rank(), world.size());
  }
  // After MPI_Finalize: MPI cannot start again in this process.
  try {
    mha::dist::Environment again;
    std::fprintf(stderr, "a second Environment after MPI_Finalize did not throw\n");
    status = 1;
  } catch (const mha::Error& e) {
    const std::string want =
        "[dist.Environment] MPI was finalised already in this process; it cannot be initialised again";
    if (e.what() != want) {
      std::fprintf(stderr, "dist.finalized: got \"%s\", wanted \"%s\"\n", e.what(), want.c_str());
      status = 1;
    }
  }
  return status;
}
