// SPDX-License-Identifier: Apache-2.0
#pragma once

// The data family's contracts: a dataset gives samples, a transform changes one sample. The
// loader (data/prefetch_loader.hpp) runs any pair of them on worker threads.
//
// A dataset D, with `const D& d`, must:
//   1. opt in with `using dataset_category = strata::data::dataset_tag;`;
//   2. say how many samples it has: `d.size()` converts to std::size_t;
//   3. say the shape of one sample's input: `d.shape()` returns sample_shape (the same for
//      every sample);
//   4. read sample i into a caller's buffer: `d.read(i, out)` with `std::span<float> out` of
//      exactly shape().elements() values, returning the sample's label as std::int32_t.
//      read() is const and safe to call from several threads at once; it throws (data_error
//      preferred) on failure and never writes outside `out`.
//
// A transform T, with `const T& t`, must:
//   1. opt in with `using transform_category = strata::data::transform_tag;`;
//   2. declare its output: `t.output_shape(in)` maps an input sample_shape to the output
//      sample_shape, throwing std::invalid_argument (or data_error) for inputs it cannot take;
//   3. apply: `t.apply(in, in_shape, out, context)` with `std::span<const float> in` of
//      in_shape.elements() values and `std::span<float> out` of output_shape(in_shape).elements()
//      values, which never overlap. apply() is const and safe from several threads at once.
//      All of its randomness comes from `context.rng()` (or context.rng(k) for several
//      independent draws), which is keyed by (seed, epoch, sample index): the same sample in
//      the same epoch gets the same draws whatever thread or rank runs it.
//
// Tier 2: a type the user cannot change takes part by specializing enable_dataset (or
// enable_transform) to true and dataset_traits (or transform_traits) to adapt its members; the
// loader reaches datasets and transforms only through the traits.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"

namespace strata::data {

struct dataset_tag {};
struct transform_tag {};

// The shape of one sample (core/shape.hpp).
using strata::sample_shape;

// Where a transform draws its randomness: one sample of one epoch of one seeded run. Stage k of
// a compose sees the substream its parent derives for it (transform_context::child), so adding
// or removing one stage does not change the draws of the others.
struct transform_context {
  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;
  std::uint64_t sample_index = 0;
  std::uint32_t substream = 0;

  // The stream for this transform; rng(k) for its k-th independent use (k < 16).
  constexpr rng_stream rng(std::uint32_t k = 0) const noexcept {
    return rng_stream::for_sample(seed, epoch, sample_index,
                                  (substream * 16u + k) & rng_stream::max_substream);
  }

  // The context of stage `stage` of a composition (stage < 15): substreams form a 16-ary tree,
  // so nested compositions up to three levels deep never share a stream.
  constexpr transform_context child(std::uint32_t stage) const noexcept {
    transform_context c = *this;
    c.substream = (substream * 16u + stage + 1u) & rng_stream::max_substream;
    return c;
  }
};

// Tier 2: specialize to adapt a type that cannot be changed. The primary templates forward to
// the members and exist only where the member does, so the concepts below see what is missing.
template <class D>
struct dataset_traits {
  static std::size_t size(const D& d) requires requires {
    { d.size() } -> std::convertible_to<std::size_t>;
  }
  { return static_cast<std::size_t>(d.size()); }

  static sample_shape shape(const D& d) requires requires {
    { d.shape() } -> std::convertible_to<sample_shape>;
  }
  { return d.shape(); }

  static std::int32_t read(const D& d, std::size_t index, std::span<float> out) requires requires {
    { d.read(index, out) } -> std::convertible_to<std::int32_t>;
  }
  { return d.read(index, out); }
};

template <class T>
struct transform_traits {
  static sample_shape output_shape(const T& t, const sample_shape& in) requires requires {
    { t.output_shape(in) } -> std::convertible_to<sample_shape>;
  }
  { return t.output_shape(in); }

  static void apply(const T& t, std::span<const float> in, const sample_shape& in_shape,
                    std::span<float> out, const transform_context& context) requires requires {
    t.apply(in, in_shape, out, context);
  }
  { t.apply(in, in_shape, out, context); }
};

// 1.
template <class D>
concept declares_dataset_tag = requires {
  typename D::dataset_category;
  requires std::same_as<typename D::dataset_category, dataset_tag>;
};
template <class D>
inline constexpr bool enable_dataset = declares_dataset_tag<D>;

template <class D>
concept dataset_tagged = enable_dataset<std::remove_cvref_t<D>>;

// 2.
template <class D>
concept dataset_sized = requires(const D& d) {
  { dataset_traits<D>::size(d) } -> std::same_as<std::size_t>;
};

// 3.
template <class D>
concept dataset_shaped = requires(const D& d) {
  { dataset_traits<D>::shape(d) } -> std::same_as<sample_shape>;
};

// 4.
template <class D>
concept dataset_readable = requires(const D& d, std::size_t i, std::span<float> out) {
  { dataset_traits<D>::read(d, i, out) } -> std::same_as<std::int32_t>;
};

template <class D>
concept dataset = dataset_tagged<D> && dataset_sized<D> && dataset_shaped<D> && dataset_readable<D>;

// 1.
template <class T>
concept declares_transform_tag = requires {
  typename T::transform_category;
  requires std::same_as<typename T::transform_category, transform_tag>;
};
template <class T>
inline constexpr bool enable_transform = declares_transform_tag<T>;

template <class T>
concept transform_tagged = enable_transform<std::remove_cvref_t<T>>;

// 2.
template <class T>
concept transform_shapes = requires(const T& t, const sample_shape& s) {
  { transform_traits<T>::output_shape(t, s) } -> std::same_as<sample_shape>;
};

// 3.
template <class T>
concept transform_applies = requires(const T& t, std::span<const float> in, const sample_shape& s,
                                     std::span<float> out, const transform_context& c) {
  transform_traits<T>::apply(t, in, s, out, c);
};

template <class T>
concept transform = transform_tagged<T> && transform_shapes<T> && transform_applies<T>;

// One static_assert per requirement, for the places where a user's type meets the library.
template <class D>
constexpr bool check_dataset() {
  static_assert(dataset_tagged<D>,
                "data: a dataset declares 'using dataset_category = strata::data::dataset_tag;' "
                "or specializes strata::data::enable_dataset");
  static_assert(dataset_sized<D>, "data: a dataset needs 'size()' returning the sample count");
  static_assert(dataset_shaped<D>,
                "data: a dataset needs 'shape()' returning strata::data::sample_shape");
  static_assert(dataset_readable<D>,
                "data: a dataset needs 'std::int32_t read(std::size_t, std::span<float>) const'");
  return true;
}

template <class T>
constexpr bool check_transform() {
  static_assert(transform_tagged<T>,
                "data: a transform declares 'using transform_category = "
                "strata::data::transform_tag;' or specializes strata::data::enable_transform");
  static_assert(transform_shapes<T>,
                "data: a transform needs 'sample_shape output_shape(const sample_shape&) const'");
  static_assert(transform_applies<T>,
                "data: a transform needs 'void apply(std::span<const float>, const "
                "sample_shape&, std::span<float>, const transform_context&) const'");
  return true;
}

}  // namespace strata::data
