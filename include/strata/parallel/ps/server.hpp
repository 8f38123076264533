// SPDX-License-Identifier: Apache-2.0
#pragma once

// The dedicated servers of parallel::data<parameter_server> (dedicated_parameter_servers = true)
// and the commands the workers send them.
//
// The servers are the last ranks of the job. Each holds its shard of the flat parameters and of
// the optimizer state, applies each step's averaged gradient to its shard and sends the workers
// the new values, until worker 0 says finish:
//   - synchronous (serve): worker 0 says what comes next, one command per step (the push with
//     its learning rate and loss scale), per checkpoint (send the optimizer shard) and at the
//     end;
//   - asynchronous (serve_async, parameter_server_async): every worker announces its own steps;
//     each push is applied as it arrives (its gradient divided by the number of workers), and a
//     worker gets its reply as soon as it leads the slowest by at most parameter_server_staleness
//     steps; a checkpoint waits until every worker has pushed as many steps as worker 0.
// A server works on a server_context, what it owns (the communicator over every rank, the
// exchange, its parameters and optimizer state, its precision policy's unscale-and-check), never
// on the trainer.

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/model/param_store.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/ps/exchange.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

// What worker 0 (or, asynchronous, each worker) tells the servers. skip: an asynchronous
// worker's step whose gradients were not finite (no push follows).
enum class server_command : std::int64_t { step = 1, save = 2, finish = 3, skip = 4 };
// The tags of the optimizer-state gather of a checkpoint and of the commands.
inline constexpr int server_state_tag = ps_exchange::tag_base + 8;
inline constexpr int server_command_tag = ps_exchange::tag_base + 9;

// A worker's command to every server: the command, the worker's step, the learning rate and
// the loss scale of the push that follows.
inline void send_to_servers(comm::any_comm& world, const ps_exchange& ps, server_command command,
                            std::uint64_t step, double lr, double scale) {
  const std::int64_t message[4] = {static_cast<std::int64_t>(command),
                                   static_cast<std::int64_t>(step), std::bit_cast<std::int64_t>(lr),
                                   std::bit_cast<std::int64_t>(scale)};
  for (int s = 0; s < ps.servers(); ++s) {
    world.send(message, 4, dtype::int64, ps.server_rank(s), server_command_tag);
  }
}

// Worker 0 at a checkpoint: every server's optimizer shard (`per_server` floats each), in
// server order; asynchronous, also the parameters as the servers hold them (into `values`).
inline buffer<float> gather_server_state(comm::any_comm& world, const ps_exchange& ps,
                                         std::uint64_t step, std::size_t per_server, bool async,
                                         std::span<float> values) {
  const int shards = ps.servers();
  buffer<float> all(per_server * static_cast<std::size_t>(shards));
  send_to_servers(world, ps, server_command::save, step, 0.0, 1.0);
  for (int s = 0; s < shards; ++s) {
    world.recv(all.data() + static_cast<std::size_t>(s) * per_server, per_server, dtype::float32,
               ps.server_rank(s), server_state_tag);
    if (async) {
      world.recv(values.data() + ps.shard_begin(s), ps.shard_size(), dtype::float32,
                 ps.server_rank(s), ps_exchange::tag_base + 3);
    }
  }
  return all;
}

// What a dedicated server runs on.
struct server_context {
  comm::any_comm& world;            // every rank of the job
  ps_exchange& ps;                  // over `world`
  topk_compressor* topk = nullptr;  // compress::topk; null without
  model::param_store& master;       // the float32 parameters, this server's shard used
  std::span<float> pushed;          // where the workers' pushes arrive (all of the gradients)
  optim::any_optimizer& optimizer;
  std::span<float> state;  // this server's shard of the optimizer state
  std::size_t first = 0;   // this server's shard of the flat parameters
  std::size_t shard = 0;
  std::uint64_t staleness = 0;  // asynchronous: parameter_server_staleness
  // The precision policy's to_master: gradients scaled by a worker's loss scale, as its
  // compute type holds them, unscaled into float32 (and checked; the workers decided already).
  std::function<bool(std::span<float>, double)> to_master;
};

struct server_result {
  std::uint64_t step = 0;      // the steps done (the next step's number)
  std::uint64_t max_lead = 0;  // asynchronous: the most steps a worker led the slowest by
};

namespace detail {

[[noreturn]] inline void unknown_server_command(const server_context& c, std::int64_t command,
                                                std::size_t worker) {
  throw error("parameter server " + std::to_string(c.world.rank()) + ": unknown command " +
              std::to_string(command) + " from worker " + std::to_string(worker));
}

}  // namespace detail

// The synchronous server, from step `step` on: until worker 0 says finish.
inline server_result serve(server_context& c, std::uint64_t step) {
  for (;;) {
    std::int64_t message[4] = {};
    c.world.recv(message, 4, dtype::int64, 0, server_command_tag);
    const auto command = static_cast<server_command>(message[0]);
    if (command == server_command::finish) {
      break;
    }
    if (command == server_command::save) {
      c.world.send(c.state.data(), c.state.size(), dtype::float32, 0, server_state_tag);
      continue;
    }
    if (command != server_command::step) {
      detail::unknown_server_command(c, message[0], 0);
    }
    step = static_cast<std::uint64_t>(message[1]);
    const double lr = std::bit_cast<double>(message[2]);
    const double scale = std::bit_cast<double>(message[3]);
    if (c.topk != nullptr) {
      c.ps.push_topk(*c.topk, c.pushed, static_cast<float>(scale));
    } else {
      c.ps.push(c.pushed);
    }
    const std::span<float> from = c.pushed.subspan(c.first, c.shard);
    const std::span<float> to = c.master.grads().subspan(c.first, c.shard);
    if (from.data() != to.data()) {
      std::copy(from.begin(), from.end(), to.begin());
    }
    c.to_master(to, scale);
    update_shard(c.optimizer, c.master, c.state, c.first, c.shard, lr);
    c.ps.pull(c.master.values());
    ++step;
  }
  return {.step = step, .max_lead = 0};
}

// The asynchronous server, from step `step` on: until every worker says finish.
inline server_result serve_async(server_context& c, std::uint64_t step) {
  const int workers = c.ps.workers();
  const auto w_count = static_cast<std::size_t>(workers);
  const std::size_t shard = c.shard;
  const std::size_t first = c.first;
  enum class phase { command, gradient, reply, save };
  std::vector<std::int64_t> commands(4 * w_count);
  std::vector<comm::any_comm::request> pending(w_count);
  std::vector<phase> at(w_count, phase::command);
  std::vector<std::uint64_t> pushed(w_count, 0);
  std::vector<char> finished(w_count, 0);
  std::vector<float> incoming(w_count * shard);
  // Each reply travels from its own copy: the shard changes with the next push while a send
  // may still be reading.
  std::vector<float> outgoing(w_count * shard);
  std::vector<comm::any_comm::request> replies(w_count);
  std::uint64_t max_lead = 0;
  auto expect_command = [&](std::size_t w) {
    pending[w] = c.world.recv_async(&commands[4 * w], 4, dtype::int64, static_cast<int>(w),
                                    server_command_tag);
    at[w] = phase::command;
  };
  // Worker w's step is done here (pushed and applied, or skipped): it may get its reply.
  auto count_step = [&](std::size_t w) {
    step = std::max(step, static_cast<std::uint64_t>(commands[4 * w + 1]) + 1);
    ++pushed[w];
    at[w] = phase::reply;
  };
  for (std::size_t w = 0; w < w_count; ++w) {
    expect_command(w);
  }
  std::size_t done = 0;
  const std::span<float> values = c.master.values();
  const std::span<float> grads = c.master.grads();
  while (done < w_count) {
    bool progress = false;
    for (std::size_t w = 0; w < w_count; ++w) {
      if (finished[w] != 0) {
        continue;
      }
      if (at[w] == phase::command && pending[w].test()) {
        progress = true;
        const auto command = static_cast<server_command>(commands[4 * w]);
        if (command == server_command::finish) {
          finished[w] = 1;
          ++done;
          continue;
        }
        if (command == server_command::save) {
          at[w] = phase::save;
          continue;
        }
        if (command == server_command::skip) {
          // Counted as a step without an update, so that staleness and checkpoints keep
          // comparing steps.
          count_step(w);
          continue;
        }
        if (command != server_command::step) {
          detail::unknown_server_command(c, commands[4 * w], w);
        }
        pending[w] = c.world.recv_async(incoming.data() + w * shard, shard, dtype::float32,
                                        static_cast<int>(w), ps_exchange::tag_base);
        at[w] = phase::gradient;
      }
      if (at[w] == phase::gradient && pending[w].test()) {
        progress = true;
        const auto n = static_cast<float>(workers);
        for (std::size_t i = 0; i < shard; ++i) {
          grads[first + i] = incoming[w * shard + i] / n;
        }
        // The worker's gradients as its compute type holds them, scaled by its loss scale.
        c.to_master(grads.subspan(first, shard), std::bit_cast<double>(commands[4 * w + 3]));
        update_shard(c.optimizer, c.master, c.state, first, shard,
                     std::bit_cast<double>(commands[4 * w + 2]));
        count_step(w);
      }
    }
    std::uint64_t slowest = UINT64_MAX;
    for (std::size_t w = 0; w < w_count; ++w) {
      if (finished[w] == 0) {
        slowest = std::min(slowest, pushed[w]);
      }
    }
    for (std::size_t w = 0; w < w_count; ++w) {
      if (finished[w] == 0 && at[w] == phase::reply && pushed[w] <= slowest + c.staleness) {
        progress = true;
        max_lead = std::max(max_lead, pushed[w] - slowest);
        replies[w].wait();  // the previous reply to w, which w has received
        std::copy(values.begin() + static_cast<std::ptrdiff_t>(first),
                  values.begin() + static_cast<std::ptrdiff_t>(first + shard),
                  outgoing.begin() + static_cast<std::ptrdiff_t>(w * shard));
        replies[w] = c.world.send_async(outgoing.data() + w * shard, shard, dtype::float32,
                                        static_cast<int>(w), ps_exchange::tag_base + 3);
        expect_command(w);
      }
    }
    if (finished[0] == 0 && at[0] == phase::save) {
      bool caught_up = true;
      for (std::size_t w = 1; w < w_count; ++w) {
        caught_up = caught_up && (finished[w] != 0 || pushed[w] >= pushed[0]);
      }
      if (caught_up) {
        progress = true;
        c.world.send(c.state.data(), c.state.size(), dtype::float32, 0, server_state_tag);
        c.world.send(values.data() + first, shard, dtype::float32, 0, ps_exchange::tag_base + 3);
        expect_command(0);
      }
    }
    if (!progress) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  for (auto& r : replies) {
    r.wait();
  }
  return {.step = step, .max_lead = max_lead};
}

}  // namespace strata::parallel
