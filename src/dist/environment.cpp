// MPI_Init_thread / MPI_Finalize behind mha::dist::Environment.
#include "mha/dist/environment.h"

#include <mpi.h>

#include <string>

#include "dist/mpi_error.h"
#include "mha/error.h"

namespace mha::dist {

namespace {

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

bool initialized() {
  int started = 0;
  MPI_Initialized(&started);
  return started != 0;
}

}  // namespace

Environment::Environment(int& argc, char**& argv) {
  static const char* op = "dist.Environment";
  if (finalized())
    fail(op, "MPI was finalised already in this process; it cannot be initialised again");
  if (initialized()) return;  // the caller's MPI: left running
  int provided = 0;
  // FUNNELED: only the thread that made the Environment calls MPI; mha's
  // worker threads (OpenMP) never do.
  check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), op, "MPI_Init_thread");
  owns_ = true;
}

Environment::Environment() {
  int argc = 0;
  char** argv = nullptr;
  Environment started(argc, argv);
  owns_ = started.owns_;
  started.owns_ = false;  // this object finalises, not the temporary
}

Environment::~Environment() {
  if (owns_ && !finalized()) MPI_Finalize();
}

bool Environment::running() { return initialized() && !finalized(); }

}  // namespace mha::dist
