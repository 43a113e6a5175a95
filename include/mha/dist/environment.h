// mha/dist/environment.h: MPI's lifetime in a process, as one object.
//
//   int main(int argc, char** argv) {
//     mha::dist::Environment mpi(argc, argv);   // MPI_Init_thread
//     mha::dist::Communicator world = mha::dist::Communicator::world();
//     ...
//   }                                           // MPI_Finalize
//
// MPI can be initialised once per process and never again after it is
// finalised, so an Environment made while MPI is already running (by the
// caller's own MPI_Init) leaves it running when it goes. Only the thread that
// made the Environment may call mha::dist (MPI_THREAD_FUNNELED); mha's own
// threads never call MPI.
#pragma once

namespace mha::dist {

// MPI, initialised while this object lives (see the file comment).
class Environment {
 public:
  // Initialises MPI with the program's arguments (MPI may remove its own
  // from them). Throws mha::Error when MPI was finalised already or fails to
  // start.
  Environment(int& argc, char**& argv);
  // Initialises MPI without the program's arguments.
  Environment();
  // Finalises MPI if this object initialised it.
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  // True between MPI's initialisation (by anyone) and its finalisation.
  static bool running();

 private:
  bool owns_ = false;  // this object initialised MPI, so it finalises it
};

}  // namespace mha::dist
