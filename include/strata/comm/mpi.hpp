// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata's MPI layer. This is the only strata header that includes <mpi.h>; everything that
// speaks MPI lives here, in sections:
//
//   1. dtype mapping   the MPI datatype of each strata::dtype, and which of them MPI can reduce
//   2. the mpi comm backend (follows the dtype mapping)

// Open MPI's deprecated C++ bindings are not used: keep <mpi.h> from pulling them in, so that a
// program needs only the C library. (MPI_CXX_SKIP_MPICXX in CMake's FindMPI sets the same.)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/detail/wait.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/fingerprint.hpp"
#include "strata/comm/history.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/cpus.hpp"
#include "strata/core/deadline.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

// ---------------------------------------------------------------------------------------------
// 1. dtype mapping
//
// float16 and bfloat16 have no MPI datatype that MPI_Reduce understands (Open MPI 4.1 has none;
// MPI 4.1's MPIX_C_FLOAT16 is not portable). They travel as MPI_UINT16_T, which moves the bits
// exactly; a reduction over them must install its own MPI_Op (widen to float, combine, round
// back), and mpi_reduces_natively tells it when.

// The MPI datatype that carries one element of `type`. Throws strata::error for a value outside
// the enum.
inline MPI_Datatype mpi_datatype(dtype type) {
  switch (type) {
    case dtype::float32:
      return MPI_FLOAT;
    case dtype::float64:
      return MPI_DOUBLE;
    case dtype::float16:
      return MPI_UINT16_T;
    case dtype::bfloat16:
      return MPI_UINT16_T;
    case dtype::int32:
      return MPI_INT32_T;
    case dtype::int64:
      return MPI_INT64_T;
    case dtype::uint8:
      return MPI_UINT8_T;
  }
  throw error("mpi_datatype: invalid dtype value " + std::to_string(static_cast<unsigned>(type)));
}

// mpi_datatype(dtype_of<T>); a T that is not an element type fails to compile, with the list of
// the allowed ones.
template <class T>
MPI_Datatype mpi_datatype_of() {
  return mpi_datatype(dtype_of<T>);
}

// True when MPI's predefined reduction operations (MPI_SUM, MPI_MAX, ...) work on
// mpi_datatype(type) with the element's own arithmetic. False for float16 and bfloat16, whose
// MPI_UINT16_T would be summed as integers; false for a value outside the enum.
constexpr bool mpi_reduces_natively(dtype type) noexcept {
  switch (type) {
    case dtype::float32:
    case dtype::float64:
    case dtype::int32:
    case dtype::int64:
    case dtype::uint8:
      return true;
    case dtype::float16:
    case dtype::bfloat16:
      return false;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// 2. the mpi comm backend
//
//     int main(int argc, char** argv) {
//       strata::comm::mpi_environment env(argc, argv);        // MPI_Init_thread ... MPI_Finalize
//       auto comm = strata::comm::mpi::world();
//       strata::config::check_world_size(cfg, comm.size(), "mpiexec");  // a config_error if not
//       strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::avg);
//     }
//
// How it keeps the contract of concepts.hpp:
//   - every operation is non-blocking underneath (MPI_Iallreduce, MPI_Ibcast, ..., MPI_Isend);
//     the blocking forms are `<name>_async(...).wait()`. A wait polls MPI_Test (a short spin,
//     then yields, then sleeps of growing length) until config().timeout. Past it the rank
//     prints the comm_error (op, sequence number, ranks, this rank's op history) to stderr and
//     calls MPI_Abort: an MPI communicator with an operation stuck in it cannot be recovered, and
//     aborting is what makes every other rank stop too. Nothing waits without a deadline.
//   - each communicator holds two MPI communicators: `data` for the operations themselves (and
//     the signature exchange of a mismatch report), `check` for fingerprints. A fingerprinted
//     collective first all-reduces the two fingerprint words (MPI_MAX) on `check`; its data
//     operation is posted on `data` only when the check agrees, and collectives are posted in
//     the order they were issued (a FIFO per communicator), so every rank issues the same
//     sequence of MPI calls on each MPI communicator. When the words disagree every rank
//     gathers the op_signatures on `data` (in the failed operation's place in that sequence) and
//     throws comm_error (mismatch) with describe_mismatch's per-rank diff; no data moved, and the
//     communicator stays usable. Non-blocking calls do not wait for the check: it completes in
//     test() / wait() of any request of the communicator. With fingerprint_mode::sampled only the
//     sampled collectives are checked, so a call that differs between the checks may still reach
//     MPI; split is always checked. When MPI fails an operation (an unchecked mismatch of
//     counts, say) the rank throws comm_error (backend), naming an unchecked collective as
//     such, and mpi_environment ends the job when it goes, whether or not the program caught
//     the error: the ranks are out of step, and MPI_Finalize could wait for ever.
//   - errors come back from MPI (MPI_ERRORS_RETURN on every communicator) and become comm_error
//     (backend) with MPI_Error_string's text; a receive that gets a different element count than
//     it asked for is a comm_error (mismatch).
//   - float16 and bfloat16 travel as MPI_UINT16_T and reduce through user MPI_Ops (one per
//     dtype and operation, commutative) built on comm/reduce.hpp: each combine widens to float
//     and rounds back. avg is MPI's sum divided once at the end.
//   - in place: all_reduce / reduce with send == recv, all_gather with send at this rank's slice
//     of recv and all_to_all with send == recv use MPI_IN_PLACE. reduce_scatter with recv at this
//     rank's slice of send (the NCCL convention) runs MPI's in-place form over the whole buffer,
//     whose result lands in slice 0, and moves it to this rank's slice: after an in-place
//     reduce_scatter only this rank's slice of the buffer is defined.
//   - fault injection: fault_injector::global().at(rank, op, sequence) before each operation.
//     Collectives (split included) are numbered by one counter per communicator; sends and
//     receives by a second one, their own.
//   - a communicator and its requests are used by one thread at a time (mpi_environment asks for
//     MPI_THREAD_SERIALIZED by default; ask for `multiple` to use several communicators from
//     several threads at once). A request must be waited on before the buffers it uses go away;
//     destroying a request that is still running waits for it.

// The thread support asked of MPI_Init_thread.
enum class mpi_thread_level : std::uint8_t { single, funneled, serialized, multiple };

constexpr std::string_view to_string(mpi_thread_level level) noexcept {
  switch (level) {
    case mpi_thread_level::single:
      return "single";
    case mpi_thread_level::funneled:
      return "funneled";
    case mpi_thread_level::serialized:
      return "serialized";
    case mpi_thread_level::multiple:
      return "multiple";
  }
  return "unknown";
}

struct mpi_environment_config {
  // The least thread support the program needs; MPI_Init_thread providing less is an error.
  mpi_thread_level thread_level = mpi_thread_level::serialized;

  bool operator==(const mpi_environment_config&) const = default;
};

inline std::string to_string(const mpi_environment_config& c) {
  return "mpi_environment_config{.thread_level = " + std::string(to_string(c.thread_level)) + "}";
}

namespace detail {

constexpr int to_mpi(mpi_thread_level level) noexcept {
  switch (level) {
    case mpi_thread_level::single:
      return MPI_THREAD_SINGLE;
    case mpi_thread_level::funneled:
      return MPI_THREAD_FUNNELED;
    case mpi_thread_level::serialized:
      return MPI_THREAD_SERIALIZED;
    case mpi_thread_level::multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_MULTIPLE;
}

inline mpi_thread_level from_mpi_thread_level(int level) noexcept {
  if (level == MPI_THREAD_MULTIPLE) {
    return mpi_thread_level::multiple;
  }
  if (level == MPI_THREAD_SERIALIZED) {
    return mpi_thread_level::serialized;
  }
  if (level == MPI_THREAD_FUNNELED) {
    return mpi_thread_level::funneled;
  }
  return mpi_thread_level::single;
}

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

inline bool mpi_is_active() noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

inline int mpi_world_rank() noexcept {
  int rank = -1;
  if (mpi_is_active()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  return rank;
}

// The text of the last error a communicator of this process threw, printed by mpi_environment
// when an exception leaves it.
// Both live until the process ends (never destroyed): an mpi_environment made before the first
// error, as a function-local static say, reads them in its destructor after every static made
// later is gone.
inline std::mutex& last_error_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
inline std::string& last_error_text() {
  static auto* text = new std::string;
  return *text;
}
inline void record_error(const std::string& text) {
  const std::lock_guard lock(last_error_mutex());
  last_error_text() = text;
}
inline std::string last_error() {
  const std::lock_guard lock(last_error_mutex());
  return last_error_text();
}
// Set when MPI itself failed an operation of this process (a backend comm_error): MPI leaves a
// communicator's state undefined after an error, and other ranks may be waiting in an operation
// this one will never join, so mpi_environment ends the job rather than finalize.
inline std::atomic<bool>& out_of_step() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Prints `message` to stderr in one write and aborts every process of the job.
[[noreturn]] inline void print_and_abort(const std::string& message, int code) noexcept {
  const std::string text = message + (message.empty() || message.back() != '\n' ? "\n" : "");
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  if (mpi_is_active()) {
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::_Exit(code);
}

// ---- the user operations that reduce float16 and bfloat16 carried as MPI_UINT16_T
// ----------------

template <class T, reduce_op Op>
void mpi_user_reduce(void* in, void* inout, int* length, MPI_Datatype*) {
  reduce_into(static_cast<T*>(inout), static_cast<const T*>(in), static_cast<std::size_t>(*length),
              Op);
}

class mpi_user_ops {
 public:
  static mpi_user_ops& global() {
    static mpi_user_ops instance;
    return instance;
  }

  // The MPI_Op reducing `type` (float16 or bfloat16) with `op` (avg: its sum). Created on first
  // use; the MPI library must be initialized.
  MPI_Op get(dtype type, reduce_op op) {
    const std::lock_guard lock(mutex_);
    const std::size_t t = type == dtype::float16 ? 0 : 1;
    const std::size_t o = static_cast<std::size_t>(op == reduce_op::avg ? reduce_op::sum : op);
    MPI_Op& slot = ops_[t][o];
    if (slot == MPI_OP_NULL) {
      const int rc = MPI_Op_create(function(type, op), 1, &slot);
      if (rc != MPI_SUCCESS) {
        slot = MPI_OP_NULL;
        throw comm_error(comm_error_info{.kind = comm_error_kind::backend},
                         "MPI_Op_create for " + std::string(strata::to_string(type)) + " " +
                             std::string(to_string(op)) + ": " + mpi_error_string(rc));
      }
    }
    return slot;
  }

  // Frees every operation made (before MPI_Finalize).
  void free_all() noexcept {
    const std::lock_guard lock(mutex_);
    for (auto& row : ops_) {
      for (auto& op : row) {
        if (op != MPI_OP_NULL) {
          MPI_Op_free(&op);
          op = MPI_OP_NULL;
        }
      }
    }
  }

 private:
  mpi_user_ops() {
    for (auto& row : ops_) {
      for (auto& op : row) {
        op = MPI_OP_NULL;
      }
    }
  }

  template <class T>
  static MPI_User_function* function_for(reduce_op op) {
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg:
        return &mpi_user_reduce<T, reduce_op::sum>;
      case reduce_op::min:
        return &mpi_user_reduce<T, reduce_op::min>;
      case reduce_op::max:
        return &mpi_user_reduce<T, reduce_op::max>;
      case reduce_op::prod:
        return &mpi_user_reduce<T, reduce_op::prod>;
    }
    return &mpi_user_reduce<T, reduce_op::sum>;
  }
  static MPI_User_function* function(dtype type, reduce_op op) {
    return type == dtype::float16 ? function_for<float16>(op) : function_for<bfloat16>(op);
  }

  std::mutex mutex_;
  MPI_Op ops_[2][5];
};

}  // namespace detail

// The MPI_Op that reduces `type` with `op` (avg is carried by the sum): a predefined operation
// when mpi_reduces_natively(type), else one of strata's user operations.
inline MPI_Op mpi_reduce_op(dtype type, reduce_op op) {
  if (!mpi_reduces_natively(type)) {
    return detail::mpi_user_ops::global().get(type, op);
  }
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return MPI_SUM;
    case reduce_op::min:
      return MPI_MIN;
    case reduce_op::max:
      return MPI_MAX;
    case reduce_op::prod:
      return MPI_PROD;
  }
  throw error("mpi_reduce_op: invalid reduce_op value " +
              std::to_string(static_cast<unsigned>(op)));
}

// ---- the environment ---------------------------------------------------------------------------

// MPI for the lifetime of one object: MPI_Init_thread in the constructor, MPI_Finalize in the
// destructor. One per process, created before any communicator and destroyed after the last.
// When an exception leaves its scope (the destructor runs during stack unwinding), the rank
// prints the last comm error and calls MPI_Abort instead of MPI_Finalize, so that no other rank
// waits for it. Where MPI was initialized already, it checks the thread level and leaves
// finalization to whoever initialized it.
class mpi_environment {
 public:
  // The exit status of a job that strata aborts (a deadline passed, an exception left
  // mpi_environment).
  static constexpr int abort_code = 3;

  mpi_environment(int& argc, char**& argv, mpi_environment_config config = {})
      : mpi_environment(&argc, &argv, config) {}
  explicit mpi_environment(mpi_environment_config config = {})
      : mpi_environment(nullptr, nullptr, config) {}

  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;

  ~mpi_environment() {
    if (!detail::mpi_is_active()) {
      return;
    }
    if (std::uncaught_exceptions() > exceptions_at_start_) {
      const std::string last = detail::last_error();
      abort("strata: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
            ": an exception is leaving strata::comm::mpi_environment" +
            (last.empty() ? std::string() : "; the last error on this rank: " + last) +
            "\nstrata: calling MPI_Abort so that no other rank waits for this one");
    }
    if (detail::out_of_step().load()) {
      // The program caught a backend error and ended normally; MPI_Finalize could wait forever
      // for ranks still inside the failed operation's sequence.
      abort("strata: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
            ": MPI failed an operation of this rank, which leaves its communicator unusable; " +
            "the last error on this rank: " + detail::last_error() +
            "\nstrata: calling MPI_Abort so that no other rank waits for this one");
    }
    if (owns_) {
      detail::mpi_user_ops::global().free_all();
      MPI_Finalize();
    }
  }

  int world_rank() const noexcept { return rank_; }
  int world_size() const noexcept { return size_; }
  // What MPI_Init_thread provided (at least the level asked for).
  mpi_thread_level provided() const noexcept { return provided_; }
  const mpi_environment_config& config() const noexcept { return config_; }

  // Prints `message` to stderr and ends every process of the job with `code`.
  [[noreturn]] static void abort(const std::string& message, int code = abort_code) noexcept {
    detail::print_and_abort(message, code);
  }

 private:
  mpi_environment(int* argc, char*** argv, mpi_environment_config config)
      : config_(config), exceptions_at_start_(std::uncaught_exceptions()) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized != 0) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(argc, argv, detail::to_mpi(config.thread_level), &provided);
      if (rc != MPI_SUCCESS) {
        throw comm_error(comm_error_info{.kind = comm_error_kind::backend},
                         "MPI_Init_thread failed: " + detail::mpi_error_string(rc));
      }
      owns_ = true;
    }
    if (owns_) {
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    provided_ = detail::from_mpi_thread_level(provided);
    if (provided < detail::to_mpi(config.thread_level)) {
      if (owns_) {
        MPI_Finalize();
      }
      throw comm_error(
          comm_error_info{.kind = comm_error_kind::backend, .rank = rank_},
          "the MPI library provides thread level '" + std::string(to_string(provided_)) +
              "' but strata asked for '" + std::string(to_string(config.thread_level)) +
              "' (mpi_environment_config.thread_level); use an MPI built with thread support "
              "or ask for less");
    }
  }

  mpi_environment_config config_{};
  int exceptions_at_start_ = 0;
  bool owns_ = false;
  int rank_ = -1;
  int size_ = 0;
  mpi_thread_level provided_ = mpi_thread_level::single;
};

// ---- the communicator --------------------------------------------------------------------------

namespace detail {

struct mpi_pending;

// Everything one communicator owns; shared with its requests, which may outlive the handle.
struct mpi_state {
  MPI_Comm data = MPI_COMM_NULL;   // the operations, and mismatch reports
  MPI_Comm check = MPI_COMM_NULL;  // fingerprint words
  int rank = -1;
  int size = 0;
  comm_config config{};
  op_history history;
  std::vector<int> world_ranks{};  // world rank of each rank of this communicator
  std::uint64_t sequence = 0;      // collectives issued
  std::uint64_t p2p_sequence = 0;  // sends and receives issued
  // Collectives issued and not yet posted on `data`, oldest first.
  std::deque<std::shared_ptr<mpi_pending>> queue{};

  explicit mpi_state(const comm_config& c) : config(c), history(c.history_length) {}
  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;
  ~mpi_state() {
    if (mpi_is_active()) {
      if (check != MPI_COMM_NULL) {
        MPI_Comm_free(&check);
      }
      if (data != MPI_COMM_NULL) {
        MPI_Comm_free(&data);
      }
    }
  }

  std::string describe_ranks() const {
    return "communicator of " + std::to_string(size) + " rank(s), world ranks " +
           strata::detail::join_ranks(world_ranks);
  }
};

enum class mpi_phase : std::uint8_t {
  queued,     // waiting for its fingerprint check and for the operations issued before it
  posted,     // the MPI operation runs
  reporting,  // the fingerprints disagreed; the signatures are being gathered
  done,
  failed,
};

// One operation in flight.
struct mpi_pending {
  std::shared_ptr<mpi_state> owner{};
  op_signature signature{};
  int peer = -1;
  int tag = -1;
  std::size_t slot = 0;
  deadline until = deadline::never();

  const void* send = nullptr;
  void* recv = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op reduction = MPI_OP_NULL;
  bool in_place = false;
  std::vector<std::byte> scratch_send{};  // wrong_count fault: this rank's enlarged buffers
  std::vector<std::byte> scratch_recv{};

  mpi_phase phase = mpi_phase::queued;
  bool blocking = false;       // a blocking call: posted as the blocking MPI function (see post)
  bool checked = false;        // a fingerprint check is in flight on `check`
  bool fingerprinted = false;  // the ranks compared fingerprints before it was posted
  fingerprint_words words_out{};
  fingerprint_words words_in{};
  MPI_Request check_request = MPI_REQUEST_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<op_signature> signatures{};
  std::exception_ptr failure{};

  comm_error_info info(comm_error_kind kind) const {
    return comm_error_info{.kind = kind,
                           .op = std::string(to_string(signature.op)),
                           .sequence = signature.sequence,
                           .rank = owner->rank};
  }

  std::string describe() const {
    std::string out = comm::to_string(signature);
    if (peer >= 0) {
      out += " peer " + std::to_string(peer) + " tag " + std::to_string(tag);
    }
    return out;
  }

  void fail(comm_error_kind kind, const std::string& message) {
    phase = mpi_phase::failed;
    owner->history.finish(slot, op_status::failed);
    const comm_error e(info(kind), message);
    record_error(e.what());
    failure = std::make_exception_ptr(e);
  }

  void fail_mpi(int code, const std::string& call) {
    out_of_step().store(true);
    std::string unchecked;
    if (!fingerprinted && signature.op != op_kind::send && signature.op != op_kind::recv) {
      unchecked =
          "; this collective was not fingerprinted (comm_config.fingerprint = " +
          std::string(owner->config.fingerprint == fingerprint_mode::off ? "off" : "sampled") +
          "), so the ranks may have called different collectives: fingerprint = always "
          "checks every one before data moves";
    }
    fail(comm_error_kind::backend, call + " failed: " + mpi_error_string(code) + " (" + describe() +
                                       "; " + owner->describe_ranks() + ")" + unchecked);
  }

  // Past the deadline: print the error with this rank's history and end the job.
  [[noreturn]] void timeout() const noexcept {
    std::string waiting;
    switch (phase) {
      case mpi_phase::queued:
        waiting = checked ? "the fingerprint check, which every rank of the communicator must reach"
                          : "the operations issued before it on this communicator";
        break;
      case mpi_phase::reporting:
        waiting = "the signature exchange of a mismatch report";
        break;
      default:
        waiting = peer >= 0
                      ? "peer " + std::to_string(peer) + " (world rank " +
                            std::to_string(owner->world_ranks[static_cast<std::size_t>(peer)]) + ")"
                      : "the other ranks of the communicator";
        break;
    }
    comm_error_info i = info(comm_error_kind::timeout);
    if (peer >= 0) {
      i.missing = {peer};
    }
    std::string unchecked;
    if (!fingerprinted && signature.op != op_kind::send && signature.op != op_kind::recv) {
      unchecked =
          "; it was not fingerprinted (comm_config.fingerprint = " +
          std::string(owner->config.fingerprint == fingerprint_mode::off ? "off" : "sampled") +
          "), so the ranks may have called different collectives";
    }
    const comm_error e(i, describe() + " did not complete within comm_config.timeout = " +
                              seconds_text(owner->config.timeout) + " s, waiting for " + waiting +
                              "; " + owner->describe_ranks() + unchecked);
    record_error(e.what());
    print_and_abort("strata: " + std::string(e.what()) + "\nstrata: the last operations of rank " +
                        std::to_string(owner->rank) + " (oldest first):\n" +
                        owner->history.to_string() +
                        "strata: calling MPI_Abort so that no rank waits forever",
                    mpi_environment::abort_code);
  }
};

inline int mpi_count(std::size_t n) {
  return static_cast<int>(n);
}

// Keeps blocking MPI calls inside their deadline. A blocking call (MPI_Allreduce, ...) cannot be
// polled, so while one runs this thread watches its deadline; past it, it prints the call's
// timeout error (op, sequence, ranks, history) and aborts the job, exactly as a polled wait
// would. One per process, started at the first blocking call.
class mpi_watchdog {
 public:
  static mpi_watchdog& instance() {
    static mpi_watchdog watchdog;
    return watchdog;
  }

  mpi_watchdog(const mpi_watchdog&) = delete;
  mpi_watchdog& operator=(const mpi_watchdog&) = delete;
  ~mpi_watchdog() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  // Arming and disarming are an atomic store each and wake nobody: the watchdog looks every
  // `poll` (deadlines are seconds), so a blocking call costs no lock and no system call for its
  // deadline.
  void arm(const mpi_pending* p) {
    if (!started_.load(std::memory_order_acquire)) {
      start();
    }
    watched_.store(p, std::memory_order_release);
  }

  // After disarm() returns, the watchdog no longer looks at the call it watched: either it sees
  // the null store, or disarm sees it looking and waits (both sides are sequentially consistent).
  void disarm() noexcept {
    watched_.store(nullptr, std::memory_order_seq_cst);
    while (looking_.load(std::memory_order_seq_cst)) {
      std::this_thread::yield();
    }
  }

 private:
  static constexpr std::chrono::milliseconds poll{50};

  mpi_watchdog() = default;
  void start() {
    const std::lock_guard lock(mutex_);
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
    }
    started_.store(true, std::memory_order_release);
  }
  void loop();

  std::mutex mutex_;  // stop_ and the thread's start
  std::condition_variable wake_;
  std::atomic<const mpi_pending*> watched_{nullptr};
  std::atomic<bool> looking_{false};
  std::atomic<bool> started_{false};
  bool stop_ = false;
  std::thread thread_;
};

// Arms the watchdog for one blocking call.
class mpi_watch {
 public:
  explicit mpi_watch(const mpi_pending& p) { mpi_watchdog::instance().arm(&p); }
  ~mpi_watch() { mpi_watchdog::instance().disarm(); }
  mpi_watch(const mpi_watch&) = delete;
  mpi_watch& operator=(const mpi_watch&) = delete;
};

inline void mpi_watchdog::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, poll);
    if (stop_) {
      break;
    }
    // While `looking_` is set, the watched call stays alive: its disarm waits for it.
    looking_.store(true, std::memory_order_seq_cst);
    const mpi_pending* p = watched_.load(std::memory_order_seq_cst);
    if (p != nullptr && p->until.expired()) {
      p->timeout();  // prints and aborts the job; does not return
    }
    looking_.store(false, std::memory_order_seq_cst);
  }
}

// The blocking form of the data operation of `p`; MPI_ERR_PENDING when there is none.
inline int post_blocking(mpi_pending& p, const void* send, int n, const char*& call) {
  mpi_state& s = *p.owner;
  const mpi_watch watch(p);
  switch (p.signature.op) {
    case op_kind::all_reduce:
      call = "MPI_Allreduce";
      return MPI_Allreduce(send, p.recv, n, p.type, p.reduction, s.data);
    case op_kind::reduce_scatter:
      call = "MPI_Reduce_scatter_block";
      return MPI_Reduce_scatter_block(send, p.in_place ? const_cast<void*>(p.send) : p.recv, n,
                                      p.type, p.reduction, s.data);
    case op_kind::all_gather:
      call = "MPI_Allgather";
      return MPI_Allgather(send, n, p.type, p.recv, n, p.type, s.data);
    case op_kind::broadcast:
      call = "MPI_Bcast";
      return MPI_Bcast(p.recv, n, p.type, p.signature.root, s.data);
    case op_kind::reduce:
      call = "MPI_Reduce";
      return MPI_Reduce(send, p.recv, n, p.type, p.reduction, p.signature.root, s.data);
    case op_kind::all_to_all:
      call = "MPI_Alltoall";
      return MPI_Alltoall(send, n, p.type, p.recv, n, p.type, s.data);
    case op_kind::barrier:
      call = "MPI_Barrier";
      return MPI_Barrier(s.data);
    default:
      return MPI_ERR_PENDING;
  }
}

// Posts the data operation of `p` on its communicator.
inline void post(mpi_pending& p) {
  mpi_state& s = *p.owner;
  const int n = mpi_count(p.signature.count);
  const void* send = p.in_place ? MPI_IN_PLACE : p.send;
  int rc = MPI_SUCCESS;
  const char* call = "";
  if (p.blocking) {
    // Blocking calls use MPI's blocking collectives, which Open MPI implements faster than the
    // non-blocking ones; the watchdog keeps the deadline (and, should it pass, says the call
    // waits for the other ranks: the phase is `posted` while MPI runs it).
    p.phase = mpi_phase::posted;
    rc = post_blocking(p, send, n, call);
    if (rc != MPI_ERR_PENDING) {
      p.request = MPI_REQUEST_NULL;
      if (rc != MPI_SUCCESS) {
        p.fail_mpi(rc, call);
        return;
      }
      p.phase = mpi_phase::posted;
      return;
    }
    rc = MPI_SUCCESS;
  }
  switch (p.signature.op) {
    case op_kind::all_reduce:
      call = "MPI_Iallreduce";
      rc = MPI_Iallreduce(send, p.recv, n, p.type, p.reduction, s.data, &p.request);
      break;
    case op_kind::reduce_scatter:
      call = "MPI_Ireduce_scatter_block";
      rc = MPI_Ireduce_scatter_block(send, p.in_place ? const_cast<void*>(p.send) : p.recv, n,
                                     p.type, p.reduction, s.data, &p.request);
      break;
    case op_kind::all_gather:
      call = "MPI_Iallgather";
      rc = MPI_Iallgather(send, n, p.type, p.recv, n, p.type, s.data, &p.request);
      break;
    case op_kind::broadcast:
      call = "MPI_Ibcast";
      rc = MPI_Ibcast(p.recv, n, p.type, p.signature.root, s.data, &p.request);
      break;
    case op_kind::reduce:
      call = "MPI_Ireduce";
      rc = MPI_Ireduce(send, p.recv, n, p.type, p.reduction, p.signature.root, s.data, &p.request);
      break;
    case op_kind::all_to_all:
      call = "MPI_Ialltoall";
      rc = MPI_Ialltoall(send, n, p.type, p.recv, n, p.type, s.data, &p.request);
      break;
    case op_kind::barrier:
      call = "MPI_Ibarrier";
      rc = MPI_Ibarrier(s.data, &p.request);
      break;
    case op_kind::split:
      // split calls MPI_Comm_split itself once this operation is at the front and checked.
      p.request = MPI_REQUEST_NULL;
      break;
    case op_kind::send:
    case op_kind::recv:
      break;
  }
  if (rc != MPI_SUCCESS) {
    p.fail_mpi(rc, call);
    return;
  }
  p.phase = mpi_phase::posted;
}

// Moves the queue of `s` forward: posts, in issue order, every collective whose check is done.
inline void advance(mpi_state& s) {
  while (!s.queue.empty()) {
    mpi_pending& p = *s.queue.front();
    if (p.checked) {
      int done = 0;
      const int rc = MPI_Test(&p.check_request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        p.fail_mpi(rc, "MPI_Iallreduce (fingerprint check)");
        s.queue.pop_front();
        continue;
      }
      if (done == 0) {
        return;
      }
      p.checked = false;
      if (!fingerprints_agree(p.words_in)) {
        // Every rank sees the same words, so every rank gathers here, in this place of `data`.
        p.signatures.assign(static_cast<std::size_t>(s.size), op_signature{});
        const int grc =
            MPI_Iallgather(&p.signature, sizeof(op_signature), MPI_BYTE, p.signatures.data(),
                           sizeof(op_signature), MPI_BYTE, s.data, &p.request);
        if (grc != MPI_SUCCESS) {
          p.fail_mpi(grc, "MPI_Iallgather (mismatch report)");
        } else {
          p.phase = mpi_phase::reporting;
        }
        s.queue.pop_front();
        continue;
      }
    }
    post(p);
    s.queue.pop_front();
  }
}

// Completes `p` if its MPI operation is done; true when it is done or failed.
inline bool complete(mpi_pending& p) {
  mpi_state& s = *p.owner;
  if (p.phase == mpi_phase::queued) {
    return false;
  }
  if (p.phase == mpi_phase::done || p.phase == mpi_phase::failed) {
    return true;
  }
  int done = 0;
  MPI_Status status{};
  // A blocking call has finished when it is posted: nothing to ask MPI.
  const int rc = p.request == MPI_REQUEST_NULL ? (done = 1, MPI_SUCCESS)
                                               : MPI_Test(&p.request, &done, &status);
  if (rc != MPI_SUCCESS) {
    int error_class = 0;
    MPI_Error_class(rc, &error_class);
    if (p.signature.op == op_kind::recv && error_class == MPI_ERR_TRUNCATE) {
      p.fail(comm_error_kind::mismatch, "peer " + std::to_string(p.peer) + " sent more than the " +
                                            std::to_string(p.signature.count) + " element(s) of " +
                                            std::string(strata::to_string(p.signature.type)) +
                                            " this rank receives (tag " + std::to_string(p.tag) +
                                            ")");
    } else {
      p.fail_mpi(rc, "MPI_Test");
    }
    return true;
  }
  if (done == 0) {
    return false;
  }
  if (p.phase == mpi_phase::reporting) {
    p.fail(comm_error_kind::mismatch,
           "the ranks called different collectives (fingerprints differ; no data moved): " +
               describe_mismatch(p.signatures));
    return true;
  }
  const std::size_t count = p.signature.count;
  const bool scratch = !p.scratch_recv.empty() || !p.scratch_send.empty();
  switch (p.signature.op) {
    case op_kind::recv: {
      int received = 0;
      MPI_Get_count(&status, p.type, &received);
      if (static_cast<std::size_t>(received) != count) {
        p.fail(comm_error_kind::mismatch,
               "received " + std::to_string(received) + " element(s) of " +
                   std::string(strata::to_string(p.signature.type)) + " from peer " +
                   std::to_string(p.peer) + " (tag " + std::to_string(p.tag) + "), expected " +
                   std::to_string(count));
        return true;
      }
      break;
    }
    case op_kind::reduce_scatter:
      if (p.in_place && s.rank != 0 && count != 0) {
        // MPI's in-place form leaves the result at the start of the buffer.
        const std::size_t bytes = count * size_of(p.signature.type);
        std::memmove(p.recv, p.send, bytes);
      }
      [[fallthrough]];
    case op_kind::all_reduce:
    case op_kind::reduce:
      if (p.signature.reduction == reduce_op::avg && !scratch && p.recv != nullptr &&
          (p.signature.op != op_kind::reduce || s.rank == p.signature.root)) {
        finish_avg(p.recv, count, p.signature.type, static_cast<std::size_t>(s.size));
      }
      break;
    default:
      break;
  }
  p.phase = mpi_phase::done;
  s.history.finish(p.slot, op_status::completed);
  return true;
}

}  // namespace detail

// A communicator over MPI: one rank's handle on a group of processes. Move-only; the MPI
// communicators are freed when the last of the handle and its requests goes away.
class mpi {
 public:
  using policy_category = comm_backend_tag;
  // Open MPI's non-blocking collectives advance only inside MPI calls of this rank and run
  // slower algorithms than its blocking ones (an 8 MiB float all-reduce over 2 local ranks:
  // 2.6 ms for MPI_Iallreduce + MPI_Wait against 1.1 ms for MPI_Allreduce), so a gradient bucket
  // is best reduced by a blocking call when it is ready (bucket_launch = auto).
  static constexpr bool nonblocking_progresses = false;

  // The handle of a non-blocking operation. Move-only; a default one is complete. test() and
  // wait() throw the operation's comm_error (once); past the deadline they end the job (see
  // above). Destroying a running request waits for it; if the operation fails there, the error
  // is printed and the job ends, unless another exception is already propagating.
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        finish_quietly();
        pending_ = std::move(other.pending_);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { finish_quietly(); }

    // True when the operation is complete (it then no longer refers to any buffer).
    bool test() {
      if (!pending_) {
        return true;
      }
      detail::mpi_pending& p = *pending_;
      detail::mpi_state& s = *p.owner;
      detail::advance(s);
      if (detail::complete(p)) {
        return settle();
      }
      if (p.until.expired()) {
        p.timeout();
      }
      if (!s.queue.empty() && s.queue.front()->until.expired()) {
        s.queue.front()->timeout();
      }
      return false;
    }

    void wait() {
      detail::poll_backoff backoff;
      const detail::mpi_pending* p = pending_.get();
      detail::mpi_phase phase = p != nullptr ? p->phase : detail::mpi_phase::done;
      while (!test()) {
        if (p->phase != phase) {
          phase = p->phase;
          backoff.restart();
        } else {
          backoff.pause();
        }
      }
    }

   private:
    friend class mpi;
    explicit request(std::shared_ptr<detail::mpi_pending> pending) : pending_(std::move(pending)) {}

    bool settle() {
      const auto p = std::move(pending_);
      if (p->phase == detail::mpi_phase::failed) {
        std::rethrow_exception(p->failure);
      }
      return true;
    }

    void finish_quietly() noexcept {
      if (!pending_) {
        return;
      }
      try {
        wait();
      } catch (const std::exception& e) {
        if (std::uncaught_exceptions() > 0) {
          return;  // dropped while another error propagates: that one is reported
        }
        detail::print_and_abort(
            "strata: rank " + std::to_string(detail::mpi_world_rank()) +
                ": a request destroyed before it was waited on failed: " + e.what() +
                "\nstrata: calling MPI_Abort so that no rank waits forever",
            mpi_environment::abort_code);
      }
    }

    std::shared_ptr<detail::mpi_pending> pending_{};
  };
  using request_type = request;

  // A communicator over every process of the job (a duplicate of MPI_COMM_WORLD, so strata's
  // messages never meet the program's own). Collective over the job; needs an mpi_environment.
  static mpi world(const comm_config& options = {}) {
    if (!detail::mpi_is_active()) {
      throw error(
          "strata::comm::mpi::world: MPI is not initialized (create a "
          "strata::comm::mpi_environment first) or already finalized");
    }
    return mpi(MPI_COMM_WORLD, options, /*duplicate=*/true);
  }

  mpi(mpi&&) noexcept = default;
  mpi& operator=(mpi&&) noexcept = default;
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() = default;

  int rank() const noexcept { return state_ ? state_->rank : -1; }
  int size() const noexcept { return state_ ? state_->size : 0; }
  const comm_config& config() const noexcept {
    static const comm_config none{};
    return state_ ? state_->config : none;
  }
  // How many of the job's ranks run on the CPUs this process may use (comm::ranks_sharing_cpus):
  // 1 when the launcher bound the process to part of the machine (mpiexec binds each rank to
  // its cores unless oversubscribed or told --bind-to none), else the ranks on this node as the
  // launcher tells them (Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE; MPICH's Hydra: MPI_LOCALNRANKS),
  // or 1 when it does not. No communication.
  int ranks_sharing_cpus() const noexcept { return cpus_bound() ? 1 : ranks_sharing_memory(); }
  // How many of the job's ranks run on this node, sharing its memory
  // (comm::ranks_sharing_memory): what the launcher tells them (Open MPI:
  // OMPI_COMM_WORLD_LOCAL_SIZE; MPICH's Hydra: MPI_LOCALNRANKS), or 1 when it does not.
  int ranks_sharing_memory() const noexcept {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      if (const char* text = std::getenv(name)) {
        const int n = std::atoi(text);
        if (n >= 1) {
          return n;
        }
      }
    }
    return 1;
  }

  // The MPI communicator the operations run on, for interoperation (do not free it).
  MPI_Comm native_handle() const noexcept { return state_ ? state_->data : MPI_COMM_NULL; }
  // This rank's recent operations, oldest first (what a comm error prints).
  std::string history() const { return state_ ? state_->history.to_string() : std::string(); }

  // ---- collectives -----------------------------------------------------------------------------

  request all_reduce_async(const void* send, void* recv, std::size_t count, dtype type,
                           reduce_op op) {
    return collective({.kind = op_kind::all_reduce,
                       .send = send,
                       .recv = recv,
                       .count = count,
                       .type = type,
                       .op = op,
                       .reduces = true,
                       .in_place = send == recv,
                       .send_slices = 1,
                       .recv_slices = 1});
  }
  request reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, dtype type,
                               reduce_op op) {
    const std::size_t offset = static_cast<std::size_t>(rank()) * recv_count * size_of(type);
    return collective(
        {.kind = op_kind::reduce_scatter,
         .send = send,
         .recv = recv,
         .count = recv_count,
         .type = type,
         .op = op,
         .reduces = true,
         .in_place = send != nullptr && static_cast<const std::byte*>(send) + offset == recv,
         .send_slices = size_of_comm(),
         .recv_slices = 1});
  }
  request all_gather_async(const void* send, void* recv, std::size_t send_count, dtype type) {
    const std::size_t offset = static_cast<std::size_t>(rank()) * send_count * size_of(type);
    return collective(
        {.kind = op_kind::all_gather,
         .send = send,
         .recv = recv,
         .count = send_count,
         .type = type,
         .in_place = recv != nullptr && static_cast<const std::byte*>(recv) + offset == send,
         .send_slices = 1,
         .recv_slices = size_of_comm()});
  }
  request broadcast_async(void* buffer, std::size_t count, dtype type, int root) {
    return collective({.kind = op_kind::broadcast,
                       .send = buffer,
                       .recv = buffer,
                       .count = count,
                       .type = type,
                       .root = root,
                       .send_slices = 0,
                       .recv_slices = 1});
  }
  request reduce_async(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                       int root) {
    return collective({.kind = op_kind::reduce,
                       .send = send,
                       .recv = recv,
                       .count = count,
                       .type = type,
                       .op = op,
                       .root = root,
                       .reduces = true,
                       .in_place = rank() == root && send == recv,
                       .send_slices = 1,
                       .recv_slices = rank() == root ? 1u : 0u});
  }
  request all_to_all_async(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    return collective({.kind = op_kind::all_to_all,
                       .send = send,
                       .recv = recv,
                       .count = count_per_rank,
                       .type = type,
                       .in_place = send == recv,
                       .send_slices = size_of_comm(),
                       .recv_slices = size_of_comm()});
  }
  request barrier_async() {
    return collective({.kind = op_kind::barrier, .send_slices = 0, .recv_slices = 0});
  }

  // Blocking collectives run as MPI's blocking functions once their turn and their fingerprint
  // check have come (see post): same ordering, checks and deadline as the async forms.
  void all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op) {
    blocking([&] { return all_reduce_async(send, recv, count, type, op); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, dtype type,
                      reduce_op op) {
    blocking([&] { return reduce_scatter_async(send, recv, recv_count, type, op); });
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, dtype type) {
    blocking([&] { return all_gather_async(send, recv, send_count, type); });
  }
  void broadcast(void* buffer, std::size_t count, dtype type, int root) {
    blocking([&] { return broadcast_async(buffer, count, type, root); });
  }
  void reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op, int root) {
    blocking([&] { return reduce_async(send, recv, count, type, op, root); });
  }
  void all_to_all(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    blocking([&] { return all_to_all_async(send, recv, count_per_rank, type); });
  }
  void barrier() {
    blocking([&] { return barrier_async(); });
  }

  // ---- point to point --------------------------------------------------------------------------

  request send_async(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return point_to_point(op_kind::send, const_cast<void*>(buffer), count, type, peer, tag);
  }
  request recv_async(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return point_to_point(op_kind::recv, buffer, count, type, peer, tag);
  }
  void send(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    send_async(buffer, count, type, peer, tag).wait();
  }
  void recv(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    recv_async(buffer, count, type, peer, tag).wait();
  }

  // ---- split -----------------------------------------------------------------------------------

  // The ranks that pass the same color (>= 0), ordered by (key, rank). Collective; always
  // fingerprinted, so that every rank is known to have arrived before MPI_Comm_split (which has
  // no deadline) runs. The new communicator keeps this one's config.
  mpi split(int color, int key) {
    detail::mpi_state& s = state();
    if (color < 0) {
      invalid(op_kind::split, "color " + std::to_string(color) + " is negative");
    }
    auto pending = issue({.kind = op_kind::split, .send_slices = 0, .recv_slices = 0},
                         /*always_check=*/true);
    request(pending).wait();
    MPI_Comm out = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(s.data, color, key, &out);
    if (rc != MPI_SUCCESS) {
      fail_now(*pending, rc, "MPI_Comm_split");
    }
    return mpi(out, s.config, /*duplicate=*/false);
  }

 private:
  struct call {
    op_kind kind = op_kind::barrier;
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t count = 0;
    dtype type = dtype::uint8;
    reduce_op op = reduce_op::sum;
    int root = -1;
    bool reduces = false;
    bool in_place = false;
    std::size_t send_slices = 1;  // buffer sizes in units of count
    std::size_t recv_slices = 1;
  };

  // Takes `comm` (split) or a duplicate of it (world), and makes the fingerprint communicator.
  mpi(MPI_Comm comm, const comm_config& config, bool duplicate)
      : state_(std::make_shared<detail::mpi_state>(config)) {
    detail::mpi_state& s = *state_;
    const deadline until = deadline::after(config.timeout);
    const auto wait_for = [&](MPI_Request& r, const char* what) {
      detail::poll_backoff backoff;
      for (;;) {
        int done = 0;
        const int rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          throw comm_error(comm_error_info{.kind = comm_error_kind::backend,
                                           .op = duplicate ? "world" : "split",
                                           .rank = detail::mpi_world_rank()},
                           std::string(what) + " failed: " + detail::mpi_error_string(rc));
        }
        if (done != 0) {
          return;
        }
        if (until.expired()) {
          const comm_error e(comm_error_info{.kind = comm_error_kind::timeout,
                                             .op = duplicate ? "world" : "split",
                                             .rank = detail::mpi_world_rank()},
                             std::string(what) + " did not complete within comm_config.timeout = " +
                                 detail::seconds_text(config.timeout) +
                                 " s: not every process of the communicator is creating it");
          detail::record_error(e.what());
          detail::print_and_abort("strata: " + std::string(e.what()) +
                                      "\nstrata: calling MPI_Abort so that no rank waits forever",
                                  mpi_environment::abort_code);
        }
        backoff.pause();
      }
    };
    const auto check = [&](int rc, const char* what) {
      if (rc != MPI_SUCCESS) {
        throw comm_error(comm_error_info{.kind = comm_error_kind::backend,
                                         .op = duplicate ? "world" : "split",
                                         .rank = detail::mpi_world_rank()},
                         std::string(what) + " failed: " + detail::mpi_error_string(rc));
      }
    };
    if (duplicate) {
      MPI_Request r = MPI_REQUEST_NULL;
      check(MPI_Comm_idup(comm, &s.data, &r), "MPI_Comm_idup");
      wait_for(r, "MPI_Comm_idup");
    } else {
      s.data = comm;
    }
    check(MPI_Comm_set_errhandler(s.data, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Comm_idup(s.data, &s.check, &r), "MPI_Comm_idup");
    wait_for(r, "MPI_Comm_idup");
    check(MPI_Comm_set_errhandler(s.check, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(s.data, &s.rank);
    MPI_Comm_size(s.data, &s.size);
    // World ranks of the members, for messages.
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Comm_group(s.data, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> local(static_cast<std::size_t>(s.size));
    for (int i = 0; i < s.size; ++i) {
      local[static_cast<std::size_t>(i)] = i;
    }
    s.world_ranks.assign(static_cast<std::size_t>(s.size), -1);
    MPI_Group_translate_ranks(group, s.size, local.data(), world_group, s.world_ranks.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }

  detail::mpi_state& state() const {
    if (!state_) {
      throw error("strata::comm::mpi: use of a moved-from communicator");
    }
    return *state_;
  }

  std::size_t size_of_comm() const noexcept { return static_cast<std::size_t>(size()); }

  [[noreturn]] void invalid(op_kind op, const std::string& why) const {
    const comm_error e(comm_error_info{.kind = comm_error_kind::invalid_argument,
                                       .op = std::string(to_string(op)),
                                       .rank = rank()},
                       why);
    detail::record_error(e.what());
    throw e;
  }

  [[noreturn]] static void fail_now(detail::mpi_pending& p, int code, const std::string& call) {
    p.fail_mpi(code, call);
    std::rethrow_exception(p.failure);
  }

  // Checks what this rank alone can check. Returns the fault planned for the operation, if any,
  // after acting on kill, throw and hang.
  static std::size_t act_on_fault(const detail::mpi_state& s, op_kind op, std::uint64_t sequence) {
    const auto fault = fault_injector::global().at(s.rank, op, sequence);
    if (!fault) {
      return 0;
    }
    switch (*fault) {
      case fault_action::kill:
        std::raise(SIGKILL);
        std::_Exit(137);
      case fault_action::throw_error: {
        const std::string what = "strata::comm::mpi: injected fault 'throw' on rank " +
                                 std::to_string(s.rank) + " in " + std::string(to_string(op)) +
                                 " #" + std::to_string(sequence);
        detail::record_error(what);
        throw error(what);
      }
      case fault_action::hang: {
        // Stops answering: the peers' deadlines pass and end the job. A rank with nobody to
        // notice (alone in its communicator) ends it itself after twice the deadline.
        const deadline until = deadline::after(2.0 * s.config.timeout);
        while (!until.expired()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        detail::print_and_abort("strata: rank " + std::to_string(s.rank) +
                                    ": injected fault 'hang' in " + std::string(to_string(op)) +
                                    " #" + std::to_string(sequence) +
                                    " and no other rank ended the job within twice "
                                    "comm_config.timeout; calling MPI_Abort",
                                mpi_environment::abort_code);
      }
      case fault_action::wrong_count:
        return 1;
    }
    return 0;
  }

  void validate(const call& c) const {
    const detail::mpi_state& s = state();
    if (strata::to_string(c.type) == "unknown") {
      invalid(c.kind, "invalid dtype value " + std::to_string(static_cast<unsigned>(c.type)));
    }
    if (c.count > static_cast<std::size_t>(std::numeric_limits<int>::max()) - 1) {
      invalid(c.kind, "count " + std::to_string(c.count) +
                          " is more than MPI's int count allows; split the buffer");
    }
    if ((c.kind == op_kind::broadcast || c.kind == op_kind::reduce) &&
        (c.root < 0 || c.root >= s.size)) {
      invalid(c.kind, "root " + std::to_string(c.root) +
                          " is not a rank of this communicator (size " + std::to_string(s.size) +
                          ")");
    }
    if (c.count != 0) {
      if (c.send_slices != 0 && c.send == nullptr && c.kind != op_kind::broadcast) {
        invalid(c.kind, "the send buffer is null");
      }
      if (c.recv_slices != 0 && c.recv == nullptr) {
        invalid(c.kind, "the receive buffer is null");
      }
    }
  }

  // Numbers the collective, consults the fault injector, records it and starts its check.
  std::shared_ptr<detail::mpi_pending> issue(const call& c, bool always_check = false) {
    detail::mpi_state& s = state();
    validate(c);
    const std::uint64_t sequence = s.sequence++;
    const std::size_t extra = act_on_fault(s, c.kind, sequence);

    auto p = std::make_shared<detail::mpi_pending>();
    p->owner = state_;
    p->signature = op_signature{.sequence = sequence,
                                .count = c.count + extra,
                                .root = c.root,
                                .op = c.kind,
                                .type = c.type,
                                .reduction = c.reduces ? c.op : reduce_op::sum,
                                .reduces = static_cast<std::uint8_t>(c.reduces ? 1 : 0)};
    const auto now = deadline::clock::now();
    p->until = deadline::after(s.config.timeout, now);
    p->send = c.send;
    p->recv = c.recv;
    p->in_place = c.in_place;
    if (c.kind != op_kind::barrier && c.kind != op_kind::split) {
      p->type = mpi_datatype(c.type);
      if (c.reduces) {
        p->reduction = mpi_reduce_op(c.type, c.op);
      }
    }
    if (extra != 0) {
      // This rank passes count + 1 elements, from and to buffers of its own (zeros), so that its
      // peers see a wrong count while this rank's memory stays safe.
      const std::size_t bytes = (c.count + extra) * size_of(c.type);
      p->scratch_send.assign(bytes * std::max<std::size_t>(c.send_slices, 1), std::byte{0});
      p->scratch_recv.assign(bytes * std::max<std::size_t>(c.recv_slices, 1), std::byte{0});
      p->send = p->scratch_send.data();
      p->recv = p->scratch_recv.data();
      p->in_place = false;
      if (c.kind == op_kind::broadcast) {
        p->recv = p->scratch_send.data();
      }
    }
    p->slot = s.history.start(p->signature, -1, -1, now);
    p->blocking = std::exchange(blocking_next_, false);
    if (always_check || should_fingerprint(s.config, sequence)) {
      p->words_out = fingerprint_check_words(p->signature);
      const int rc = MPI_Iallreduce(&p->words_out, &p->words_in, 2, MPI_UINT64_T, MPI_MAX, s.check,
                                    &p->check_request);
      if (rc != MPI_SUCCESS) {
        fail_now(*p, rc, "MPI_Iallreduce (fingerprint check)");
      }
      p->checked = true;
      p->fingerprinted = true;
    }
    s.queue.push_back(p);
    detail::advance(s);
    return p;
  }

  request collective(const call& c) { return request(issue(c)); }

  // Issues the operation `make` issues as a blocking one, and waits for it.
  template <class Make>
  void blocking(Make&& make) {
    blocking_next_ = true;
    request r;
    try {
      r = make();
    } catch (...) {
      blocking_next_ = false;
      throw;
    }
    blocking_next_ = false;
    r.wait();
  }

  request point_to_point(op_kind kind, void* buffer, std::size_t count, dtype type, int peer,
                         int tag) {
    detail::mpi_state& s = state();
    call c{.kind = kind,
           .send = buffer,
           .recv = buffer,
           .count = count,
           .type = type,
           .send_slices = kind == op_kind::send ? 1u : 0u,
           .recv_slices = kind == op_kind::recv ? 1u : 0u};
    validate(c);
    if (peer < 0 || peer >= s.size) {
      invalid(kind, "peer " + std::to_string(peer) + " is not a rank of this communicator (size " +
                        std::to_string(s.size) + ")");
    }
    if (tag < 0) {
      invalid(kind, "tag " + std::to_string(tag) + " is negative");
    }
    const std::uint64_t sequence = s.p2p_sequence++;
    const std::size_t extra = act_on_fault(s, kind, sequence);

    auto p = std::make_shared<detail::mpi_pending>();
    p->owner = state_;
    p->signature = op_signature{.sequence = sequence, .count = count, .op = kind, .type = type};
    p->peer = peer;
    p->tag = tag;
    p->until = deadline::after(s.config.timeout);
    p->type = mpi_datatype(type);
    void* data = buffer;
    if (extra != 0) {
      p->scratch_send.assign((count + extra) * size_of(type), std::byte{0});
      data = p->scratch_send.data();
    }
    p->slot = s.history.start(p->signature, peer, tag);
    const int n = detail::mpi_count(count + extra);
    const int rc = kind == op_kind::send
                       ? MPI_Isend(data, n, p->type, peer, tag, s.data, &p->request)
                       : MPI_Irecv(data, n, p->type, peer, tag, s.data, &p->request);
    if (rc != MPI_SUCCESS) {
      fail_now(*p, rc, kind == op_kind::send ? "MPI_Isend" : "MPI_Irecv");
    }
    p->phase = detail::mpi_phase::posted;
    return request(std::move(p));
  }

  std::shared_ptr<detail::mpi_state> state_{};
  bool blocking_next_ = false;  // the next issue() is of a blocking call
};

}  // namespace strata::comm
