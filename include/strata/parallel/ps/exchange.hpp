// SPDX-License-Identifier: Apache-2.0
#pragma once

// The synchronous parameter server of parallel::data<parameter_server>, over point-to-point
// messages (any backend with send / recv).
//
// The flat parameters (padded to a multiple of the server count) are cut into `servers` equal
// shards; the ranks [first server, first server + servers) serve one each: server s holds the
// optimizer state of shard s and applies its update. The ranks [0, workers) train and contribute
// gradients. Co-located servers (ranks 0 .. servers - 1, every rank a worker) train too;
// dedicated servers (the ranks after the workers) only serve. A step:
//   push  every worker sends its gradient's shard s to server s (its own shard stays local);
//         server s adds the workers' contributions in rank order and divides by their count;
//   ...   server s updates its shard of the parameters (the trainer's optimizer on its state);
//   pull  server s sends its updated shard to every worker.
// Every rank ends with the same parameters as an all-reduce run (the average of the same
// gradients, added in rank order). With top-k compression (parallel/topk.hpp) each rank pushes
// only its selected (index, value) pairs, split by shard, after a count message; the pull stays
// dense, since every parameter of a shard may have changed.
//
//   parallel::ps_exchange ps(comm, params.size(), servers);
//   ps.push(params.grads());              // server: grads[shard] = the average
//                                         // (or begin_push / send_range / finish_push: in
//                                         // pieces as backward completes them)
//   if (ps.is_server()) { ... update params[shard_begin, + shard_size) ... }
//   ps.pull(params.values());             // everyone: the updated parameters
//
// The messages use the tags [ps_exchange::tag_base, tag_base + 4); other traffic on the
// communicator must avoid them while an exchange runs. The asynchronous (bounded-staleness) mode
// with dedicated servers is the trainer's (train/trainer.hpp), over these messages.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/core/dtype.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

class ps_exchange {
 public:
  // + 0: dense push, + 1 and + 2: count and pairs of a top-k push, + 3: pull.
  static constexpr int tag_base = 0x5350;

  ps_exchange() = default;
  // `size`: the flat parameter count, a multiple of `servers`. Co-located (workers = 0): every
  // rank trains and ranks [0, servers) serve. Dedicated (workers > 0): ranks [0, workers) train
  // and ranks [workers, workers + servers) serve.
  ps_exchange(comm::any_comm comm, std::size_t size, int servers, int workers = 0)
      : comm_(comm),
        size_(size),
        servers_(servers),
        first_server_(workers),
        workers_(workers > 0 ? workers : comm.size()) {
    if (servers < 1 || first_server_ + servers > comm.size()) {
      throw std::invalid_argument("parallel::ps_exchange: " + std::to_string(servers) +
                                  " parameter servers after " + std::to_string(first_server_) +
                                  " dedicated workers do not fit " + std::to_string(comm.size()) +
                                  " ranks (config key parameter_servers)");
    }
    if (size % static_cast<std::size_t>(servers) != 0) {
      throw std::invalid_argument("parallel::ps_exchange: " + std::to_string(size) +
                                  " parameters do not split into " + std::to_string(servers) +
                                  " equal shards (pad the param_store)");
    }
    shard_ = size / static_cast<std::size_t>(servers);
  }

  int servers() const noexcept { return servers_; }
  int workers() const noexcept { return workers_; }
  std::size_t shard_size() const noexcept { return shard_; }
  std::size_t shard_begin(int server) const noexcept {
    return static_cast<std::size_t>(server) * shard_;
  }
  // The rank of server s, and the server this rank is (-1 when it is none).
  int server_rank(int server) const noexcept { return first_server_ + server; }
  int server_index() const noexcept {
    const int s = comm_->rank() - first_server_;
    return s >= 0 && s < servers_ ? s : -1;
  }
  bool is_server() const noexcept { return server_index() >= 0; }
  bool is_worker() const noexcept { return comm_->rank() < workers_; }

  // Dense push: on server s, grads[shard s] becomes the average over the workers of their shard
  // s. The other entries of grads are left as they are (stale on a server, unused). Collective.
  void push(std::span<float> grads) {
    check(grads.size(), "push");
    const push_range whole{.offset = 0, .count = size_};
    begin_push(grads, std::span<const push_range>(&whole, 1));
    send_range(0);
    finish_push();
  }

  // The dense push in pieces, so that it overlaps backward: every rank calls begin_push before
  // the step's last backward with the ranges of the gradients it will send, in the order it will
  // send them (the same on every rank; ranges inside [0, size) that do not overlap), a server
  // posting its receives for them; a worker calls send_range(i) for i = 0, 1, ... as range i
  // becomes final, sending its piece inside each server's shard; finish_push() sends the ranges
  // not sent yet, waits for every transfer and leaves the average on the servers, as push()
  // does, over the entries of the ranges (others are left as they are: a store's padding).
  // Messages from one worker to one server match in the order both sides walk the ranges.
  // Transfers still in flight when the exchange goes (an exception left the step) are waited
  // for, their errors dropped, so that none writes into memory already freed.
  struct push_range {
    std::size_t offset = 0;
    std::size_t count = 0;
  };

  void begin_push(std::span<float> grads, std::span<const push_range> ranges) {
    check(grads.size(), "begin_push");
    requests_.drain();  // nothing of an earlier push may still write into stage_
    check_ranges(ranges);
    grads_ = grads;
    ranges_.assign(ranges.begin(), ranges.end());
    pieces_.clear();
    sent_ = 0;
    polled_ = 0;
    const int me = comm_->rank();
    const int mine = server_index();
    if (mine < 0) {
      return;
    }
    stage_.resize(static_cast<std::size_t>(workers_) * shard_);
    const std::size_t lo = shard_begin(mine);
    const std::size_t hi = lo + shard_;
    for (const push_range& r : ranges_) {
      const std::size_t from = std::max(r.offset, lo);
      const std::size_t to = std::min(r.offset + r.count, hi);
      if (from >= to) {
        continue;
      }
      pieces_.push_back({.offset = from, .count = to - from});
      for (int w = 0; w < workers_; ++w) {
        if (w != me) {
          requests_.list.push_back(
              comm_->recv_async(stage_.data() + static_cast<std::size_t>(w) * shard_ + (from - lo),
                                to - from, dtype::float32, w, tag_base));
        }
      }
    }
  }

  // Sends range i (the next one not sent: ranges go out in order) to its servers.
  void send_range(std::size_t i) {
    if (i != sent_ || i >= ranges_.size()) {
      throw std::logic_error("parallel::ps_exchange::send_range: range " + std::to_string(i) +
                             " out of order (next " + std::to_string(sent_) + " of " +
                             std::to_string(ranges_.size()) + ")");
    }
    ++sent_;
    if (!is_worker()) {
      return;
    }
    const int me = comm_->rank();
    const push_range& r = ranges_[i];
    for (int s = 0; s < servers_; ++s) {
      const std::size_t from = std::max(r.offset, shard_begin(s));
      const std::size_t to = std::min(r.offset + r.count, shard_begin(s) + shard_);
      if (from < to && server_rank(s) != me) {
        requests_.list.push_back(comm_->send_async(grads_.data() + from, to - from, dtype::float32,
                                                   server_rank(s), tag_base));
      }
    }
  }

  // Tests the push's transfers in flight, in the order they were posted (a server's receives for
  // every range first, then this rank's sends), and returns how many have completed in a row
  // from the first: on a backend whose transfers advance only inside its calls (comm::mpi) this
  // moves them on.
  std::size_t poll() {
    while (polled_ < requests_.list.size() && requests_.list[polled_].test()) {
      ++polled_;
    }
    return polled_;
  }

  void finish_push() {
    while (sent_ < ranges_.size()) {
      send_range(sent_);
    }
    wait_all(requests_.list);
    polled_ = 0;
    const int mine = server_index();
    if (mine < 0) {
      return;
    }
    const int me = comm_->rank();
    const std::size_t lo = shard_begin(mine);
    const auto n = static_cast<float>(workers_);
    for (const push_range& piece : pieces_) {
      float* out = grads_.data() + piece.offset;
      const std::size_t at = piece.offset - lo;  // where the piece sits in each worker's stage
      if (is_worker()) {
        std::copy(out, out + piece.count,
                  stage_.begin() +
                      static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * shard_ + at));
      }
      for (std::size_t i = 0; i < piece.count; ++i) {
        float sum = 0.0f;
        for (int r = 0; r < workers_; ++r) {
          sum += stage_[static_cast<std::size_t>(r) * shard_ + at + i];
        }
        out[i] = sum / n;
      }
    }
  }

  // Top-k push: each worker selects its pairs (error feedback in `tk`, gradients carrying
  // `scale`) and sends each server the pairs of its shard after their count; on server s,
  // grads[shard s] becomes the sum of every worker's pairs in rank order divided by the worker
  // count. A dedicated server passes any `tk` (unused). Collective.
  void push_topk(topk_compressor& tk, std::span<float> grads, float scale) {
    check(grads.size(), "push_topk");
    const int me = comm_->rank();
    const int mine = server_index();
    pairs_.clear();
    std::vector<std::size_t> cut(static_cast<std::size_t>(servers_) + 1, 0);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(servers_), 0);
    std::vector<comm::any_comm::request> sends;
    if (is_worker()) {
      tk.select(grads, scale, pairs_);
      // The pairs are in increasing index order: each shard's are one run.
      const std::size_t pairs = pairs_.size() / 2;
      std::size_t p = 0;
      for (int s = 1; s <= servers_; ++s) {
        const std::size_t end = s == servers_ ? size_ : shard_begin(s);
        while (p < pairs && static_cast<std::size_t>(pairs_[2 * p]) < end) {
          ++p;
        }
        cut[static_cast<std::size_t>(s)] = p;
        counts[static_cast<std::size_t>(s) - 1] = static_cast<std::int64_t>(
            cut[static_cast<std::size_t>(s)] - cut[static_cast<std::size_t>(s) - 1]);
      }
      for (int s = 0; s < servers_; ++s) {
        if (server_rank(s) != me) {
          const auto u = static_cast<std::size_t>(s);
          sends.push_back(
              comm_->send_async(&counts[u], 1, dtype::int64, server_rank(s), tag_base + 1));
          sends.push_back(comm_->send_async(pairs_.data() + 2 * cut[u],
                                            2 * static_cast<std::size_t>(counts[u]), dtype::int32,
                                            server_rank(s), tag_base + 2));
        }
      }
    }
    if (mine < 0) {
      wait_all(sends);
      return;
    }
    std::vector<std::int64_t> incoming(static_cast<std::size_t>(workers_), 0);
    {
      std::vector<comm::any_comm::request> requests;
      for (int r = 0; r < workers_; ++r) {
        if (r != me) {
          requests.push_back(comm_->recv_async(&incoming[static_cast<std::size_t>(r)], 1,
                                               dtype::int64, r, tag_base + 1));
        }
      }
      wait_all(requests);
    }
    for (int r = 0; r < workers_; ++r) {
      const std::int64_t c = incoming[static_cast<std::size_t>(r)];
      if (c < 0 || static_cast<std::size_t>(c) > shard_) {
        wait_all(sends);
        throw std::runtime_error("parallel::ps_exchange: rank " + std::to_string(r) +
                                 " announced " + std::to_string(c) + " top-k pairs for shard " +
                                 std::to_string(mine) + " of " + std::to_string(shard_) +
                                 " entries");
      }
    }
    std::vector<std::vector<std::int32_t>> received(static_cast<std::size_t>(workers_));
    {
      std::vector<comm::any_comm::request> requests;
      for (int r = 0; r < workers_; ++r) {
        if (r != me) {
          auto& in = received[static_cast<std::size_t>(r)];
          in.resize(2 * static_cast<std::size_t>(incoming[static_cast<std::size_t>(r)]));
          requests.push_back(
              comm_->recv_async(in.data(), in.size(), dtype::int32, r, tag_base + 2));
        }
      }
      wait_all(requests);
    }
    wait_all(sends);
    const std::span<float> out = grads.subspan(shard_begin(mine), shard_);
    std::fill(out.begin(), out.end(), 0.0f);
    for (int r = 0; r < workers_; ++r) {
      const auto u = static_cast<std::size_t>(mine);
      const std::span<const std::int32_t> from =
          r == me ? std::span<const std::int32_t>(pairs_).subspan(
                        2 * cut[u], 2 * static_cast<std::size_t>(counts[u]))
                  : std::span<const std::int32_t>(received[static_cast<std::size_t>(r)]);
      for (std::size_t p = 0; p + 1 < from.size(); p += 2) {
        if (from[p] < 0 || static_cast<std::size_t>(from[p]) < shard_begin(mine) ||
            static_cast<std::size_t>(from[p]) >= shard_begin(mine) + shard_) {
          throw std::runtime_error("parallel::ps_exchange: rank " + std::to_string(r) +
                                   " sent index " + std::to_string(from[p]) + " outside shard " +
                                   std::to_string(mine));
        }
      }
      add_topk_pairs(from, out, shard_begin(mine));
    }
    const auto n = static_cast<float>(workers_);
    for (float& g : out) {
      g /= n;
    }
  }

  // Pull: every server sends its shard of `values` to every worker. Collective.
  void pull(std::span<float> values) {
    check(values.size(), "pull");
    const int me = comm_->rank();
    const int mine = server_index();
    std::vector<comm::any_comm::request> requests;
    if (is_worker()) {
      for (int s = 0; s < servers_; ++s) {
        if (server_rank(s) != me) {
          requests.push_back(comm_->recv_async(values.data() + shard_begin(s), shard_,
                                               dtype::float32, server_rank(s), tag_base + 3));
        }
      }
    }
    if (mine >= 0) {
      for (int r = 0; r < workers_; ++r) {
        if (r != me) {
          requests.push_back(comm_->send_async(values.data() + shard_begin(mine), shard_,
                                               dtype::float32, r, tag_base + 3));
        }
      }
    }
    wait_all(requests);
  }

 private:
  void check(std::size_t size, const char* what) const {
    if (size != size_) {
      throw std::invalid_argument(std::string("parallel::ps_exchange::") + what + ": " +
                                  std::to_string(size) + " floats, but the exchange was made for " +
                                  std::to_string(size_));
    }
  }

  // Ranges inside [0, size_) that do not overlap, or std::invalid_argument naming the first
  // that does not fit.
  void check_ranges(std::span<const push_range> ranges) const {
    std::vector<push_range> sorted(ranges.begin(), ranges.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const push_range& a, const push_range& b) { return a.offset < b.offset; });
    std::size_t end = 0;
    for (const push_range& r : sorted) {
      const bool overlaps = r.offset < end;
      if (overlaps || r.count > size_ || r.offset > size_ - r.count) {
        throw std::invalid_argument(
            "parallel::ps_exchange::begin_push: range [" + std::to_string(r.offset) + ", " +
            std::to_string(r.offset + r.count) + ") " +
            (overlaps ? std::string("overlaps another")
                      : "is outside the " + std::to_string(size_) + " parameters"));
      }
      end = r.offset + r.count;
    }
  }

  // The push's transfers: waited for (errors dropped) when the exchange goes or starts another
  // push while some are in flight, so that none writes into memory already freed.
  struct in_flight {
    std::vector<comm::any_comm::request> list;

    in_flight() = default;
    in_flight(const in_flight&) = delete;
    in_flight& operator=(const in_flight&) = delete;
    in_flight(in_flight&& other) noexcept : list(std::move(other.list)) { other.list.clear(); }
    in_flight& operator=(in_flight&& other) noexcept {
      if (this != &other) {
        drain();
        list = std::move(other.list);
        other.list.clear();
      }
      return *this;
    }
    ~in_flight() { drain(); }

    void drain() noexcept {
      for (auto& r : list) {
        try {
          r.wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the step is lost already
        }
      }
      list.clear();
    }
  };

  // Waits for every request; the first error propagates after all were waited for, so that no
  // transfer still writes into a buffer that is about to go.
  static void wait_all(std::vector<comm::any_comm::request>& requests) {
    std::exception_ptr first;
    for (auto& r : requests) {
      try {
        r.wait();
      } catch (...) {
        if (!first) {
          first = std::current_exception();
        }
      }
    }
    requests.clear();
    if (first) {
      std::rethrow_exception(first);
    }
  }

  std::optional<comm::any_comm> comm_{};
  std::size_t size_ = 0;
  int servers_ = 1;
  int first_server_ = 0;
  int workers_ = 0;
  std::size_t shard_ = 0;
  std::vector<float> stage_{};
  std::vector<std::int32_t> pairs_{};
  // The dense push in flight (begin_push .. finish_push).
  std::span<float> grads_{};
  std::vector<push_range> ranges_{};
  std::vector<push_range> pieces_{};  // a server's: the ranges' parts inside its shard
  std::size_t sent_ = 0;
  std::size_t polled_ = 0;
  in_flight requests_{};  // last: destroyed (drained) before the buffers it writes into
};

}  // namespace strata::parallel
