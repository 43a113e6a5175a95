// mha/dist/communicator.h: a group of MPI processes and the messages mha
// sends between them.
//
//   mha::dist::Environment mpi(argc, argv);
//   mha::dist::Communicator comm = mha::dist::Communicator::world();
//   mha::Tensor partial = ...;               // the same shape on every rank
//   comm.all_reduce_sum(partial);            // now the sum over the ranks
//
// A Communicator is a duplicate of MPI_COMM_WORLD (or of another group), so
// that mha's messages never match the caller's own. Its MPI errors are
// returned, not fatal, and come back as mha::Error naming the operation, the
// MPI call and MPI's text. Collective operations (all_reduce_sum,
// all_gather, broadcast, barrier) must be called by every rank in the same
// order with the same counts, as in MPI. Counts are 64-bit: longer buffers go
// as several MPI messages. Copies share the underlying MPI communicator,
// which is freed with the last copy (or left to MPI_Finalize if that came
// first).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mha/tensor.h"

namespace mha::dist {

// A non-blocking send or receive in flight (Communicator::isend / irecv).
// wait() completes it; a Request destroyed before wait() waits then, and
// ignores errors there (a destructor cannot throw).
class Request {
 public:
  // A request with nothing in flight.
  Request();
  ~Request();
  // Moves the operation in flight; `other` is left with nothing in flight.
  Request(Request&& other) noexcept;
  // Waits for this request's own operation first, then takes other's.
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Blocks until the operation completes. A receive checks that the
  // message had exactly the count asked for (mha::Error otherwise).
  void wait();
  // True while an operation is in flight (before wait()).
  bool pending() const;

 private:
  friend class Communicator;
  struct State;
  std::unique_ptr<State> state_;
};

// A group of processes (ranks 0 .. size()-1) and messages among them.
class Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD: every process of the run. Collective.
  // Throws mha::Error when MPI is not running (make an Environment first).
  static Communicator world();

  // The ranks that pass the same `color` (>= 0), as a communicator of their
  // own, numbered by `key` (ties by rank here). Collective.
  Communicator split(int color, int key) const;

  // This process's number, 0 <= rank() < size().
  int rank() const;
  // The number of processes.
  int size() const;

  // data[0..count) <- its sum over the ranks (float32 sums; MPI chooses the
  // order, the same on every rank). Collective.
  void all_reduce_sum(float* data, int64_t count) const;
  // t <- its elementwise sum over the ranks (every rank the same shape). Collective.
  void all_reduce_sum(Tensor& t) const;
  // [size()]: `value` of every rank, by rank. Collective.
  std::vector<int64_t> all_gather(int64_t value) const;
  // data[0..count) <- root's. Collective.
  void broadcast(float* data, int64_t count, int root) const;
  // root's `text` on every rank (the others' `text` is not read): how one
  // rank's error message reaches the ranks that stop with it. Collective.
  std::string broadcast(const std::string& text, int root) const;
  // Returns when every rank has called it. Collective.
  void barrier() const;
  // Lets MPI move this rank's messages in flight along (a probe that
  // receives nothing). A large message travels by rendezvous, which
  // advances only inside MPI calls: a rank computing between isend/irecv
  // and wait calls this now and then so the transfer overlaps the compute.
  void progress() const;

  // Sends data[0..count) to rank `dest` under `tag` (>= 0); blocks until
  // the buffer may be reused.
  void send(const float* data, int64_t count, int dest, int tag) const;
  // Receives exactly `count` floats from rank `source` under `tag`;
  // mha::Error if the message holds another count.
  void recv(float* data, int64_t count, int source, int tag) const;
  // send() without waiting: data must stay valid and unchanged until the
  // request's wait().
  [[nodiscard]] Request isend(const float* data, int64_t count, int dest, int tag) const;
  // recv() without waiting: data must stay valid and unread until wait().
  [[nodiscard]] Request irecv(float* data, int64_t count, int source, int tag) const;

 private:
  struct Shared;
  explicit Communicator(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace mha::dist
