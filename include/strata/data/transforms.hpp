// SPDX-License-Identifier: Apache-2.0
#pragma once

// Image augmentations: transforms (data/concepts.hpp) over one sample laid out channels x height
// x width, row-major floats (channel c, row y, column x at c * height * width + y * width + x).
//
//   auto augment = strata::data::compose{strata::data::random_crop{.padding = 2},
//                                        strata::data::horizontal_flip{},
//                                        strata::data::normalize{}};
//
// Each transform is an aggregate of numbers with a defaulted operator== and a to_string printer.
// Aggregates cannot check themselves on construction, so output_shape() checks the numbers and
// the input shape and throws std::invalid_argument naming the transform and the field; the loader
// calls it once before the first apply(). apply() trusts what output_shape() accepted.
//
// Determinism. apply() takes every random draw from its transform_context: the same (seed, epoch,
// sample_index, substream) gives bit-identical output on any thread, in any order, for a given
// build. Each transform documents which streams (context.rng(k)) it uses and how many words it
// draws; every decision draws a fixed number of words except uniform_int(), which redraws with
// probability below n / 2^32. Stage k of a compose runs with context.child(k), so adding,
// removing or changing one stage never changes the draws of another.
//
// Writing one's own transform: an aggregate with `using transform_category =
// strata::data::transform_tag;`, `sample_shape output_shape(const sample_shape&) const` (throw
// std::invalid_argument on numbers or shapes it cannot take) and a const `apply(in, in_shape, out,
// context)` that writes all of `out`, reads only `in`, keeps no mutable state and draws only from
// context.rng(k); then `static_assert(strata::data::check_transform<T>());`. It can be a stage of
// a compose like the ones here. A `to_string(const T&)` found by argument-dependent lookup is used
// when a compose is printed.

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/format.hpp"
#include "strata/core/rng.hpp"
#include "strata/data/concepts.hpp"

namespace strata::data {

namespace detail {

// The shortest text that reads back as the same value ("0.1", "inf", "nan").
template <class T>
requires std::is_floating_point_v<T>
inline std::string format_number(T value) {
  return format_shortest(value);
}

inline std::string format_number(std::size_t value) {
  return std::to_string(value);
}

[[noreturn]] inline void throw_invalid(std::string_view transform, std::string_view message) {
  std::string text(transform);
  text += ": ";
  text += message;
  throw std::invalid_argument(text);
}

// An image transform takes any channels x height x width with no dimension 0.
inline void check_image_shape(std::string_view transform, const sample_shape& in) {
  if (in.channels == 0 || in.height == 0 || in.width == 0) {
    throw_invalid(
        transform,
        "input shape must have channels, height and width of at least 1, got " + to_string(in));
  }
}

inline void check_probability(std::string_view transform, std::string_view field, double value) {
  if (!(value >= 0.0 && value <= 1.0)) {
    throw_invalid(transform,
                  std::string(field) + " must be in [0, 1], got " + format_number(value));
  }
}

inline void check_finite(std::string_view transform, std::string_view field, double value) {
  if (!std::isfinite(value)) {
    throw_invalid(transform, std::string(field) + " must be finite, got " + format_number(value));
  }
}

inline void copy_sample(std::span<const float> in, std::span<float> out) {
  assert(in.size() == out.size() &&
         "data: a shape-preserving transform needs in.size() == out.size()");
  std::copy(in.begin(), in.end(), out.begin());
}

// Per-thread scratch for compose: a stack of buffers that grow as needed and are reused, so
// apply() allocates nothing once every level has seen its largest sample. A compose takes two
// buffers at the current depth for its whole apply(); nested compositions take the next two.
struct scratch_stack {
  std::vector<std::vector<float>> buffers;
  std::size_t depth = 0;
};

inline scratch_stack& thread_scratch() {
  thread_local scratch_stack stack;
  return stack;
}

class scratch_lease {
 public:
  scratch_lease() : stack_(thread_scratch()), base_(stack_.depth) {
    stack_.depth += 2;
    if (stack_.buffers.size() < stack_.depth) {
      // Moving a std::vector keeps its elements in place, so spans held by outer levels survive.
      stack_.buffers.resize(stack_.depth);
    }
  }
  scratch_lease(const scratch_lease&) = delete;
  scratch_lease& operator=(const scratch_lease&) = delete;
  ~scratch_lease() { stack_.depth = base_; }

  // Buffer `which` (0 or 1) with room for `count` floats.
  std::span<float> get(std::size_t which, std::size_t count) {
    std::vector<float>& buffer = stack_.buffers[base_ + which];
    if (buffer.size() < count) {
      buffer.resize(count);
    }
    return std::span<float>(buffer.data(), count);
  }

 private:
  scratch_stack& stack_;
  std::size_t base_ = 0;
};

}  // namespace detail

// ---- identity -----------------------------------------------------------------------------------

// Copies its input. Draws nothing.
struct identity {
  using transform_category = transform_tag;

  sample_shape output_shape(const sample_shape& in) const { return in; }

  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context&) const {
    detail::copy_sample(in, out);
  }

  bool operator==(const identity&) const = default;
};

inline std::string to_string(const identity&) {
  return "identity{}";
}

static_assert(check_transform<identity>());

// ---- random_crop --------------------------------------------------------------------------------

// Pads every side by `padding` pixels of value `fill`, then crops a height x width window at a
// random offset: out(c, y, x) = in(c, y + top - padding, x + left - padding), or fill where that
// falls outside the input. The shape is unchanged; padding 0 is the identity.
// Draws (padding > 0): from context.rng(), top = uniform_int(2 * padding + 1), then left the same
// way (one word each).
struct random_crop {
  using transform_category = transform_tag;

  static constexpr std::size_t max_padding = std::size_t{1} << 20;

  std::size_t padding = 4;  // pixels on every side
  float fill = 0.0f;        // value of the padding

  sample_shape output_shape(const sample_shape& in) const {
    if (padding > max_padding) {
      detail::throw_invalid("random_crop", "padding must be at most " +
                                               detail::format_number(max_padding) + ", got " +
                                               detail::format_number(padding));
    }
    detail::check_finite("random_crop", "fill", fill);
    detail::check_image_shape("random_crop", in);
    return in;
  }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context& context) const {
    if (padding == 0) {
      detail::copy_sample(in, out);
      return;
    }
    rng_stream rng = context.rng();
    const std::uint64_t choices = 2 * std::uint64_t{padding} + 1;
    const auto pad = static_cast<std::ptrdiff_t>(padding);
    const std::ptrdiff_t shift_y = static_cast<std::ptrdiff_t>(rng.uniform_int(choices)) - pad;
    const std::ptrdiff_t shift_x = static_cast<std::ptrdiff_t>(rng.uniform_int(choices)) - pad;

    const auto height = static_cast<std::ptrdiff_t>(in_shape.height);
    const auto width = static_cast<std::ptrdiff_t>(in_shape.width);
    // Columns x in [x_begin, x_end) read in(x + shift_x); the rest are fill.
    const std::ptrdiff_t x_begin = std::clamp<std::ptrdiff_t>(-shift_x, 0, width);
    const std::ptrdiff_t x_end = std::clamp<std::ptrdiff_t>(width - shift_x, 0, width);
    for (std::size_t c = 0; c < in_shape.channels; ++c) {
      const float* source = in.data() + c * in_shape.plane();
      float* target = out.data() + c * in_shape.plane();
      for (std::ptrdiff_t y = 0; y < height; ++y) {
        float* row = target + y * width;
        const std::ptrdiff_t source_y = y + shift_y;
        if (source_y < 0 || source_y >= height || x_begin >= x_end) {
          std::fill(row, row + width, fill);
          continue;
        }
        const float* source_row = source + source_y * width;
        std::fill(row, row + x_begin, fill);
        std::copy(source_row + x_begin + shift_x, source_row + x_end + shift_x, row + x_begin);
        std::fill(row + x_end, row + width, fill);
      }
    }
  }

  bool operator==(const random_crop&) const = default;
};

inline std::string to_string(const random_crop& t) {
  return "random_crop{.padding = " + detail::format_number(t.padding) +
         ", .fill = " + detail::format_number(t.fill) + "}";
}

static_assert(check_transform<random_crop>());

// ---- horizontal_flip ----------------------------------------------------------------------------

// Mirrors every row (x -> width - 1 - x) with the given probability, else copies.
// Draws: from context.rng(), one bernoulli(probability) (two words).
struct horizontal_flip {
  using transform_category = transform_tag;

  double probability = 0.5;  // in [0, 1]; 1 always flips

  sample_shape output_shape(const sample_shape& in) const {
    detail::check_probability("horizontal_flip", "probability", probability);
    detail::check_image_shape("horizontal_flip", in);
    return in;
  }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context& context) const {
    rng_stream rng = context.rng();
    if (!rng.bernoulli(probability)) {
      detail::copy_sample(in, out);
      return;
    }
    const std::size_t rows = in_shape.channels * in_shape.height;
    const std::size_t width = in_shape.width;
    for (std::size_t row = 0; row < rows; ++row) {
      const float* source = in.data() + row * width;
      std::reverse_copy(source, source + width, out.data() + row * width);
    }
  }

  bool operator==(const horizontal_flip&) const = default;
};

inline std::string to_string(const horizontal_flip& t) {
  return "horizontal_flip{.probability = " + detail::format_number(t.probability) + "}";
}

static_assert(check_transform<horizontal_flip>());

// ---- random_affine ------------------------------------------------------------------------------

// Rotates about the image center ((width - 1) / 2, (height - 1) / 2) by an angle uniform in
// [-max_rotate_degrees, max_rotate_degrees] (positive is counter-clockwise as displayed, rows
// going down) and shifts by fractions uniform in [-max_translate, max_translate] of the width and
// height (sub-pixel shifts included). Each output pixel is sampled from the input at the inverse
// mapped point by bilinear interpolation; neighbours outside the input read `fill`. A draw of
// zero rotation and zero shift (always, when both maxima are 0) copies the input exactly.
// Draws: from context.rng(), three uniform floats (one word each): angle, shift x, shift y.
struct random_affine {
  using transform_category = transform_tag;

  double max_translate = 0.1;        // fraction of width / height, in [0, 1]
  double max_rotate_degrees = 10.0;  // in [0, 180]
  float fill = 0.0f;                 // value outside the input

  sample_shape output_shape(const sample_shape& in) const {
    if (!(max_translate >= 0.0 && max_translate <= 1.0)) {
      detail::throw_invalid("random_affine", "max_translate must be in [0, 1], got " +
                                                 detail::format_number(max_translate));
    }
    if (!(max_rotate_degrees >= 0.0 && max_rotate_degrees <= 180.0)) {
      detail::throw_invalid("random_affine", "max_rotate_degrees must be in [0, 180], got " +
                                                 detail::format_number(max_rotate_degrees));
    }
    detail::check_finite("random_affine", "fill", fill);
    detail::check_image_shape("random_affine", in);
    return in;
  }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context& context) const {
    rng_stream rng = context.rng();
    const auto rotate = static_cast<float>(max_rotate_degrees);
    const auto translate = static_cast<float>(max_translate);
    const float angle_degrees = rng.uniform(-rotate, rotate);
    const float shift_x_fraction = rng.uniform(-translate, translate);
    const float shift_y_fraction = rng.uniform(-translate, translate);
    if (angle_degrees == 0.0f && shift_x_fraction == 0.0f && shift_y_fraction == 0.0f) {
      detail::copy_sample(in, out);
      return;
    }

    const auto height = static_cast<std::ptrdiff_t>(in_shape.height);
    const auto width = static_cast<std::ptrdiff_t>(in_shape.width);
    const double angle = static_cast<double>(angle_degrees) * (std::numbers::pi / 180.0);
    const double cosine = std::cos(angle);
    const double sine = std::sin(angle);
    const double center_x = 0.5 * static_cast<double>(width - 1);
    const double center_y = 0.5 * static_cast<double>(height - 1);
    const double shift_x = static_cast<double>(shift_x_fraction) * static_cast<double>(width);
    const double shift_y = static_cast<double>(shift_y_fraction) * static_cast<double>(height);
    const std::size_t plane = in_shape.plane();

    for (std::ptrdiff_t y = 0; y < height; ++y) {
      for (std::ptrdiff_t x = 0; x < width; ++x) {
        // The inverse map: undo the shift, then rotate back by -angle about the center.
        const double dx = static_cast<double>(x) - center_x - shift_x;
        const double dy = static_cast<double>(y) - center_y - shift_y;
        const double source_x = cosine * dx - sine * dy + center_x;
        const double source_y = sine * dx + cosine * dy + center_y;
        const std::size_t target = static_cast<std::size_t>(y * width + x);
        if (!(source_x > -1.0 && source_x < static_cast<double>(width) && source_y > -1.0 &&
              source_y < static_cast<double>(height))) {
          for (std::size_t c = 0; c < in_shape.channels; ++c) {
            out[c * plane + target] = fill;
          }
          continue;
        }
        const double floor_x = std::floor(source_x);
        const double floor_y = std::floor(source_y);
        const auto x0 = static_cast<std::ptrdiff_t>(floor_x);
        const auto y0 = static_cast<std::ptrdiff_t>(floor_y);
        const auto weight_x = static_cast<float>(source_x - floor_x);
        const auto weight_y = static_cast<float>(source_y - floor_y);
        const bool in_x0 = x0 >= 0;
        const bool in_x1 = x0 + 1 < width;
        const bool in_y0 = y0 >= 0;
        const bool in_y1 = y0 + 1 < height;
        for (std::size_t c = 0; c < in_shape.channels; ++c) {
          const float* source = in.data() + c * plane;
          const auto at = [&](bool inside, std::ptrdiff_t yy, std::ptrdiff_t xx) {
            return inside ? source[yy * width + xx] : fill;
          };
          const float v00 = at(in_y0 && in_x0, y0, x0);
          const float v01 = at(in_y0 && in_x1, y0, x0 + 1);
          const float v10 = at(in_y1 && in_x0, y0 + 1, x0);
          const float v11 = at(in_y1 && in_x1, y0 + 1, x0 + 1);
          // Interpolation in the a + w * (b - a) form returns a constant neighbourhood exactly.
          const float top = v00 + weight_x * (v01 - v00);
          const float bottom = v10 + weight_x * (v11 - v10);
          out[c * plane + target] = top + weight_y * (bottom - top);
        }
      }
    }
  }

  bool operator==(const random_affine&) const = default;
};

inline std::string to_string(const random_affine& t) {
  return "random_affine{.max_translate = " + detail::format_number(t.max_translate) +
         ", .max_rotate_degrees = " + detail::format_number(t.max_rotate_degrees) +
         ", .fill = " + detail::format_number(t.fill) + "}";
}

static_assert(check_transform<random_affine>());

// ---- random_erasing -----------------------------------------------------------------------------

// Random erasing (Zhong et al., "Random Erasing Data Augmentation", AAAI 2020): with the given
// probability, sets one rectangle to `value` in every channel. Up to `attempts` times it draws an
// area fraction uniform in [area_min, area_max] and an aspect ratio (height / width) log-uniform
// in [aspect_min, aspect_max], rounds the rectangle's sides to pixels and clips them to the
// image; the first rectangle whose pixel area is still within [area_min, area_max] of the image
// is placed uniformly inside it. If no attempt fits, the image is copied unchanged.
// Draws: context.rng(0): one bernoulli (two words). context.rng(1): two uniform doubles (four
// words) per attempt made. context.rng(2), once a rectangle of h x w fits: top =
// uniform_int(height - h + 1), left = uniform_int(width - w + 1) (one word each).
struct random_erasing {
  using transform_category = transform_tag;

  static constexpr std::size_t max_attempts = 100;

  double probability = 0.5;   // in [0, 1]
  double area_min = 0.02;     // fraction of the image area, in (0, area_max]
  double area_max = 0.33;     // in [area_min, 1]
  double aspect_min = 0.3;    // height / width, in (0, aspect_max]
  double aspect_max = 3.3;    // finite, at least aspect_min
  float value = 0.0f;         // written into the rectangle
  std::size_t attempts = 10;  // in [1, max_attempts]

  sample_shape output_shape(const sample_shape& in) const {
    detail::check_probability("random_erasing", "probability", probability);
    if (!(area_min > 0.0 && area_min <= 1.0)) {
      detail::throw_invalid("random_erasing",
                            "area_min must be in (0, 1], got " + detail::format_number(area_min));
    }
    if (!(area_max >= area_min && area_max <= 1.0)) {
      detail::throw_invalid("random_erasing", "area_max must be in [area_min, 1] = [" +
                                                  detail::format_number(area_min) + ", 1], got " +
                                                  detail::format_number(area_max));
    }
    if (!(aspect_min > 0.0 && std::isfinite(aspect_min))) {
      detail::throw_invalid("random_erasing", "aspect_min must be positive and finite, got " +
                                                  detail::format_number(aspect_min));
    }
    if (!(aspect_max >= aspect_min && std::isfinite(aspect_max))) {
      detail::throw_invalid("random_erasing", "aspect_max must be finite and at least aspect_min " +
                                                  detail::format_number(aspect_min) + ", got " +
                                                  detail::format_number(aspect_max));
    }
    detail::check_finite("random_erasing", "value", value);
    if (attempts < 1 || attempts > max_attempts) {
      detail::throw_invalid("random_erasing", "attempts must be in [1, " +
                                                  detail::format_number(max_attempts) + "], got " +
                                                  detail::format_number(attempts));
    }
    detail::check_image_shape("random_erasing", in);
    return in;
  }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context& context) const {
    detail::copy_sample(in, out);
    rng_stream decide = context.rng(0);
    if (!decide.bernoulli(probability)) {
      return;
    }
    const auto height = static_cast<double>(in_shape.height);
    const auto width = static_cast<double>(in_shape.width);
    const double image_area = height * width;
    const double smallest = area_min * image_area;
    const double largest = area_max * image_area;
    const double log_aspect_min = std::log(aspect_min);
    const double log_aspect_max = std::log(aspect_max);
    rng_stream shapes = context.rng(1);
    for (std::size_t attempt = 0; attempt < attempts; ++attempt) {
      const double area = shapes.uniform(area_min, area_max) * image_area;
      const double aspect = std::exp(shapes.uniform(log_aspect_min, log_aspect_max));
      const double rows = std::round(std::min(std::sqrt(area * aspect), height));
      const double columns = std::round(std::min(std::sqrt(area / aspect), width));
      const double erased = rows * columns;
      if (rows < 1.0 || columns < 1.0 || erased < smallest || erased > largest) {
        continue;
      }
      const auto h = static_cast<std::size_t>(rows);
      const auto w = static_cast<std::size_t>(columns);
      rng_stream place = context.rng(2);
      const auto top = static_cast<std::size_t>(place.uniform_int(in_shape.height - h + 1));
      const auto left = static_cast<std::size_t>(place.uniform_int(in_shape.width - w + 1));
      for (std::size_t c = 0; c < in_shape.channels; ++c) {
        float* plane = out.data() + c * in_shape.plane();
        for (std::size_t y = top; y < top + h; ++y) {
          float* row = plane + y * in_shape.width;
          std::fill(row + left, row + left + w, value);
        }
      }
      return;
    }
  }

  bool operator==(const random_erasing&) const = default;
};

inline std::string to_string(const random_erasing& t) {
  return "random_erasing{.probability = " + detail::format_number(t.probability) +
         ", .area_min = " + detail::format_number(t.area_min) +
         ", .area_max = " + detail::format_number(t.area_max) +
         ", .aspect_min = " + detail::format_number(t.aspect_min) +
         ", .aspect_max = " + detail::format_number(t.aspect_max) +
         ", .value = " + detail::format_number(t.value) +
         ", .attempts = " + detail::format_number(t.attempts) + "}";
}

static_assert(check_transform<random_erasing>());

// ---- gaussian_noise -----------------------------------------------------------------------------

// out = clamp(in + mean + stddev * z, clamp_min, clamp_max) with z an independent standard normal
// per element. stddev 0 draws nothing; stddev 0 and mean 0 with the default (infinite) clamps is
// the identity, bit for bit. NaN inputs stay NaN.
// Draws (stddev > 0): from context.rng(), one normal_float (two words) per element, in memory
// order.
struct gaussian_noise {
  using transform_category = transform_tag;

  float stddev = 0.05f;                                       // finite, >= 0
  float mean = 0.0f;                                          // finite
  float clamp_min = -std::numeric_limits<float>::infinity();  // default: no lower bound
  float clamp_max = std::numeric_limits<float>::infinity();   // at least clamp_min

  sample_shape output_shape(const sample_shape& in) const {
    if (!(stddev >= 0.0f && std::isfinite(stddev))) {
      detail::throw_invalid("gaussian_noise",
                            "stddev must be finite and >= 0, got " + detail::format_number(stddev));
    }
    detail::check_finite("gaussian_noise", "mean", mean);
    if (std::isnan(clamp_min) || std::isnan(clamp_max) || clamp_min > clamp_max) {
      detail::throw_invalid("gaussian_noise", "clamp_min must be at most clamp_max, got " +
                                                  detail::format_number(clamp_min) + " and " +
                                                  detail::format_number(clamp_max));
    }
    detail::check_image_shape("gaussian_noise", in);
    return in;
  }

  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context& context) const {
    assert(in.size() == out.size() && "gaussian_noise: in and out sizes differ");
    // std::max / std::min keep -0.0 and NaN as they are.
    const auto clamp = [this](float v) { return std::min(std::max(v, clamp_min), clamp_max); };
    if (stddev == 0.0f) {
      for (std::size_t i = 0; i < in.size(); ++i) {
        out[i] = clamp(mean == 0.0f ? in[i] : in[i] + mean);
      }
      return;
    }
    rng_stream rng = context.rng();
    for (std::size_t i = 0; i < in.size(); ++i) {
      out[i] = clamp(in[i] + (mean + stddev * rng.normal_float()));
    }
  }

  bool operator==(const gaussian_noise&) const = default;
};

inline std::string to_string(const gaussian_noise& t) {
  return "gaussian_noise{.stddev = " + detail::format_number(t.stddev) +
         ", .mean = " + detail::format_number(t.mean) +
         ", .clamp_min = " + detail::format_number(t.clamp_min) +
         ", .clamp_max = " + detail::format_number(t.clamp_max) + "}";
}

static_assert(check_transform<gaussian_noise>());

// ---- normalize ----------------------------------------------------------------------------------

// out = (in - mean[c]) / stddev[c] per channel c; a vector of one value serves every channel.
// The defaults are Fashion-MNIST's training-set mean and standard deviation. Draws nothing.
struct normalize {
  using transform_category = transform_tag;

  std::vector<float> mean = {0.2860f};    // one value, or one per channel; finite
  std::vector<float> stddev = {0.3530f};  // one value, or one per channel; finite, > 0

  sample_shape output_shape(const sample_shape& in) const {
    detail::check_image_shape("normalize", in);
    check_sizes("mean", mean.size(), in.channels);
    check_sizes("stddev", stddev.size(), in.channels);
    for (std::size_t c = 0; c < mean.size(); ++c) {
      if (!std::isfinite(mean[c])) {
        detail::throw_invalid("normalize", "mean[" + std::to_string(c) + "] must be finite, got " +
                                               detail::format_number(mean[c]));
      }
    }
    for (std::size_t c = 0; c < stddev.size(); ++c) {
      if (!(stddev[c] > 0.0f && std::isfinite(stddev[c]))) {
        detail::throw_invalid("normalize", "stddev[" + std::to_string(c) +
                                               "] must be positive and finite, got " +
                                               detail::format_number(stddev[c]));
      }
    }
    return in;
  }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context&) const {
    assert(in.size() == out.size() && "normalize: in and out sizes differ");
    const std::size_t plane = in_shape.plane();
    for (std::size_t c = 0; c < in_shape.channels; ++c) {
      const float m = mean.size() == 1 ? mean[0] : mean[c];
      const float s = stddev.size() == 1 ? stddev[0] : stddev[c];
      for (std::size_t i = c * plane; i < (c + 1) * plane; ++i) {
        out[i] = (in[i] - m) / s;
      }
    }
  }

  bool operator==(const normalize&) const = default;

 private:
  static void check_sizes(std::string_view field, std::size_t size, std::size_t channels) {
    if (size != 1 && size != channels) {
      detail::throw_invalid("normalize",
                            std::string(field) + " must have 1 or " + std::to_string(channels) +
                                " values (one per channel), got " + std::to_string(size));
    }
  }
};

inline std::string to_string(const normalize& t) {
  const auto list = [](const std::vector<float>& values) {
    std::string text = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
      text += (i == 0 ? "" : ", ") + detail::format_number(values[i]);
    }
    return text + "}";
  };
  return "normalize{.mean = " + list(t.mean) + ", .stddev = " + list(t.stddev) + "}";
}

static_assert(check_transform<normalize>());

// ---- compose ------------------------------------------------------------------------------------

namespace detail {

template <class T>
concept printable_transform = requires(const T& t) {
  { to_string(t) } -> std::convertible_to<std::string>;
};

// Stage K of a compose's tuple, printed. A stateless stage prints like a fresh one: not reading
// it keeps GCC 12's -Wmaybe-uninitialized quiet about empty members of copied temporaries.
template <std::size_t K, class Tuple>
std::string stage_to_string(const Tuple& stages) {
  using stage_type = std::tuple_element_t<K, Tuple>;
  if constexpr (!printable_transform<stage_type>) {
    return "<transform without to_string>";
  } else if constexpr (std::is_empty_v<stage_type> && std::default_initializable<stage_type>) {
    return to_string(stage_type{});
  } else {
    return to_string(std::get<K>(stages));
  }
}

}  // namespace detail

// Runs its stages in order, each on the previous one's output; stage k draws from
// context.child(k). Itself a transform, so compositions nest. Zero stages copy the input.
// Intermediate samples live in per-thread scratch buffers that are reused across calls.
// Stages are reached through transform_traits, so tier-2 adapted types work as stages.
//
//   compose augment{random_crop{.padding = 2}, horizontal_flip{}, normalize{}};
//
// Class template argument deduction copies rather than nests when given a single compose
// (compose{c} is c); make_compose(c) or compose<decltype(c)>{c} nests it.
template <class... Ts>
class compose {
  static_assert(sizeof...(Ts) <= 15,
                "data: a compose holds at most 15 stages (transform_context::child)");
  static_assert((check_transform<Ts>() && ...));

 public:
  using transform_category = transform_tag;
  static constexpr std::size_t stage_count = sizeof...(Ts);

  std::tuple<Ts...> stages{};

  constexpr compose() requires(sizeof...(Ts) > 0) = default;
  constexpr compose(Ts... stage) : stages(std::move(stage)...) {}

  // Each stage's output_shape() in turn; a stage's error is rethrown as std::invalid_argument
  // prefixed with "compose stage k: ".
  sample_shape output_shape(const sample_shape& in) const { return shape_from<0>(in); }

  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context& context) const {
    if constexpr (sizeof...(Ts) == 0) {
      detail::copy_sample(in, out);
    } else if constexpr (sizeof...(Ts) == 1) {
      transform_traits<stage_type<0>>::apply(std::get<0>(stages), in, in_shape, out,
                                             context.child(0));
    } else {
      detail::scratch_lease scratch;
      apply_from<0>(in, in_shape, out, context, scratch);
    }
  }

  bool operator==(const compose&) const = default;

 private:
  template <std::size_t K>
  using stage_type = std::tuple_element_t<K, std::tuple<Ts...>>;

  template <std::size_t K>
  sample_shape shape_from(const sample_shape& in) const {
    if constexpr (K == sizeof...(Ts)) {
      return in;
    } else {
      sample_shape next{};
      try {
        next = transform_traits<stage_type<K>>::output_shape(std::get<K>(stages), in);
      } catch (const std::invalid_argument& error) {
        throw std::invalid_argument("compose stage " + std::to_string(K) + ": " + error.what());
      }
      return shape_from<K + 1>(next);
    }
  }

  template <std::size_t K>
  void apply_from(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
                  const transform_context& context, detail::scratch_lease& scratch) const {
    const stage_type<K>& stage = std::get<K>(stages);
    if constexpr (K + 1 == sizeof...(Ts)) {
      transform_traits<stage_type<K>>::apply(stage, in, in_shape, out, context.child(K));
    } else {
      const sample_shape next = transform_traits<stage_type<K>>::output_shape(stage, in_shape);
      // Stage K writes buffer K % 2 and stage K + 1 reads it, so a stage never reads the buffer
      // it writes.
      const std::span<float> buffer = scratch.get(K % 2, next.elements());
      transform_traits<stage_type<K>>::apply(stage, in, in_shape, buffer, context.child(K));
      apply_from<K + 1>(std::span<const float>(buffer), next, out, context, scratch);
    }
  }
};

template <class... Ts>
compose(Ts...) -> compose<Ts...>;

// A compose of the given stages; a single compose argument becomes a nested stage.
template <class... Ts>
compose<std::remove_cvref_t<Ts>...> make_compose(Ts&&... stages) {
  return compose<std::remove_cvref_t<Ts>...>(std::forward<Ts>(stages)...);
}

namespace detail {

template <class Tuple, std::size_t... K>
std::string stages_to_string(const Tuple& stages, std::index_sequence<K...>) {
  std::string text;
  ((text += (K == 0 ? "" : ", ") + stage_to_string<K>(stages)), ...);
  return text;
}

}  // namespace detail

template <class... Ts>
std::string to_string(const compose<Ts...>& t) {
  return "compose{" + detail::stages_to_string(t.stages, std::index_sequence_for<Ts...>{}) + "}";
}

static_assert(check_transform<compose<>>());
static_assert(check_transform<compose<identity, normalize>>());
static_assert(check_transform<compose<compose<random_crop>, horizontal_flip>>());

// ---- Fashion-MNIST ------------------------------------------------------------------------------

using fashion_mnist_augmentation_type =
    compose<random_crop, horizontal_flip, random_affine, random_erasing, normalize>;

// The training augmentation for 28 x 28 grayscale Fashion-MNIST in [0, 1]: crop with 2 pixels of
// padding, flip half the time, a small affine jitter, erasing a quarter of the time, then
// normalize with the training-set mean and standard deviation.
inline fashion_mnist_augmentation_type fashion_mnist_augmentation() {
  return fashion_mnist_augmentation_type{
      random_crop{.padding = 2, .fill = 0.0f},
      horizontal_flip{.probability = 0.5},
      random_affine{.max_translate = 0.05, .max_rotate_degrees = 8.0, .fill = 0.0f},
      random_erasing{.probability = 0.25},
      normalize{.mean = {0.2860f}, .stddev = {0.3530f}},
  };
}

// Evaluation: normalization only.
inline normalize fashion_mnist_normalize() {
  return normalize{.mean = {0.2860f}, .stddev = {0.3530f}};
}

}  // namespace strata::data
