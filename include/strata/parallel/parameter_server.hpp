// SPDX-License-Identifier: Apache-2.0
#pragma once

// The synchronous parameter server of parallel::data<parameter_server>, over point-to-point
// messages (any backend with send / recv).
//
// The flat parameters (padded to a multiple of the server count) are cut into `servers` equal
// shards; rank s < servers serves shard s: it holds the optimizer state of that shard and applies
// its update. Servers are co-located: they train on their data shard like every other rank.
// A step:
//   push  every rank sends its gradient's shard s to server s (its own shard stays local);
//         server s adds the ranks' contributions in rank order and divides by the rank count;
//   ...   server s updates its shard of the parameters (the trainer's optimizer on its state);
//   pull  server s sends its updated shard to every other rank.
// Every rank ends with the same parameters as an all-reduce run (the average of the same
// gradients, added in rank order). With top-k compression (parallel/topk.hpp) each rank pushes
// only its selected (index, value) pairs, split by shard, after a count message; the pull stays
// dense, since every parameter of a shard may have changed.
//
//   parallel::ps_exchange ps(comm, params.size(), servers);
//   ps.push(params.grads());              // server: grads[shard] = the average
//   if (ps.is_server()) { ... update params[shard_begin, + shard_size) ... }
//   ps.pull(params.values());             // everyone: the updated parameters
//
// The messages use the tags [ps_exchange::tag_base, tag_base + 4); other traffic on the
// communicator must avoid them while an exchange runs. The asynchronous (bounded-staleness) mode
// and dedicated (non-training) servers are not in this version (docs/parallel.md).

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
  // `size`: the flat parameter count, a multiple of `servers` (1 .. comm.size()).
  ps_exchange(comm::any_comm comm, std::size_t size, int servers)
      : comm_(comm), size_(size), servers_(servers) {
    if (servers < 1 || servers > comm.size()) {
      throw std::invalid_argument("parallel::ps_exchange: " + std::to_string(servers) +
                                  " parameter servers for " + std::to_string(comm.size()) +
                                  " ranks (config key parameter_servers: 0 .. world_size)");
    }
    if (size % static_cast<std::size_t>(servers) != 0) {
      throw std::invalid_argument("parallel::ps_exchange: " + std::to_string(size) +
                                  " parameters do not split into " + std::to_string(servers) +
                                  " equal shards (pad the param_store)");
    }
    shard_ = size / static_cast<std::size_t>(servers);
  }

  int servers() const noexcept { return servers_; }
  std::size_t shard_size() const noexcept { return shard_; }
  std::size_t shard_begin(int server) const noexcept {
    return static_cast<std::size_t>(server) * shard_;
  }
  bool is_server() const noexcept { return comm_->rank() < servers_; }

  // Dense push: on server s, grads[shard s] becomes the average over every rank of its shard s.
  // The other entries of grads are left as they are (stale on a server, unused). Collective.
  void push(std::span<float> grads) {
    check(grads.size(), "push");
    const int me = comm_->rank();
    const int n = comm_->size();
    std::vector<comm::any_comm::request> requests;
    if (is_server()) {
      stage_.resize(static_cast<std::size_t>(n) * shard_);
      for (int r = 0; r < n; ++r) {
        if (r != me) {
          requests.push_back(comm_->recv_async(stage_.data() + static_cast<std::size_t>(r) * shard_,
                                               shard_, dtype::float32, r, tag_base));
        }
      }
    }
    for (int s = 0; s < servers_; ++s) {
      if (s != me) {
        requests.push_back(
            comm_->send_async(grads.data() + shard_begin(s), shard_, dtype::float32, s, tag_base));
      }
    }
    wait_all(requests);
    if (!is_server()) {
      return;
    }
    const std::span<float> mine = grads.subspan(shard_begin(me), shard_);
    std::copy(mine.begin(), mine.end(), stage_.begin() + static_cast<std::ptrdiff_t>(me) * shard_);
    const auto ranks = static_cast<float>(n);
    for (std::size_t i = 0; i < shard_; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < n; ++r) {
        sum += stage_[static_cast<std::size_t>(r) * shard_ + i];
      }
      mine[i] = sum / ranks;
    }
  }

  // Top-k push: this rank selects its pairs (error feedback in `tk`, gradients carrying `scale`)
  // and sends each server the pairs of its shard; on server s, grads[shard s] becomes the sum of
  // every rank's pairs in rank order divided by the rank count. Collective.
  void push_topk(topk_compressor& tk, std::span<float> grads, float scale) {
    check(grads.size(), "push_topk");
    const int me = comm_->rank();
    const int n = comm_->size();
    pairs_.clear();
    tk.select(grads, scale, pairs_);
    // The pairs are in increasing index order: each shard's are one run.
    std::vector<std::size_t> cut(static_cast<std::size_t>(servers_) + 1, pairs_.size() / 2);
    cut[0] = 0;
    {
      std::size_t p = 0;
      for (int s = 1; s < servers_; ++s) {
        while (p < pairs_.size() / 2 && static_cast<std::size_t>(pairs_[2 * p]) < shard_begin(s)) {
          ++p;
        }
        cut[static_cast<std::size_t>(s)] = p;
      }
    }
    std::vector<std::int64_t> counts(static_cast<std::size_t>(servers_));
    for (int s = 0; s < servers_; ++s) {
      counts[static_cast<std::size_t>(s)] = static_cast<std::int64_t>(
          cut[static_cast<std::size_t>(s) + 1] - cut[static_cast<std::size_t>(s)]);
    }
    std::vector<comm::any_comm::request> sends;
    for (int s = 0; s < servers_; ++s) {
      if (s != me) {
        const auto u = static_cast<std::size_t>(s);
        sends.push_back(comm_->send_async(&counts[u], 1, dtype::int64, s, tag_base + 1));
        sends.push_back(comm_->send_async(pairs_.data() + 2 * cut[u],
                                          2 * static_cast<std::size_t>(counts[u]), dtype::int32, s,
                                          tag_base + 2));
      }
    }
    if (is_server()) {
      std::vector<std::int64_t> incoming(static_cast<std::size_t>(n), 0);
      {
        std::vector<comm::any_comm::request> requests;
        for (int r = 0; r < n; ++r) {
          if (r != me) {
            requests.push_back(comm_->recv_async(&incoming[static_cast<std::size_t>(r)], 1,
                                                 dtype::int64, r, tag_base + 1));
          }
        }
        wait_all(requests);
      }
      for (int r = 0; r < n; ++r) {
        if (incoming[static_cast<std::size_t>(r)] < 0 ||
            static_cast<std::size_t>(incoming[static_cast<std::size_t>(r)]) > shard_) {
          wait_all(sends);
          throw std::runtime_error(
              "parallel::ps_exchange: rank " + std::to_string(r) + " announced " +
              std::to_string(incoming[static_cast<std::size_t>(r)]) + " top-k pairs for shard " +
              std::to_string(me) + " of " + std::to_string(shard_) + " entries");
        }
      }
      incoming[static_cast<std::size_t>(me)] = counts[static_cast<std::size_t>(me)];
      std::vector<std::vector<std::int32_t>> received(static_cast<std::size_t>(n));
      std::vector<comm::any_comm::request> requests;
      for (int r = 0; r < n; ++r) {
        if (r != me) {
          auto& in = received[static_cast<std::size_t>(r)];
          in.resize(2 * static_cast<std::size_t>(incoming[static_cast<std::size_t>(r)]));
          requests.push_back(
              comm_->recv_async(in.data(), in.size(), dtype::int32, r, tag_base + 2));
        }
      }
      wait_all(requests);
      wait_all(sends);
      const std::span<float> mine = grads.subspan(shard_begin(me), shard_);
      std::fill(mine.begin(), mine.end(), 0.0f);
      for (int r = 0; r < n; ++r) {
        const auto u = static_cast<std::size_t>(r);
        const std::span<const std::int32_t> from =
            r == me ? std::span<const std::int32_t>(pairs_).subspan(
                          2 * cut[static_cast<std::size_t>(me)],
                          2 * static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]))
                    : std::span<const std::int32_t>(received[u]);
        for (std::size_t p = 0; p + 1 < from.size(); p += 2) {
          if (from[p] < 0 || static_cast<std::size_t>(from[p]) < shard_begin(me) ||
              static_cast<std::size_t>(from[p]) >= shard_begin(me) + shard_) {
            throw std::runtime_error("parallel::ps_exchange: rank " + std::to_string(r) +
                                     " sent index " + std::to_string(from[p]) + " outside shard " +
                                     std::to_string(me));
          }
        }
        add_topk_pairs(from, mine, shard_begin(me));
      }
      const auto ranks = static_cast<float>(n);
      for (float& g : mine) {
        g /= ranks;
      }
    } else {
      wait_all(sends);
    }
  }

  // Pull: every server sends its shard of `values` to every other rank. Collective.
  void pull(std::span<float> values) {
    check(values.size(), "pull");
    const int me = comm_->rank();
    const int n = comm_->size();
    std::vector<comm::any_comm::request> requests;
    for (int s = 0; s < servers_; ++s) {
      if (s != me) {
        requests.push_back(comm_->recv_async(values.data() + shard_begin(s), shard_, dtype::float32,
                                             s, tag_base + 3));
      }
    }
    if (is_server()) {
      for (int r = 0; r < n; ++r) {
        if (r != me) {
          requests.push_back(comm_->send_async(values.data() + shard_begin(me), shard_,
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
  std::size_t shard_ = 0;
  std::vector<float> stage_{};
  std::vector<std::int32_t> pairs_{};
};

}  // namespace strata::parallel
