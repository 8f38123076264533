// SPDX-License-Identifier: Apache-2.0
// parallel::mesh: the groups of every factorization of 8 ranks, tensor groups kept on one node
// whatever order the launcher numbered the ranks in, the config's sizes, and the split groups on
// thread ranks.
#include "strata/parallel/mesh.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "strata/comm/threads.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"

namespace {

namespace sp = strata::parallel;

std::vector<sp::mesh_shape> factorizations(int world) {
  std::vector<sp::mesh_shape> out;
  for (int d = 1; d <= world; ++d) {
    for (int t = 1; t <= world; ++t) {
      if (world % (d * t) == 0) {
        out.push_back({.data = d, .tensor = t, .pipeline = world / (d * t)});
      }
    }
  }
  return out;
}

std::string message_of(const strata::config::train_config& cfg) {
  try {
    (void)sp::mesh_shape_of(cfg);
  } catch (const strata::config_error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("mesh: the groups of every factorization of 8 ranks on one node") {
  const auto shapes = factorizations(8);
  CHECK(shapes.size() == 10);
  const std::vector<std::uint64_t> one_node(8, 7);
  for (const sp::mesh_shape& s : shapes) {
    CAPTURE(sp::to_string(s));
    const sp::mesh_layout layout(s, one_node);
    CHECK(layout.note().empty());
    std::set<std::vector<int>> tensor_groups, data_groups, pipeline_groups;
    for (int r = 0; r < 8; ++r) {
      CAPTURE(r);
      // One node: positions are ranks.
      CHECK(layout.position_of_rank(r) == r);
      const sp::mesh_coords c = layout.coords_of(r);
      CHECK(layout.rank_of(c) == r);
      CHECK(c.data < s.data);
      CHECK(c.tensor < s.tensor);
      CHECK(c.pipeline < s.pipeline);
      const auto t = layout.tensor_group(r);
      const auto d = layout.data_group(r);
      const auto p = layout.pipeline_group(r);
      REQUIRE(t.size() == static_cast<std::size_t>(s.tensor));
      REQUIRE(d.size() == static_cast<std::size_t>(s.data));
      REQUIRE(p.size() == static_cast<std::size_t>(s.pipeline));
      // Its index along each axis is its place in that group.
      CHECK(t[static_cast<std::size_t>(c.tensor)] == r);
      CHECK(d[static_cast<std::size_t>(c.data)] == r);
      CHECK(p[static_cast<std::size_t>(c.pipeline)] == r);
      // A tensor group is consecutive ranks; the others differ from r along their axis only.
      for (std::size_t i = 0; i < t.size(); ++i) {
        CHECK(t[i] == t[0] + static_cast<int>(i));
      }
      for (int o : d) {
        const auto oc = layout.coords_of(o);
        CHECK((oc.tensor == c.tensor && oc.pipeline == c.pipeline));
      }
      for (int o : p) {
        const auto oc = layout.coords_of(o);
        CHECK((oc.tensor == c.tensor && oc.data == c.data));
      }
      // Two groups of r meet in r alone.
      std::vector<int> common;
      std::set_intersection(t.begin(), t.end(), d.begin(), d.end(), std::back_inserter(common));
      CHECK(common == std::vector<int>{r});
      tensor_groups.insert(t);
      data_groups.insert(d);
      pipeline_groups.insert(p);
    }
    // The groups of each axis partition the world.
    CHECK(tensor_groups.size() == static_cast<std::size_t>(8 / s.tensor));
    CHECK(data_groups.size() == static_cast<std::size_t>(8 / s.data));
    CHECK(pipeline_groups.size() == static_cast<std::size_t>(8 / s.pipeline));
  }
}

TEST_CASE("mesh: tensor groups stay on one node whatever the launcher's numbering") {
  // Round-robin over two nodes: ranks 0 2 4 6 on one, 1 3 5 7 on the other.
  const std::vector<std::uint64_t> round_robin{10, 20, 10, 20, 10, 20, 10, 20};
  const sp::mesh_layout layout({.data = 2, .tensor = 4, .pipeline = 1}, round_robin);
  CHECK(layout.note().empty());
  CHECK(layout.tensor_group(0) == std::vector<int>{0, 2, 4, 6});
  CHECK(layout.tensor_group(3) == std::vector<int>{1, 3, 5, 7});
  CHECK(layout.data_group(2) == std::vector<int>{2, 3});
  for (const sp::mesh_shape& s : factorizations(8)) {
    const sp::mesh_layout l(s, round_robin);
    CAPTURE(sp::to_string(s));
    CHECK((l.spanning_tensor_groups() == 0) == (s.tensor <= 4));
  }
  // Nodes of 3, 3 and 2 ranks cannot hold tensor groups of 2 whole: one spans two nodes.
  const std::vector<std::uint64_t> uneven{1, 1, 1, 2, 2, 2, 3, 3};
  const sp::mesh_layout spanning({.data = 4, .tensor = 2, .pipeline = 1}, uneven);
  CHECK(spanning.spanning_tensor_groups() == 1);  // ranks 2 and 3
  CHECK(spanning.note().find("launch a multiple of 2 ranks per node") != std::string::npos);
  CHECK_THROWS_WITH_AS(sp::mesh_layout({.data = 2, .tensor = 2, .pipeline = 1}, uneven),
                       doctest::Contains("8 ranks for a mesh of data 2 x tensor 2"),
                       std::invalid_argument);
}

TEST_CASE("mesh: sizes from the config; a product other than world_size names the keys") {
  strata::config::train_config cfg;
  cfg.world_size = 8;
  cfg.tensor_parallel_size = 2;
  cfg.pipeline_parallel_size = 2;
  CHECK(sp::mesh_shape_of(cfg) == sp::mesh_shape{.data = 2, .tensor = 2, .pipeline = 2});
  cfg.data_parallel_size = 3;
  const std::string m = message_of(cfg);
  for (const char* key :
       {"data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size", "world_size = 8"}) {
    CHECK_MESSAGE(m.find(key) != std::string::npos, m);
  }
}

TEST_CASE("mesh: on 8 thread ranks each group's sum is its members'") {
  const sp::mesh_shape shape{.data = 2, .tensor = 2, .pipeline = 2};
  std::mutex mu;
  std::vector<std::vector<int>> sums(8);
  strata::comm::threads::run(8, [&](strata::comm::threads& world) {
    auto m = sp::make_mesh(world, shape);
    const int me = world.rank();
    CHECK(m.tensor.rank() == m.coords.tensor);
    CHECK(m.data.rank() == m.coords.data);
    CHECK(m.pipeline.rank() == m.coords.pipeline);
    std::vector<int> got;
    for (auto* g : {&m.tensor, &m.data, &m.pipeline}) {
      std::int32_t v = me;
      g->all_reduce(&v, &v, 1, strata::dtype::int32, strata::comm::reduce_op::sum);
      got.push_back(v);
    }
    const std::lock_guard lock(mu);
    sums[static_cast<std::size_t>(me)] = got;
  });
  const sp::mesh_layout layout(shape, std::vector<std::uint64_t>(8, 0));
  for (int r = 0; r < 8; ++r) {
    const auto total = [](const std::vector<int>& g) {
      int s = 0;
      for (int x : g) {
        s += x;
      }
      return s;
    };
    CHECK(sums[static_cast<std::size_t>(r)] == std::vector<int>{total(layout.tensor_group(r)),
                                                                total(layout.data_group(r)),
                                                                total(layout.pipeline_group(r))});
  }
}
