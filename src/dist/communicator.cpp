// mha::dist::Communicator and Request over MPI (mha/dist/communicator.h).
#include "mha/dist/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "dist/mpi_error.h"
#include "mha/dist/environment.h"
#include "mha/error.h"

namespace mha::dist {

namespace {

// MPI counts are int: longer buffers travel as several messages of at most
// this many floats, in order (MPI does not let messages of one sender, tag
// and communicator overtake each other).
constexpr int64_t kChunk = INT_MAX;

int64_t chunks(int64_t count) { return count == 0 ? 1 : (count + kChunk - 1) / kChunk; }
int chunk_count(int64_t count, int64_t c) { return static_cast<int>(std::min(kChunk, count - c * kChunk)); }

void check_count(const char* op, int64_t count) {
  if (count < 0) fail(op, "count: ", count, " is negative");
}

std::string peer_text(const char* dir, int peer, int tag) {
  return std::string(" ") + dir + " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

}  // namespace

struct Communicator::Shared {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  ~Shared() {
    // After MPI_Finalize a communicator may no longer be freed (MPI frees it).
    if (comm != MPI_COMM_NULL && Environment::running()) MPI_Comm_free(&comm);
  }

  void check_peer(const char* op, const char* arg, int peer) const {
    if (peer < 0 || peer >= size) fail(op, arg, ": ", peer, " is not a rank; wanted 0 <= ", arg, " < ", size);
  }
  static void check_tag(const char* op, int tag) {
    if (tag < 0) fail(op, "tag: ", tag, " is negative; MPI tags are >= 0");
  }
  // A point-to-point call's arguments: `arg` names the peer ("dest", "source").
  void check_message(const char* op, int64_t count, const char* arg, int peer, int tag) const {
    check_count(op, count);
    check_peer(op, arg, peer);
    check_tag(op, tag);
  }
  // A new communicator's setup: errors as return codes (then mha::Error),
  // not as an abort of every process; its rank and size.
  void adopt(const char* op) {
    check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), op, "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm, &rank), op, "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &size), op, "MPI_Comm_size");
  }
};

struct Request::State {
  std::vector<MPI_Request> requests;
  std::vector<int> expected;  // a receive's count per request; -1 for a send
  const char* op = "";
  std::string peer;           // " from rank 1 (tag 3)", for messages

  // A non-blocking send or receive of `count` floats: one request per chunk,
  // start(offset, n, &request) posts one and returns MPI's code (`call`
  // names it in errors); a receive expects n floats back. Requests posted
  // before a failing one stay in the Request, which waits for them.
  template <class Start>
  static Request post(const char* op, std::string peer, const char* call, int64_t count, bool receive,
                      Start start) {
    Request r;
    r.state_ = std::make_unique<State>();
    State& s = *r.state_;
    s.op = op;
    s.peer = std::move(peer);
    for (int64_t c = 0; c < chunks(count); ++c) {
      MPI_Request q;
      const int n = chunk_count(count, c);
      check_mpi(start(c * kChunk, n, &q), op, call, s.peer);
      s.requests.push_back(q);
      s.expected.push_back(receive ? n : -1);
    }
    return r;
  }
};

Request::Request() = default;
Request::~Request() {
  if (!pending()) return;
  try {
    wait();
  } catch (const Error&) {
    // A destructor cannot throw: the error is lost, as the caller chose by
    // not waiting.
  }
}
Request::Request(Request&& other) noexcept : state_(std::move(other.state_)) {}
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    Request old(std::move(*this));  // waits for this request's operation
    state_ = std::move(other.state_);
  }
  return *this;
}
bool Request::pending() const { return state_ != nullptr; }

void Request::wait() {
  if (!state_) return;
  std::unique_ptr<State> s = std::move(state_);
  std::vector<MPI_Status> statuses(s->requests.size());
  const int rc = MPI_Waitall(static_cast<int>(s->requests.size()), s->requests.data(), statuses.data());
  if (rc == MPI_ERR_IN_STATUS) {
    for (const MPI_Status& st : statuses) check_mpi(st.MPI_ERROR, s->op, "MPI_Waitall", s->peer);
  }
  check_mpi(rc, s->op, "MPI_Waitall", s->peer);
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (s->expected[i] < 0) continue;
    int got = 0;
    MPI_Get_count(&statuses[i], MPI_FLOAT, &got);
    if (got != s->expected[i])
      fail(s->op, "message", s->peer, ": holds ", got, " floats, wanted ", s->expected[i]);
  }
}

Communicator::Communicator(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

Communicator Communicator::world() {
  static const char* op = "dist.Communicator.world";
  if (!Environment::running())
    fail(op, "MPI is not running: make an mha::dist::Environment first (or call MPI_Init)");
  auto s = std::make_shared<Shared>();
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s->comm), op, "MPI_Comm_dup");
  s->adopt(op);
  return Communicator(std::move(s));
}

Communicator Communicator::split(int color, int key) const {
  static const char* op = "dist.Communicator.split";
  if (color < 0) fail(op, "color: ", color, " is negative; wanted >= 0");
  auto s = std::make_shared<Shared>();
  check_mpi(MPI_Comm_split(shared_->comm, color, key, &s->comm), op, "MPI_Comm_split");
  s->adopt(op);
  return Communicator(std::move(s));
}

int Communicator::rank() const { return shared_->rank; }
int Communicator::size() const { return shared_->size; }

void Communicator::all_reduce_sum(float* data, int64_t count) const {
  static const char* op = "dist.Communicator.all_reduce_sum";
  check_count(op, count);
  for (int64_t c = 0; c * kChunk < count; ++c)
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + c * kChunk, chunk_count(count, c), MPI_FLOAT, MPI_SUM, shared_->comm),
              op, "MPI_Allreduce");
}

void Communicator::all_reduce_sum(Tensor& t) const { all_reduce_sum(t.data(), t.numel()); }

std::vector<int64_t> Communicator::all_gather(int64_t value) const {
  std::vector<int64_t> out(static_cast<size_t>(size()));
  check_mpi(MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, shared_->comm),
            "dist.Communicator.all_gather", "MPI_Allgather");
  return out;
}

void Communicator::broadcast(float* data, int64_t count, int root) const {
  static const char* op = "dist.Communicator.broadcast";
  check_count(op, count);
  shared_->check_peer(op, "root", root);
  for (int64_t c = 0; c * kChunk < count; ++c)
    check_mpi(MPI_Bcast(data + c * kChunk, chunk_count(count, c), MPI_FLOAT, root, shared_->comm), op, "MPI_Bcast");
}

std::string Communicator::broadcast(const std::string& text, int root) const {
  static const char* op = "dist.Communicator.broadcast";
  shared_->check_peer(op, "root", root);
  int64_t length = static_cast<int64_t>(text.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_INT64_T, root, shared_->comm), op, "MPI_Bcast");
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(length), '\0');
  for (int64_t c = 0; c * kChunk < length; ++c)
    check_mpi(MPI_Bcast(out.data() + c * kChunk, chunk_count(length, c), MPI_CHAR, root, shared_->comm), op,
              "MPI_Bcast");
  return out;
}

void Communicator::progress() const {
  int flag = 0;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, shared_->comm, &flag, MPI_STATUS_IGNORE),
            "dist.Communicator.progress", "MPI_Iprobe");
}

void Communicator::barrier() const {
  check_mpi(MPI_Barrier(shared_->comm), "dist.Communicator.barrier", "MPI_Barrier");
}

void Communicator::send(const float* data, int64_t count, int dest, int tag) const {
  static const char* op = "dist.Communicator.send";
  shared_->check_message(op, count, "dest", dest, tag);
  for (int64_t c = 0; c < chunks(count); ++c)
    check_mpi(MPI_Send(data + c * kChunk, chunk_count(count, c), MPI_FLOAT, dest, tag, shared_->comm), op, "MPI_Send",
              peer_text("to", dest, tag));
}

void Communicator::recv(float* data, int64_t count, int source, int tag) const {
  static const char* op = "dist.Communicator.recv";
  shared_->check_message(op, count, "source", source, tag);
  const std::string peer = peer_text("from", source, tag);
  for (int64_t c = 0; c < chunks(count); ++c) {
    MPI_Status status;
    const int want = chunk_count(count, c);
    check_mpi(MPI_Recv(data + c * kChunk, want, MPI_FLOAT, source, tag, shared_->comm, &status), op, "MPI_Recv",
              peer);
    int got = 0;
    MPI_Get_count(&status, MPI_FLOAT, &got);
    if (got != want) fail(op, "message", peer, ": holds ", got, " floats, wanted ", want);
  }
}

Request Communicator::isend(const float* data, int64_t count, int dest, int tag) const {
  static const char* op = "dist.Communicator.isend";
  shared_->check_message(op, count, "dest", dest, tag);
  return Request::State::post(op, peer_text("to", dest, tag), "MPI_Isend", count, false,
                              [&](int64_t offset, int n, MPI_Request* q) {
                                // MPI-2 headers take a non-const buffer for sends.
                                return MPI_Isend(const_cast<float*>(data + offset), n, MPI_FLOAT, dest, tag,
                                                 shared_->comm, q);
                              });
}

Request Communicator::irecv(float* data, int64_t count, int source, int tag) const {
  static const char* op = "dist.Communicator.irecv";
  shared_->check_message(op, count, "source", source, tag);
  return Request::State::post(op, peer_text("from", source, tag), "MPI_Irecv", count, true,
                              [&](int64_t offset, int n, MPI_Request* q) {
                                return MPI_Irecv(data + offset, n, MPI_FLOAT, source, tag, shared_->comm, q);
                              });
}

}  // namespace mha::dist
