// SPDX-License-Identifier: Apache-2.0
// The comm_backend concept accepts a complete backend and rejects one with a member missing.
#include <cstddef>

#include "strata/comm/concepts.hpp"

namespace {

struct done_request {
  bool test() { return true; }
  void wait() {}
};

// Everything the contract asks for, doing nothing.
struct complete_backend {
  using policy_category = strata::comm_backend_tag;
  using request_type = done_request;
  using dt = strata::dtype;
  using op = strata::comm::reduce_op;
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  const strata::comm::comm_config& config() const noexcept { return config_; }
  void all_reduce(const void*, void*, std::size_t, dt, op) {}
  void reduce_scatter(const void*, void*, std::size_t, dt, op) {}
  void all_gather(const void*, void*, std::size_t, dt) {}
  void broadcast(void*, std::size_t, dt, int) {}
  void reduce(const void*, void*, std::size_t, dt, op, int) {}
  void all_to_all(const void*, void*, std::size_t, dt) {}
  void barrier() {}
  request_type all_reduce_async(const void*, void*, std::size_t, dt, op) { return {}; }
  request_type reduce_scatter_async(const void*, void*, std::size_t, dt, op) { return {}; }
  request_type all_gather_async(const void*, void*, std::size_t, dt) { return {}; }
  request_type broadcast_async(void*, std::size_t, dt, int) { return {}; }
  request_type reduce_async(const void*, void*, std::size_t, dt, op, int) { return {}; }
  request_type all_to_all_async(const void*, void*, std::size_t, dt) { return {}; }
  request_type barrier_async() { return {}; }
  void send(const void*, std::size_t, dt, int, int) {}
  void recv(void*, std::size_t, dt, int, int) {}
  request_type send_async(const void*, std::size_t, dt, int, int) { return {}; }
  request_type recv_async(void*, std::size_t, dt, int, int) { return {}; }
  complete_backend split(int, int) { return {}; }

  strata::comm::comm_config config_{};
};

struct no_split : complete_backend {
  using policy_category = strata::comm_backend_tag;
  void split() = delete;
};

struct untagged {
  int rank() const noexcept { return 0; }
};

}  // namespace

static_assert(strata::comm::comm_request<done_request>);
static_assert(strata::comm::comm_backend<complete_backend>);
static_assert(strata::comm::check_comm_backend<complete_backend>());
static_assert(!strata::comm::comm_backend_splits<no_split>);
static_assert(!strata::comm::comm_backend<no_split>);
static_assert(!strata::comm::comm_backend<untagged>);
static_assert(!strata::comm::comm_backend<int>);
// Every collective is fingerprinted unless a program asks for less, in every build.
static_assert(strata::comm::comm_config{}.fingerprint == strata::comm::fingerprint_mode::always);

int main() {
  return 0;
}
