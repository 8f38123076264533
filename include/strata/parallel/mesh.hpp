// SPDX-License-Identifier: Apache-2.0
#pragma once

// mesh: the data x tensor x pipeline layout of a job's ranks, and their three groups.
//
//   const auto shape = strata::parallel::mesh_shape_of(cfg);         // sizes from the config
//   auto groups = strata::parallel::make_mesh(world, shape);         // collective: splits
//   groups.tensor.all_reduce(...);  groups.data...;  groups.pipeline...
//
// Positions in the mesh: q = (pipeline_index x data + data_index) x tensor + tensor_index, so a
// tensor group is tensor consecutive positions, a stage's replicas are the next closest, and the
// stages of one pipeline the farthest apart (a pipeline sends one activation per micro-batch,
// the tensor group reduces in every layer). Positions go to ranks in the order of (node, rank):
// ranks on one node (the same host name) take consecutive positions, so a tensor group stays on
// one node whenever each node holds a multiple of `tensor` ranks, whatever order the launcher
// numbered them in. Where that cannot hold, the layout says so (mesh_layout::note) instead of
// failing: the job still runs, with its tensor reductions across nodes.
//
// A group's communicator numbers its ranks by their index along that axis: tensor group rank t
// is tensor_index t, the data group's rank is data_index, the pipeline group's is the stage.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::parallel {

struct mesh_shape {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;

  constexpr int world() const noexcept { return data * tensor * pipeline; }
  friend constexpr bool operator==(const mesh_shape&, const mesh_shape&) = default;
};

inline std::string to_string(const mesh_shape& s) {
  return "data " + std::to_string(s.data) + " x tensor " + std::to_string(s.tensor) +
         " x pipeline " + std::to_string(s.pipeline);
}

// The sizes the config asks for (data_parallel_size 0: what the world leaves); a product other
// than world_size is a config_error naming the three keys and world_size.
inline mesh_shape mesh_shape_of(const config::train_config& cfg) {
  const std::int64_t data = config::effective_data_parallel_size(cfg);
  const std::int64_t product = data * cfg.tensor_parallel_size * cfg.pipeline_parallel_size;
  if (data < 1 || product != cfg.world_size) {
    throw config_error({.key = "data_parallel_size", .file = {}, .line = 0, .column = 0},
                       "data_parallel_size x tensor_parallel_size x pipeline_parallel_size = " +
                           std::to_string(data) + " x " + std::to_string(cfg.tensor_parallel_size) +
                           " x " + std::to_string(cfg.pipeline_parallel_size) + " = " +
                           std::to_string(product) +
                           " must equal world_size = " + std::to_string(cfg.world_size));
  }
  return {.data = static_cast<int>(data),
          .tensor = static_cast<int>(cfg.tensor_parallel_size),
          .pipeline = static_cast<int>(cfg.pipeline_parallel_size)};
}

// A rank's place along the three axes.
struct mesh_coords {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;

  friend constexpr bool operator==(const mesh_coords&, const mesh_coords&) = default;
};

constexpr mesh_coords coords_at(const mesh_shape& s, int position) noexcept {
  return {.data = (position / s.tensor) % s.data,
          .tensor = position % s.tensor,
          .pipeline = position / (s.tensor * s.data)};
}

constexpr int position_of(const mesh_shape& s, const mesh_coords& c) noexcept {
  return (c.pipeline * s.data + c.data) * s.tensor + c.tensor;
}

// Which rank takes which position, from the node each rank runs on.
class mesh_layout {
 public:
  // node_of_rank[r]: any id that is equal for ranks on one node (one entry per rank).
  mesh_layout(const mesh_shape& shape, std::span<const std::uint64_t> node_of_rank)
      : shape_(shape) {
    const int world = shape.world();
    if (static_cast<int>(node_of_rank.size()) != world) {
      throw std::invalid_argument("mesh: " + std::to_string(node_of_rank.size()) +
                                  " ranks for a mesh of " + to_string(shape) + " = " +
                                  std::to_string(world));
    }
    rank_at_.resize(static_cast<std::size_t>(world));
    std::iota(rank_at_.begin(), rank_at_.end(), 0);
    // Nodes in the order of their lowest rank, ranks in order within a node.
    std::vector<int> first(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      int f = r;
      for (int o = 0; o < r; ++o) {
        if (node_of_rank[static_cast<std::size_t>(o)] ==
            node_of_rank[static_cast<std::size_t>(r)]) {
          f = o;
          break;
        }
      }
      first[static_cast<std::size_t>(r)] = f;
    }
    std::stable_sort(rank_at_.begin(), rank_at_.end(), [&](int a, int b) {
      return first[static_cast<std::size_t>(a)] < first[static_cast<std::size_t>(b)];
    });
    position_of_rank_.resize(static_cast<std::size_t>(world));
    for (int q = 0; q < world; ++q) {
      position_of_rank_[static_cast<std::size_t>(rank_at_[static_cast<std::size_t>(q)])] = q;
    }
    for (int q = 0; q < world; q += shape.tensor) {
      const std::uint64_t node =
          node_of_rank[static_cast<std::size_t>(rank_at_[static_cast<std::size_t>(q)])];
      for (int t = 1; t < shape.tensor; ++t) {
        if (node_of_rank[static_cast<std::size_t>(rank_at_[static_cast<std::size_t>(q + t)])] !=
            node) {
          spanning_ += 1;
          break;
        }
      }
    }
    if (spanning_ > 0) {
      note_ = std::to_string(spanning_) + " of " + std::to_string(world / shape.tensor) +
              " tensor groups span nodes (tensor_parallel_size = " + std::to_string(shape.tensor) +
              " does not divide every node's ranks): their reductions in every layer cross the "
              "network; launch a multiple of " +
              std::to_string(shape.tensor) + " ranks per node";
    }
  }

  const mesh_shape& shape() const noexcept { return shape_; }
  int position_of_rank(int rank) const {
    return position_of_rank_.at(static_cast<std::size_t>(rank));
  }
  int rank_at(int position) const { return rank_at_.at(static_cast<std::size_t>(position)); }
  mesh_coords coords_of(int rank) const { return coords_at(shape_, position_of_rank(rank)); }
  int rank_of(const mesh_coords& c) const { return rank_at(position_of(shape_, c)); }
  // Tensor groups whose ranks are on more than one node, and a sentence on it (empty if none).
  int spanning_tensor_groups() const noexcept { return spanning_; }
  const std::string& note() const noexcept { return note_; }

  // The ranks of `rank`'s group along one axis, in the order of their index on it.
  std::vector<int> tensor_group(int rank) const {
    return along(rank, &mesh_coords::tensor, shape_.tensor);
  }
  std::vector<int> data_group(int rank) const {
    return along(rank, &mesh_coords::data, shape_.data);
  }
  std::vector<int> pipeline_group(int rank) const {
    return along(rank, &mesh_coords::pipeline, shape_.pipeline);
  }

 private:
  std::vector<int> along(int rank, int mesh_coords::*axis, int size) const {
    std::vector<int> out;
    mesh_coords c = coords_of(rank);
    for (int i = 0; i < size; ++i) {
      c.*axis = i;
      out.push_back(rank_of(c));
    }
    return out;
  }

  mesh_shape shape_{};
  std::vector<int> rank_at_{};
  std::vector<int> position_of_rank_{};
  int spanning_ = 0;
  std::string note_{};
};

// An id of the node this process runs on: a hash of its host name.
inline std::uint64_t this_node_id() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) {
    return 0;
  }
  return std::hash<std::string>{}(std::string(name));
}

// This rank's groups. The communicators are the backend's split(): collective over the world.
template <class Comm>
struct mesh {
  mesh_layout layout;
  mesh_coords coords;
  Comm data;
  Comm tensor;
  Comm pipeline;
};

// Collective over `world` (size shape.world()): gathers every rank's node, lays the mesh out and
// splits the three groups. node_id: this rank's node (this_node_id() unless a test says).
template <class Comm>
mesh<Comm> make_mesh(Comm& world, const mesh_shape& shape, std::uint64_t node_id = this_node_id()) {
  if (world.size() != shape.world()) {
    throw std::invalid_argument("mesh: " + to_string(shape) + " needs " +
                                std::to_string(shape.world()) + " ranks, the job has " +
                                std::to_string(world.size()));
  }
  std::vector<std::int64_t> nodes(static_cast<std::size_t>(world.size()));
  const auto mine = static_cast<std::int64_t>(node_id);
  world.all_gather(&mine, nodes.data(), 1, dtype::int64);
  std::vector<std::uint64_t> ids(nodes.begin(), nodes.end());
  mesh_layout layout(shape, ids);
  const mesh_coords c = layout.coords_of(world.rank());
  // Colors: the other two coordinates; keys: the index along the axis.
  Comm data = world.split(c.pipeline * shape.tensor + c.tensor, c.data);
  Comm tensor = world.split(c.pipeline * shape.data + c.data, c.tensor);
  Comm pipeline = world.split(c.data * shape.tensor + c.tensor, c.pipeline);
  return mesh<Comm>{.layout = std::move(layout),
                    .coords = c,
                    .data = std::move(data),
                    .tensor = std::move(tensor),
                    .pipeline = std::move(pipeline)};
}

}  // namespace strata::parallel
