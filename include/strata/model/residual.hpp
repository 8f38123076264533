// SPDX-License-Identifier: Apache-2.0
#pragma once

// residual<Layers...>: y = x + f(x), f the layers in order (a transformer block's two halves).
//
//   strata::model::residual{strata::model::layer_norm{.features = 64},
//                           strata::model::self_attention{.dim = 64, .heads = 4}}
//
// It is one layer of its model: f's layers must give back the input's shape. Parameters: the
// inner layers' tensors in order, named "<i>.<tensor>" (i the inner layer's position), so the
// block's group in a sequential reads "3.1.q_weight". Workspace: every inner output and saved
// state, and two buffers for the gradients going back through f. Inner outputs and input
// gradients are rounded through forward_args::storage as a sequential rounds its layers'.
// Randomness: inner layer i draws from the block's stream key with (i + 1) x 1024 added to the
// layer index, so up to 63 inner layers in models of up to 1024 layers draw apart. Inner
// layers add their gradients (the block does not write them: the container zeroes the group).
// Inner tensor-parallel layers (requirement 10) get the block's tensor context; their tensors
// keep their split, so the block's group holds this rank's slices.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/core/round.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

template <class... Layers>
struct residual {
  static_assert(sizeof...(Layers) >= 1, "residual: needs at least one inner layer");
  static_assert(sizeof...(Layers) <= 63, "residual: at most 63 inner layers");
  static_assert((check_layer<Layers>() && ...));

  using layer_category = layer_tag;
  static constexpr std::size_t count = sizeof...(Layers);

  std::tuple<Layers...> layers;

  explicit residual(Layers... ls) : layers(std::move(ls)...) {}

  sample_shape output_shape(const sample_shape& in) const {
    const auto s = shapes(in);
    if (s.back() != in) {
      throw std::invalid_argument("residual: the inner layers turn " + to_string(in) + " into " +
                                  to_string(s.back()) + "; y = x + f(x) needs the same shape");
    }
    return in;
  }

  std::vector<param_spec> parameters(const sample_shape& in) const {
    const auto s = shapes(in);
    std::vector<param_spec> out;
    each([&]<std::size_t I>(const auto& l) {
      for (param_spec spec : layer_traits<inner_t<I>>::parameters(l, s[I])) {
        spec.name = std::to_string(I) + "." + spec.name;
        out.push_back(std::move(spec));
      }
    });
    return out;
  }

  // Requirement 10: tensor-parallel inner layers keep their slices' activations.
  std::size_t workspace_elements(const sample_shape& in, std::size_t batch,
                                 const tensor_place& place) const {
    return plan_of(in, batch, place).total;
  }

  layer_cost cost(const sample_shape& in) const {
    const auto s = shapes(in);
    layer_cost c{};
    each([&]<std::size_t I>(const auto& l) { c += layer_traits<inner_t<I>>::cost(l, s[I]); });
    const auto n = static_cast<double>(in.elements());
    c.forward_flops += n;  // the sum
    c.backward_flops += n;
    return c;
  }

  void forward(const forward_args& args) const {
    const plan p = plan_of(args.in_shape, args.batch, args.tensor.place);
    check(args.workspace.size(), p.total, "workspace");
    check(args.output.size(), args.input.size(), "output");
    std::span<const float> x = args.input;
    each([&]<std::size_t I>(const auto& l) {
      forward_args a = args;
      a.in_shape = p.shapes[I];
      a.out_shape = p.shapes[I + 1];
      a.input = x;
      a.output = args.workspace.subspan(p.output[I], args.batch * p.shapes[I + 1].elements());
      a.params = args.params.subspan(p.param[I], p.param[I + 1] - p.param[I]);
      a.workspace = args.workspace.subspan(p.saved[I], p.saved_size[I]);
      a.rng.layer = args.rng.layer + static_cast<std::uint32_t>((I + 1) * 1024);
      layer_traits<inner_t<I>>::forward(l, a);
      round_through(a.output, args.storage);
      x = a.output;
    });
    for (std::size_t i = 0; i < args.output.size(); ++i) {
      args.output[i] = args.input[i] + x[i];
    }
  }

  void backward(const backward_args& args) const {
    const plan p = plan_of(args.in_shape, args.batch, args.tensor.place);
    check(args.workspace.size(), p.total, "workspace");
    check(args.grads.size(), p.param[count], "grads");
    const std::size_t full = args.batch * args.in_shape.elements();
    std::span<const float> g = args.grad_output;
    bool into_a = true;
    each_reversed([&]<std::size_t I>(const auto& l) {
      backward_args a;
      a.batch = args.batch;
      a.in_shape = p.shapes[I];
      a.out_shape = p.shapes[I + 1];
      a.input = I == 0 ? args.input : output_at(args.workspace, p, I - 1, args.batch);
      a.output = output_at(args.workspace, p, I, args.batch);
      a.grad_output = g;
      const bool wanted = I > 0 || !args.grad_input.empty();
      const std::size_t in_floats = args.batch * p.shapes[I].elements();
      a.grad_input = wanted ? args.workspace.subspan(into_a ? p.grad_a : p.grad_b, in_floats)
                            : std::span<float>{};
      a.params = args.params.subspan(p.param[I], p.param[I + 1] - p.param[I]);
      a.grads = args.grads.subspan(p.param[I], p.param[I + 1] - p.param[I]);
      a.workspace = args.workspace.subspan(p.saved[I], p.saved_size[I]);
      a.storage = args.storage;
      a.tensor = args.tensor;
      layer_traits<inner_t<I>>::backward(l, a);
      if (wanted) {
        round_through(a.grad_input, args.storage);
        g = a.grad_input;
        into_a = !into_a;
      }
    });
    if (!args.grad_input.empty()) {
      check(args.grad_input.size(), full, "grad_input");
      for (std::size_t i = 0; i < full; ++i) {
        args.grad_input[i] = args.grad_output[i] + g[i];
      }
    }
  }

  friend bool operator==(const residual&, const residual&) = default;

 private:
  template <std::size_t I>
  using inner_t = std::tuple_element_t<I, std::tuple<Layers...>>;

  template <class F>
  void each(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<I>(std::get<I>(layers)), ...);
    }
    (std::make_index_sequence<count>{});
  }
  template <class F>
  void each_reversed(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<count - 1 - I>(std::get<count - 1 - I>(layers)), ...);
    }
    (std::make_index_sequence<count>{});
  }

  std::array<sample_shape, count + 1> shapes(const sample_shape& in) const {
    std::array<sample_shape, count + 1> s{};
    s[0] = in;
    each([&]<std::size_t I>(const auto& l) {
      s[I + 1] = layer_traits<inner_t<I>>::output_shape(l, s[I]);
    });
    return s;
  }

  // Where each inner layer's output, saved state and parameters lie, for one batch size.
  struct plan {
    std::array<sample_shape, count + 1> shapes{};
    std::array<std::size_t, count> output{};
    std::array<std::size_t, count> saved{};
    std::array<std::size_t, count> saved_size{};
    std::array<std::size_t, count + 1> param{};  // offsets into the group
    std::size_t grad_a = 0;
    std::size_t grad_b = 0;
    std::size_t total = 0;
  };

  plan plan_of(const sample_shape& in, std::size_t batch, const tensor_place& place) const {
    plan p;
    p.shapes = shapes(in);
    if (p.shapes.back() != in) {
      output_shape(in);  // throws, naming the shapes
    }
    std::size_t at = 0;
    std::size_t widest = 0;
    each([&]<std::size_t I>(const auto& l) {
      p.output[I] = at;
      at += batch * p.shapes[I + 1].elements();
      p.saved[I] = at;
      p.saved_size[I] = layer_workspace_elements(l, p.shapes[I], batch, place);
      at += p.saved_size[I];
      std::size_t params = 0;
      for (const param_spec& spec : layer_traits<inner_t<I>>::parameters(l, p.shapes[I])) {
        params += local_spec(spec, place).elements();
      }
      p.param[I + 1] = p.param[I] + params;
      widest = std::max(widest, batch * p.shapes[I].elements());
    });
    p.grad_a = at;
    p.grad_b = at + widest;
    p.total = at + 2 * widest;
    return p;
  }

  static std::span<const float> output_at(std::span<float> w, const plan& p, std::size_t i,
                                          std::size_t batch) {
    return w.subspan(p.output[i], batch * p.shapes[i + 1].elements());
  }

  static void check(std::size_t got, std::size_t want, const char* what) {
    if (got != want) {
      throw std::invalid_argument(std::string("residual: ") + what + " holds " +
                                  std::to_string(got) + " floats, expected " +
                                  std::to_string(want));
    }
  }
};

template <class... Layers>
std::string to_string(const residual<Layers...>& r) {
  std::string out = "residual{";
  std::apply(
      [&](const auto&... l) {
        std::size_t i = 0;
        ((out += (i++ > 0 ? ", " : "") + to_string(l)), ...);
      },
      r.layers);
  return out + "}";
}

}  // namespace strata::model
