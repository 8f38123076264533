// SPDX-License-Identifier: Apache-2.0
#pragma once

// All-reduce algorithms built on point-to-point messages, for any backend with send / recv over
// host buffers (threads, mpi; not nccl, whose buffers live on the device):
//
//   ring                        reduce-scatter around a ring, then all-gather around it; each
//                               rank's share is cut into chunks of config.chunk_bytes that are
//                               forwarded as soon as they are reduced (send_async / recv_async),
//                               so transfers and reductions overlap. 2 (n - 1) steps, each rank
//                               sends about 2 (n - 1) / n of the message.
//   recursive_halving_doubling  reduce-scatter by recursive halving, all-gather by recursive
//                               doubling (Rabenseifner). For n not a power of two, the first
//                               2 (n - p) ranks (p = the largest power of two <= n) fold in
//                               pairwise first: the even rank of a pair sends its data to the odd
//                               one and gets the result back at the end. 2 log2(p) rounds.
//   hierarchical                reduce-scatter inside a local group (ring), all-reduce of each
//                               rank's share across the groups (any of the flat algorithms, or
//                               native), all-gather inside the group (ring). Given a hierarchy:
//                               the two sub-communicators from split, or make_hierarchy(c, g).
//   native                      the backend's own all_reduce.
//   automatic                   see choose_all_reduce_algorithm.
//
//     std::vector<float> grads(n);
//     strata::comm::all_reduce(comm, grads, reduce_op::avg, all_reduce_algorithm::ring);
//     auto groups = strata::comm::make_hierarchy(comm, 4);            // collective, once
//     strata::comm::hierarchical_all_reduce(groups, grads, reduce_op::sum);
//
// Semantics are those of comm_backend's all_reduce: every dtype and reduce_op; in place
// (send == recv) or out of place (non-overlapping buffers); zero elements legal (the ranks still
// synchronize, through a dissemination barrier over point-to-point); the result is bit-identical on
// every rank, because each element is reduced by exactly one rank and then copied to the others.
// Reductions go through comm/reduce.hpp: avg is a sum divided once by the number of ranks
// (finish_avg). float16 and bfloat16 accumulate in float as comm_backend requires: they are
// widened to float on entry, reduced and moved as floats (twice the bytes), and rounded once on
// exit; all_reduce_config::narrow_floats = narrow_float_mode::in_type moves and reduces them in
// their own type instead (half the bytes, one rounding per step).
//
// Requirements on the backend: messages from one rank to another with one tag are received in the
// order they were sent (MPI's non-overtaking rule), and the algorithms' messages use the tags
// [config.tag, config.tag + tag_span), which other traffic on the communicator must avoid while
// an algorithm runs. On an error (a wait that throws) the outstanding requests of the algorithm
// are waited for (their errors dropped) before the first error propagates, so that no transfer
// writes into freed memory.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

enum class all_reduce_algorithm : std::uint8_t {
  native,                      // the backend's all_reduce
  ring,                        // reduce-scatter ring + all-gather ring, chunked and pipelined
  recursive_halving_doubling,  // Rabenseifner, with fold-in for non-powers of two
  hierarchical,                // inside groups, across groups, inside groups
  automatic,                   // choose_all_reduce_algorithm
};

constexpr std::string_view to_string(all_reduce_algorithm a) noexcept {
  switch (a) {
    case all_reduce_algorithm::native:
      return "native";
    case all_reduce_algorithm::ring:
      return "ring";
    case all_reduce_algorithm::recursive_halving_doubling:
      return "recursive_halving_doubling";
    case all_reduce_algorithm::hierarchical:
      return "hierarchical";
    case all_reduce_algorithm::automatic:
      return "automatic";
  }
  return "unknown";
}

// How the point-to-point algorithms reduce float16 and bfloat16.
enum class narrow_float_mode : std::uint8_t {
  widen,    // to float on entry, round once on exit (comm_backend's semantics; 2x the bytes)
  in_type,  // move and reduce the 16-bit values, rounding after every step
};

constexpr std::string_view to_string(narrow_float_mode m) noexcept {
  switch (m) {
    case narrow_float_mode::widen:
      return "widen";
    case narrow_float_mode::in_type:
      return "in_type";
  }
  return "unknown";
}

struct all_reduce_config {
  // ring: a rank's share is sent in chunks of at most this many bytes (at least one element),
  // each forwarded as soon as it is reduced.
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // automatic: messages of at most this many bytes use recursive halving/doubling, larger ones
  // the ring.
  std::size_t small_message_bytes = std::size_t{64} << 10;
  // hierarchical through all_reduce(c, ...): ranks per local group, rank r in group r / group_size.
  // 0 picks the largest divisor of size() that is at most sqrt(size()).
  int group_size = 0;
  // hierarchical: the algorithm across groups (hierarchical here means automatic).
  all_reduce_algorithm cross = all_reduce_algorithm::automatic;
  // float16 / bfloat16: accumulate in float (widen) or in their own type.
  narrow_float_mode narrow_floats = narrow_float_mode::widen;
  // The first tag of the algorithms' messages; they use [tag, tag + tag_span). Within MPI's
  // guaranteed tag range (0..32767).
  int tag = 32000;

  static constexpr int tag_span = 8;

  bool operator==(const all_reduce_config&) const = default;
};

inline std::string to_string(const all_reduce_config& c) {
  return "all_reduce_config{.chunk_bytes = " + std::to_string(c.chunk_bytes) +
         ", .small_message_bytes = " + std::to_string(c.small_message_bytes) +
         ", .group_size = " + std::to_string(c.group_size) +
         ", .cross = " + std::string(to_string(c.cross)) +
         ", .narrow_floats = " + std::string(to_string(c.narrow_floats)) +
         ", .tag = " + std::to_string(c.tag) + "}";
}

// The algorithm `automatic` runs for `count` elements of `element_bytes` bytes each (the caller's
// dtype) over `ranks` ranks, with bytes = count * element_bytes:
//   - recursive_halving_doubling when bytes <= config.small_message_bytes (default 64 KiB), or
//     when the message has fewer elements than there are ranks (`count < ranks`): small messages
//     are latency-bound, and halving/doubling needs 2 log2(n) rounds (2 more when n is not a power
//     of two) where the ring needs 2 (n - 1);
//   - ring otherwise: large messages are bandwidth-bound; the ring sends each rank's share to its
//     neighbour in pipelined chunks, and avoids the two extra whole-message transfers that the
//     fold-in of halving/doubling costs when n is not a power of two.
// With one rank there is nothing to communicate and either choice copies the data.
constexpr all_reduce_algorithm choose_all_reduce_algorithm(int ranks, std::size_t count,
                                                           std::size_t element_bytes,
                                                           const all_reduce_config& config = {}) {
  const std::size_t bytes = count * element_bytes;
  if (ranks <= 1 || bytes <= config.small_message_bytes ||
      count < static_cast<std::size_t>(ranks)) {
    return all_reduce_algorithm::recursive_halving_doubling;
  }
  return all_reduce_algorithm::ring;
}

// What the flat algorithms need: identity and point-to-point messages.
template <class C>
concept point_to_point_backend = comm_backend_identity<C> && comm_backend_point_to_point<C>;

// `count` elements cut into `parts` contiguous pieces whose sizes differ by at most one (the
// first count % parts pieces are one longer): how the ring algorithms, reduce_scatter and the
// hierarchical stages cut a buffer over ranks.
struct even_partition {
  std::size_t count = 0;
  int parts = 1;

  std::size_t offset(int j) const noexcept {
    const auto p = static_cast<std::size_t>(parts);
    const auto u = static_cast<std::size_t>(j);
    return u * (count / p) + std::min(u, count % p);
  }
  std::size_t length(int j) const noexcept { return offset(j + 1) - offset(j); }
};

// The group size hierarchical_all_reduce takes when none is configured: the largest divisor of
// `ranks` not above its square root (4 -> 2, 6 -> 2, 9 -> 3, a prime -> 1).
inline int default_group_size(int ranks) noexcept {
  int best = 1;
  for (int g = 1; g * g <= ranks; ++g) {
    if (ranks % g == 0) {
      best = g;
    }
  }
  return best;
}

namespace detail {

// The tags of the algorithms' phases, as offsets from all_reduce_config::tag.
enum class algorithm_tag : int {
  ring_reduce_scatter = 0,
  ring_all_gather = 1,
  fold = 2,
  halving = 3,
  doubling = 4,
  broadcast = 5,
  barrier = 6,
};

inline int tag_of(const all_reduce_config& config, algorithm_tag t) noexcept {
  return config.tag + static_cast<int>(t);
}

inline int ring_index(int a, int n) noexcept {
  const int m = a % n;
  return m < 0 ? m + n : m;
}

// Requests of one algorithm run. wait(i) / wait_all() complete them in order; whatever is still
// pending at destruction (an exception is unwinding) is waited for and its error dropped, so that
// no transfer outlives the buffers it reads or writes.
template <class C>
class request_set {
 public:
  using request_type = typename C::request_type;

  request_set() = default;
  request_set(const request_set&) = delete;
  request_set& operator=(const request_set&) = delete;
  ~request_set() { drain(); }

  std::size_t add(request_type&& r) {
    pending_.push_back(entry{std::move(r), false});
    return pending_.size() - 1;
  }

  void wait(std::size_t i) {
    entry& e = pending_[i];
    if (!e.done) {
      e.done = true;  // a wait that throws is not retried by drain()
      e.request.wait();
    }
  }

  void wait_all() {
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      wait(i);
    }
    pending_.clear();
  }

  std::size_t size() const noexcept { return pending_.size(); }

 private:
  struct entry {
    request_type request{};
    bool done = false;
  };

  void drain() noexcept {
    for (entry& e : pending_) {
      if (!e.done) {
        e.done = true;
        try {
          e.request.wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is already propagating
        }
      }
    }
  }

  std::vector<entry> pending_{};
};

inline std::byte* element_at(void* base, std::size_t elements, std::size_t element_bytes) noexcept {
  return static_cast<std::byte*>(base) + elements * element_bytes;
}

// Copies send to recv for out-of-place calls.
inline void copy_send_to_recv(const void* send, void* recv, std::size_t count, dtype type) {
  if (send != recv && count != 0) {
    std::memcpy(recv, send, count * size_of(type));
  }
}

// Runs run(data, type) over recv, which first receives send's values: as floats in a temporary
// (then rounded once into recv) for float16 / bfloat16 under narrow_float_mode::widen, in recv
// itself otherwise.
template <class Run>
void run_on_recv(const void* send, void* recv, std::size_t count, dtype type,
                 const all_reduce_config& config, Run&& run) {
  const bool narrow = type == dtype::float16 || type == dtype::bfloat16;
  if (!narrow || count == 0 || config.narrow_floats != narrow_float_mode::widen) {
    copy_send_to_recv(send, recv, count, type);
    run(recv, type);
    return;
  }
  std::vector<float> wide(count);
  visit_dtype(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      convert_floats(static_cast<const T*>(send), wide.data(), count);
      run(static_cast<void*>(wide.data()), dtype::float32);
      convert_floats(wide.data(), static_cast<T*>(recv), count);
    }
  });
}

// A barrier over point-to-point messages (dissemination: ceil(log2 n) rounds of zero-length
// messages to rank + 2^k, from rank - 2^k). Zero-element calls run it, so that they synchronize.
template <point_to_point_backend C>
void p2p_barrier(C& c, const all_reduce_config& config) {
  const int n = c.size();
  const int r = c.rank();
  const int tag = tag_of(config, algorithm_tag::barrier);
  std::byte out{};
  std::byte in{};
  for (int distance = 1; distance < n; distance *= 2) {
    request_set<C> requests;
    requests.add(c.recv_async(&in, 0, dtype::uint8, ring_index(r - distance, n), tag));
    requests.add(c.send_async(&out, 0, dtype::uint8, ring_index(r + distance, n), tag));
    requests.wait_all();
  }
}

// Ring reduce-scatter, in place over `data`, cut by `parts` into c.size() pieces: afterwards rank r
// holds piece (r + 1) % n combined over every rank with `op` (never avg: the caller divides).
template <point_to_point_backend C>
void ring_reduce_scatter_phase(C& c, void* data, const even_partition& parts, dtype type,
                               reduce_op op, const all_reduce_config& config) {
  const int n = c.size();
  if (n == 1) {
    return;
  }
  const int r = c.rank();
  const int right = ring_index(r + 1, n);
  const int left = ring_index(r - 1, n);
  const int tag = tag_of(config, algorithm_tag::ring_reduce_scatter);
  const std::size_t element = size_of(type);
  const std::size_t chunk = std::max<std::size_t>(1, config.chunk_bytes / element);

  std::size_t longest = 0;
  for (int j = 0; j < n; ++j) {
    longest = std::max(longest, parts.length(j));
  }
  std::vector<std::byte> incoming(longest * element);

  request_set<C> sends;
  const auto send_piece_chunk = [&](int piece, std::size_t at, std::size_t len) {
    sends.add(
        c.send_async(element_at(data, parts.offset(piece) + at, element), len, type, right, tag));
  };
  for (std::size_t at = 0; at < parts.length(r); at += chunk) {
    send_piece_chunk(r, at, std::min(chunk, parts.length(r) - at));
  }
  for (int step = 0; step < n - 1; ++step) {
    const int piece = ring_index(r - step - 1, n);
    const std::size_t length = parts.length(piece);
    request_set<C> recvs;
    for (std::size_t at = 0; at < length; at += chunk) {
      recvs.add(c.recv_async(incoming.data() + at * element, std::min(chunk, length - at), type,
                             left, tag));
    }
    std::size_t k = 0;
    for (std::size_t at = 0; at < length; at += chunk, ++k) {
      const std::size_t len = std::min(chunk, length - at);
      recvs.wait(k);
      reduce_into(element_at(data, parts.offset(piece) + at, element),
                  incoming.data() + at * element, len, type, op);
      if (step < n - 2) {
        send_piece_chunk(piece, at, len);
      }
    }
    recvs.wait_all();
  }
  sends.wait_all();
}

// Ring all-gather, in place over `data`: rank r starts with piece (r + 1) % n and ends with all.
template <point_to_point_backend C>
void ring_all_gather_phase(C& c, void* data, const even_partition& parts, dtype type,
                           const all_reduce_config& config) {
  const int n = c.size();
  if (n == 1) {
    return;
  }
  const int r = c.rank();
  const int right = ring_index(r + 1, n);
  const int left = ring_index(r - 1, n);
  const int tag = tag_of(config, algorithm_tag::ring_all_gather);
  const std::size_t element = size_of(type);
  const std::size_t chunk = std::max<std::size_t>(1, config.chunk_bytes / element);

  request_set<C> sends;
  const auto send_piece_chunk = [&](int piece, std::size_t at, std::size_t len) {
    sends.add(
        c.send_async(element_at(data, parts.offset(piece) + at, element), len, type, right, tag));
  };
  const int own = ring_index(r + 1, n);
  for (std::size_t at = 0; at < parts.length(own); at += chunk) {
    send_piece_chunk(own, at, std::min(chunk, parts.length(own) - at));
  }
  for (int step = 0; step < n - 1; ++step) {
    const int piece = ring_index(r - step, n);
    const std::size_t length = parts.length(piece);
    request_set<C> recvs;
    for (std::size_t at = 0; at < length; at += chunk) {
      recvs.add(c.recv_async(element_at(data, parts.offset(piece) + at, element),
                             std::min(chunk, length - at), type, left, tag));
    }
    std::size_t k = 0;
    for (std::size_t at = 0; at < length; at += chunk, ++k) {
      recvs.wait(k);
      if (step < n - 2) {
        send_piece_chunk(piece, at, std::min(chunk, length - at));
      }
    }
    recvs.wait_all();
  }
  sends.wait_all();
}

// Ring all-reduce in place; `op` is not avg; `divide_by` != 0 divides the result (avg).
template <point_to_point_backend C>
void ring_all_reduce_in_place(C& c, void* data, std::size_t count, dtype type, reduce_op op,
                              std::size_t divide_by, const all_reduce_config& config) {
  const even_partition parts{.count = count, .parts = c.size()};
  ring_reduce_scatter_phase(c, data, parts, type, op, config);
  if (divide_by != 0) {
    const int own = ring_index(c.rank() + 1, c.size());
    finish_avg(element_at(data, parts.offset(own), size_of(type)), parts.length(own), type,
               divide_by);
  }
  ring_all_gather_phase(c, data, parts, type, config);
}

// Recursive halving/doubling all-reduce in place; `op` is not avg; `divide_by` as above.
template <point_to_point_backend C>
void rhd_all_reduce_in_place(C& c, void* data, std::size_t count, dtype type, reduce_op op,
                             std::size_t divide_by, const all_reduce_config& config) {
  const int n = c.size();
  const int r = c.rank();
  const std::size_t element = size_of(type);
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;  // ranks 0 .. 2 * extra - 1 pair up; the even one of a pair sits out
  const int fold_tag = tag_of(config, algorithm_tag::fold);
  std::vector<std::byte> incoming;

  // Fold-in: the odd rank of each pair takes over its even partner's contribution.
  int virtual_rank = r - extra;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      c.send(data, count, type, r + 1, fold_tag);
      virtual_rank = -1;
    } else {
      incoming.resize(count * element);
      c.recv(incoming.data(), count, type, r - 1, fold_tag);
      reduce_into(data, incoming.data(), count, type, op);
      virtual_rank = r / 2;
    }
  }

  if (virtual_rank >= 0) {
    const auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    const even_partition parts{.count = count, .parts = p};
    const auto range_offset = [&](int first) { return parts.offset(first); };
    const auto range_length = [&](int first, int pieces) {
      return parts.offset(first + pieces) - parts.offset(first);
    };
    if (incoming.size() < count * element) {
      incoming.resize(count * element);
    }
    // Reduce-scatter by recursive halving: at distance d the window of 2d pieces is halved; this
    // rank keeps the half that holds piece `virtual_rank` and sends the other to its partner.
    const int halving_tag = tag_of(config, algorithm_tag::halving);
    for (int d = p / 2; d >= 1; d /= 2) {
      const int partner = virtual_rank ^ d;
      const int keep = virtual_rank & ~(d - 1);
      const int give = partner & ~(d - 1);
      const std::size_t keep_length = range_length(keep, d);
      const std::size_t give_length = range_length(give, d);
      request_set<C> requests;
      std::size_t recv_index = 0;
      if (keep_length != 0) {
        recv_index = requests.add(
            c.recv_async(incoming.data(), keep_length, type, real_rank(partner), halving_tag));
      }
      if (give_length != 0) {
        requests.add(c.send_async(element_at(data, range_offset(give), element), give_length, type,
                                  real_rank(partner), halving_tag));
      }
      if (keep_length != 0) {
        requests.wait(recv_index);
        reduce_into(element_at(data, range_offset(keep), element), incoming.data(), keep_length,
                    type, op);
      }
      requests.wait_all();
    }
    if (divide_by != 0) {
      finish_avg(element_at(data, range_offset(virtual_rank), element),
                 range_length(virtual_rank, 1), type, divide_by);
    }
    // All-gather by recursive doubling: at distance d each rank holds an aligned window of d
    // pieces and swaps it for its partner's.
    const int doubling_tag = tag_of(config, algorithm_tag::doubling);
    for (int d = 1; d < p; d *= 2) {
      const int partner = virtual_rank ^ d;
      const int mine = virtual_rank & ~(d - 1);
      const int theirs = partner & ~(d - 1);
      request_set<C> requests;
      if (range_length(theirs, d) != 0) {
        requests.add(c.recv_async(element_at(data, range_offset(theirs), element),
                                  range_length(theirs, d), type, real_rank(partner), doubling_tag));
      }
      if (range_length(mine, d) != 0) {
        requests.add(c.send_async(element_at(data, range_offset(mine), element),
                                  range_length(mine, d), type, real_rank(partner), doubling_tag));
      }
      requests.wait_all();
    }
  }

  // Fold-out: the even ranks that sat out get the result.
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      c.recv(data, count, type, r + 1, fold_tag);
    } else {
      c.send(data, count, type, r - 1, fold_tag);
    }
  }
}

// A binomial-tree broadcast from rank 0 over point-to-point messages.
template <point_to_point_backend C>
void p2p_broadcast_from_zero(C& c, void* data, std::size_t count, dtype type,
                             const all_reduce_config& config) {
  const int n = c.size();
  const int r = c.rank();
  const int tag = tag_of(config, algorithm_tag::broadcast);
  for (int d = 1; d < n; d *= 2) {
    if (r < d) {
      if (r + d < n) {
        c.send(data, count, type, r + d, tag);
      }
    } else if (r < 2 * d) {
      c.recv(data, count, type, r - d, tag);
    }
  }
}

// `op` without avg, and the divisor that avg needs at the end.
struct avg_split {
  reduce_op combine = reduce_op::sum;
  std::size_t divide_by = 0;
};

inline avg_split without_avg(reduce_op op, int ranks) noexcept {
  if (op == reduce_op::avg) {
    return {.combine = reduce_op::sum, .divide_by = static_cast<std::size_t>(ranks)};
  }
  return {.combine = op, .divide_by = 0};
}

// One of the flat algorithms (ring, recursive_halving_doubling, native; automatic resolved here)
// in place over `data`, combining with `op` (not avg), dividing by `divide_by` when not 0.
template <class C>
void flat_all_reduce_in_place(C& c, void* data, std::size_t count, dtype type, reduce_op op,
                              std::size_t divide_by, all_reduce_algorithm algorithm,
                              const all_reduce_config& config) {
  if (algorithm == all_reduce_algorithm::automatic ||
      algorithm == all_reduce_algorithm::hierarchical) {
    algorithm = choose_all_reduce_algorithm(c.size(), count, size_of(type), config);
  }
  if (algorithm == all_reduce_algorithm::native) {
    c.all_reduce(data, data, count, type, op);
    if (divide_by != 0) {
      finish_avg(data, count, type, divide_by);
    }
    return;
  }
  if (count == 0) {
    p2p_barrier(c, config);
    return;
  }
  if (algorithm == all_reduce_algorithm::ring) {
    ring_all_reduce_in_place(c, data, count, type, op, divide_by, config);
  } else {
    rhd_all_reduce_in_place(c, data, count, type, op, divide_by, config);
  }
}

template <class C>
[[noreturn]] void invalid_algorithm_argument(const C& c, const std::string& why) {
  throw comm_error(comm_error_info{.kind = comm_error_kind::invalid_argument,
                                   .op = std::string(to_string(op_kind::all_reduce)),
                                   .rank = c.rank()},
                   why);
}

}  // namespace detail

// ---- flat algorithms over point-to-point --------------------------------------------------------

// Ring all-reduce of `count` elements; send == recv for in place.
template <point_to_point_backend C>
void ring_all_reduce(C& c, const void* send, void* recv, std::size_t count, dtype type,
                     reduce_op op, const all_reduce_config& config = {}) {
  if (count == 0) {
    detail::p2p_barrier(c, config);
    return;
  }
  const detail::avg_split s = detail::without_avg(op, c.size());
  detail::run_on_recv(send, recv, count, type, config, [&](void* data, dtype t) {
    detail::ring_all_reduce_in_place(c, data, count, t, s.combine, s.divide_by, config);
  });
}

// Recursive halving/doubling all-reduce of `count` elements; send == recv for in place.
template <point_to_point_backend C>
void recursive_halving_doubling_all_reduce(C& c, const void* send, void* recv, std::size_t count,
                                           dtype type, reduce_op op,
                                           const all_reduce_config& config = {}) {
  if (count == 0) {
    detail::p2p_barrier(c, config);
    return;
  }
  const detail::avg_split s = detail::without_avg(op, c.size());
  detail::run_on_recv(send, recv, count, type, config, [&](void* data, dtype t) {
    detail::rhd_all_reduce_in_place(c, data, count, t, s.combine, s.divide_by, config);
  });
}

// ---- hierarchy: a communicator seen as local groups ---------------------------------------------

// Two sub-communicators of one communicator: `local`, the rank's group, and `cross`, the ranks
// that have the same rank in their group as this one (one per group). Every rank of the parent
// is in exactly one local group. When all groups have the same size ("uniform"), the
// hierarchical all-reduce reduce-scatters inside the group, all-reduces each share across the
// groups and all-gathers inside the group; otherwise it all-reduces inside the group, across the
// groups among the local ranks 0, and broadcasts inside the group.
template <comm_backend C>
class hierarchy {
 public:
  // From sub-communicators the caller made with split. Collective over every rank of the parent
  // (it measures the groups with two all-reduces across the local ranks 0 and a broadcast inside
  // each group). Throws comm_error (invalid_argument) when, in the uniform case, this rank's
  // `cross` does not have one rank per group.
  hierarchy(C local, C cross) : local_(std::move(local)), cross_(std::move(cross)) {
    std::int64_t shape[3] = {0, 0, 0};  // uniform, ranks, local size
    if (local_.rank() == 0) {
      std::int64_t sizes[2] = {local_.size(), -static_cast<std::int64_t>(local_.size())};
      cross_.all_reduce(sizes, sizes, 2, dtype::int64, reduce_op::max);
      std::int64_t ranks = local_.size();
      cross_.all_reduce(&ranks, &ranks, 1, dtype::int64, reduce_op::sum);
      shape[0] = sizes[0] == -sizes[1] ? 1 : 0;
      shape[1] = ranks;
    }
    local_.broadcast(shape, 3, dtype::int64, 0);
    uniform_ = shape[0] != 0;
    ranks_ = static_cast<int>(shape[1]);
    if (uniform_ && static_cast<std::int64_t>(cross_.size()) * local_.size() != ranks_) {
      detail::invalid_algorithm_argument(
          local_, "hierarchy: the cross communicator has " + std::to_string(cross_.size()) +
                      " ranks but there are " + std::to_string(ranks_ / local_.size()) +
                      " groups of " + std::to_string(local_.size()));
    }
  }

  // Groups of `group_size` consecutive ranks of `c` (the last one shorter when group_size does
  // not divide c.size(); a group_size above c.size() makes one group). Collective over `c` (two
  // splits).
  static hierarchy split(C& c, int group_size) {
    if (group_size <= 0) {
      detail::invalid_algorithm_argument(
          c, "hierarchy: group size " + std::to_string(group_size) + " is not positive");
    }
    const int g = std::min(group_size, c.size());
    C local = c.split(c.rank() / g, c.rank());
    C cross = c.split(c.rank() % g, c.rank());
    return hierarchy(std::move(local), std::move(cross), c.size() % g == 0, c.size());
  }

  C& local() noexcept { return local_; }
  C& cross() noexcept { return cross_; }
  const C& local() const noexcept { return local_; }
  const C& cross() const noexcept { return cross_; }
  // True when every group has the same size.
  bool uniform() const noexcept { return uniform_; }
  // Ranks of the parent communicator.
  int size() const noexcept { return ranks_; }

 private:
  hierarchy(C local, C cross, bool uniform, int ranks)
      : local_(std::move(local)), cross_(std::move(cross)), uniform_(uniform), ranks_(ranks) {}

  C local_;
  C cross_;
  bool uniform_ = true;
  int ranks_ = 1;
};

// hierarchy<C>::split(c, group_size).
template <comm_backend C>
hierarchy<C> make_hierarchy(C& c, int group_size) {
  return hierarchy<C>::split(c, group_size);
}

// Hierarchical all-reduce of `count` elements over the parent of `h`; send == recv for in place.
// config.cross picks the algorithm across groups.
template <comm_backend C>
void hierarchical_all_reduce(hierarchy<C>& h, const void* send, void* recv, std::size_t count,
                             dtype type, reduce_op op, const all_reduce_config& config = {}) {
  C& local = h.local();
  C& cross = h.cross();
  const detail::avg_split s = detail::without_avg(op, h.size());
  if (count == 0) {
    // Synchronize every rank: inside the groups, across them, inside them again.
    detail::p2p_barrier(local, config);
    if (h.uniform() || local.rank() == 0) {
      detail::p2p_barrier(cross, config);
    }
    detail::p2p_barrier(local, config);
    return;
  }
  detail::run_on_recv(send, recv, count, type, config, [&](void* data, dtype t) {
    if (h.uniform()) {
      const even_partition parts{.count = count, .parts = local.size()};
      detail::ring_reduce_scatter_phase(local, data, parts, t, s.combine, config);
      const int own = detail::ring_index(local.rank() + 1, local.size());
      void* share = detail::element_at(data, parts.offset(own), size_of(t));
      const std::size_t share_length = parts.length(own);
      // Every rank of `cross` has the same local rank, so the same share and length.
      detail::flat_all_reduce_in_place(cross, share, share_length, t, s.combine, s.divide_by,
                                       config.cross, config);
      detail::ring_all_gather_phase(local, data, parts, t, config);
    } else {
      detail::flat_all_reduce_in_place(local, data, count, t, s.combine, 0,
                                       all_reduce_algorithm::automatic, config);
      if (local.rank() == 0) {
        detail::flat_all_reduce_in_place(cross, data, count, t, s.combine, s.divide_by,
                                         config.cross, config);
      }
      detail::p2p_broadcast_from_zero(local, data, count, t, config);
    }
  });
}

// ---- selection ----------------------------------------------------------------------------------

// all_reduce with the algorithm chosen per call. `hierarchical` over a flat communicator splits it
// into groups of config.group_size on every call (two splits); keep a hierarchy and call
// hierarchical_all_reduce to pay that once.
template <comm_backend C>
void all_reduce(C& c, const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                all_reduce_algorithm algorithm, const all_reduce_config& config = {}) {
  if (algorithm == all_reduce_algorithm::automatic) {
    algorithm = choose_all_reduce_algorithm(c.size(), count, size_of(type), config);
  }
  switch (algorithm) {
    case all_reduce_algorithm::native:
      c.all_reduce(send, recv, count, type, op);
      return;
    case all_reduce_algorithm::ring:
      ring_all_reduce(c, send, recv, count, type, op, config);
      return;
    case all_reduce_algorithm::recursive_halving_doubling:
    case all_reduce_algorithm::automatic:
      recursive_halving_doubling_all_reduce(c, send, recv, count, type, op, config);
      return;
    case all_reduce_algorithm::hierarchical: {
      const int g = config.group_size > 0 ? config.group_size : default_group_size(c.size());
      hierarchy<C> h = make_hierarchy(c, g);
      hierarchical_all_reduce(h, send, recv, count, type, op, config);
      return;
    }
  }
  detail::invalid_algorithm_argument(
      c, "unknown all_reduce_algorithm value " + std::to_string(static_cast<int>(algorithm)));
}

// Typed forms (contiguous ranges of one of core/'s dtypes), in place and out of place.
template <comm_backend C, mutable_dtype_range R>
void all_reduce(C& c, R&& data, reduce_op op, all_reduce_algorithm algorithm,
                const all_reduce_config& config = {}) {
  all_reduce(c, std::ranges::data(data), std::ranges::data(data), std::ranges::size(data),
             dtype_of<detail::element_t<R>>, op, algorithm, config);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void all_reduce(C& c, In&& in, Out&& out, reduce_op op, all_reduce_algorithm algorithm,
                const all_reduce_config& config = {}) {
  detail::same_element<In, Out>();
  if (std::ranges::size(in) != std::ranges::size(out)) {
    detail::invalid(c, op_kind::all_reduce,
                    "send and receive sizes differ: " +
                        detail::sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  all_reduce(c, std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
             dtype_of<detail::element_t<In>>, op, algorithm, config);
}

template <comm_backend C, mutable_dtype_range R>
void hierarchical_all_reduce(hierarchy<C>& h, R&& data, reduce_op op,
                             const all_reduce_config& config = {}) {
  hierarchical_all_reduce(h, std::ranges::data(data), std::ranges::data(data),
                          std::ranges::size(data), dtype_of<detail::element_t<R>>, op, config);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void hierarchical_all_reduce(hierarchy<C>& h, In&& in, Out&& out, reduce_op op,
                             const all_reduce_config& config = {}) {
  detail::same_element<In, Out>();
  if (std::ranges::size(in) != std::ranges::size(out)) {
    detail::invalid(h.local(), op_kind::all_reduce,
                    "send and receive sizes differ: " +
                        detail::sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  hierarchical_all_reduce(h, std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
                          dtype_of<detail::element_t<In>>, op, config);
}

}  // namespace strata::comm
