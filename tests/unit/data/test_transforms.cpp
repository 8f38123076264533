// SPDX-License-Identifier: Apache-2.0
#include "strata/data/transforms.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/data/concepts.hpp"

namespace {

using strata::rng_stream;
using strata::data::compose;
using strata::data::gaussian_noise;
using strata::data::horizontal_flip;
using strata::data::identity;
using strata::data::normalize;
using strata::data::random_affine;
using strata::data::random_crop;
using strata::data::random_erasing;
using strata::data::sample_shape;
using strata::data::transform_context;

// Distinct values: element i holds i + 1.
std::vector<float> ramp(const sample_shape& shape) {
  std::vector<float> values(shape.elements());
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(i + 1);
  }
  return values;
}

std::vector<float> random_image(const sample_shape& shape, std::uint64_t seed) {
  rng_stream rng(seed);
  std::vector<float> values(shape.elements());
  for (float& v : values) {
    v = rng.uniform_float();
  }
  return values;
}

template <class T>
std::vector<float> run(const T& t, const std::vector<float>& in, const sample_shape& shape,
                       const transform_context& context) {
  std::vector<float> out(t.output_shape(shape).elements(), -12345.0f);
  t.apply(in, shape, out, context);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(no std::invalid_argument)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

transform_context context_of(std::uint64_t sample, std::uint32_t epoch = 0,
                             std::uint64_t seed = 42) {
  return transform_context{.seed = seed, .epoch = epoch, .sample_index = sample, .substream = 0};
}

// A user-defined transform: 1 - x. Printed through its own to_string.
struct invert {
  using transform_category = strata::data::transform_tag;

  sample_shape output_shape(const sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context&) const {
    for (std::size_t i = 0; i < in.size(); ++i) {
      out[i] = 1.0f - in[i];
    }
  }
  bool operator==(const invert&) const = default;
};
static_assert(strata::data::check_transform<invert>());

std::string to_string(const invert&) {
  return "invert{}";
}

// A user-defined random transform without to_string: adds one uniform draw to every element.
struct random_offset {
  using transform_category = strata::data::transform_tag;

  sample_shape output_shape(const sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context& context) const {
    rng_stream rng = context.rng();
    const float offset = rng.uniform_float();
    for (std::size_t i = 0; i < in.size(); ++i) {
      out[i] = in[i] + offset;
    }
  }
  bool operator==(const random_offset&) const = default;
};
static_assert(strata::data::check_transform<random_offset>());

// A user-defined shape change: keeps the first channel only.
struct first_channel {
  using transform_category = strata::data::transform_tag;

  sample_shape output_shape(const sample_shape& in) const {
    return sample_shape{.channels = 1, .height = in.height, .width = in.width};
  }
  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context&) const {
    std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(in_shape.plane()), out.begin());
  }
  bool operator==(const first_channel&) const = default;
};
static_assert(strata::data::check_transform<first_channel>());

// A user-defined shape change: every pixel becomes a 2 x 2 block.
struct upsample_2x {
  using transform_category = strata::data::transform_tag;

  sample_shape output_shape(const sample_shape& in) const {
    return sample_shape{.channels = in.channels, .height = 2 * in.height, .width = 2 * in.width};
  }
  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const transform_context&) const {
    const std::size_t width = 2 * in_shape.width;
    for (std::size_t c = 0; c < in_shape.channels; ++c) {
      for (std::size_t y = 0; y < 2 * in_shape.height; ++y) {
        for (std::size_t x = 0; x < width; ++x) {
          out[(c * 2 * in_shape.height + y) * width + x] =
              in[(c * in_shape.height + y / 2) * in_shape.width + x / 2];
        }
      }
    }
  }
  bool operator==(const upsample_2x&) const = default;
};
static_assert(strata::data::check_transform<upsample_2x>());

// Throws from apply() for sample 3.
struct fails_on_three {
  using transform_category = strata::data::transform_tag;

  sample_shape output_shape(const sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context& context) const {
    if (context.sample_index == 3) {
      throw std::runtime_error("fails_on_three");
    }
    std::copy(in.begin(), in.end(), out.begin());
  }
  bool operator==(const fails_on_three&) const = default;
};

// Same context twice gives the same bits; other samples, epochs and seeds give other output.
template <class T>
void check_deterministic(const T& t, const sample_shape& shape) {
  const std::vector<float> in = random_image(shape, 5);
  const std::vector<float> first = run(t, in, shape, context_of(0));
  CHECK(same_bits(first, run(t, in, shape, context_of(0))));
  bool other_sample = false;
  bool other_epoch = false;
  bool other_seed = false;
  for (std::uint32_t k = 1; k < 64; ++k) {
    other_sample = other_sample || !same_bits(first, run(t, in, shape, context_of(k)));
    other_epoch = other_epoch || !same_bits(first, run(t, in, shape, context_of(0, k)));
    other_seed = other_seed || !same_bits(first, run(t, in, shape, context_of(0, 0, 42 + k)));
  }
  CHECK(other_sample);
  CHECK(other_epoch);
  CHECK(other_seed);
}

}  // namespace

TEST_CASE("transforms keep the shape and print their numbers") {
  const sample_shape shape{.channels = 3, .height = 5, .width = 7};
  CHECK(identity{}.output_shape(shape) == shape);
  CHECK(random_crop{}.output_shape(shape) == shape);
  CHECK(horizontal_flip{}.output_shape(shape) == shape);
  CHECK(random_affine{}.output_shape(shape) == shape);
  CHECK(random_erasing{}.output_shape(shape) == shape);
  CHECK(gaussian_noise{}.output_shape(shape) == shape);
  CHECK(normalize{}.output_shape(shape) == shape);
  CHECK(normalize{.mean = {0.1f, 0.2f, 0.3f}, .stddev = {1.0f}}.output_shape(shape) == shape);

  CHECK(to_string(identity{}) == "identity{}");
  CHECK(to_string(random_crop{.padding = 4, .fill = 0.5f}) ==
        "random_crop{.padding = 4, .fill = 0.5}");
  CHECK(to_string(horizontal_flip{}) == "horizontal_flip{.probability = 0.5}");
  CHECK(to_string(random_affine{}) ==
        "random_affine{.max_translate = 0.1, .max_rotate_degrees = 10, .fill = 0}");
  CHECK(to_string(random_erasing{}) ==
        "random_erasing{.probability = 0.5, .area_min = 0.02, .area_max = 0.33, .aspect_min = "
        "0.3, .aspect_max = 3.3, .value = 0, .attempts = 10}");
  CHECK(to_string(gaussian_noise{}) ==
        "gaussian_noise{.stddev = 0.05, .mean = 0, .clamp_min = -inf, .clamp_max = inf}");
  CHECK(to_string(normalize{}) == "normalize{.mean = {0.286}, .stddev = {0.353}}");
  CHECK(to_string(normalize{.mean = {0.5f, 0.25f}, .stddev = {1.0f, 2.0f}}) ==
        "normalize{.mean = {0.5, 0.25}, .stddev = {1, 2}}");

  CHECK(random_crop{.padding = 2} == random_crop{.padding = 2, .fill = 0.0f});
  CHECK(random_crop{.padding = 2} != random_crop{.padding = 3});
  CHECK(normalize{} == strata::data::fashion_mnist_normalize());
  CHECK(normalize{.mean = {0.5f}} != normalize{});
}

TEST_CASE("output_shape rejects bad numbers and shapes, naming the transform and field") {
  const sample_shape shape{.channels = 1, .height = 28, .width = 28};
  const sample_shape empty{.channels = 1, .height = 0, .width = 28};
  const auto message = [&](const auto& t, const sample_shape& s) {
    return error_of([&] { (void)t.output_shape(s); });
  };

  CHECK(contains(message(random_crop{.padding = random_crop::max_padding + 1}, shape),
                 "random_crop: padding must be at most"));
  CHECK(contains(message(random_crop{.fill = std::numeric_limits<float>::quiet_NaN()}, shape),
                 "random_crop: fill must be finite"));
  CHECK(contains(message(random_crop{}, empty),
                 "random_crop: input shape must have channels, height and width of at least 1, "
                 "got 1x0x28"));

  CHECK(message(horizontal_flip{.probability = 1.5}, shape) ==
        "horizontal_flip: probability must be in [0, 1], got 1.5");
  CHECK(contains(message(horizontal_flip{.probability = -0.1}, shape), "probability"));
  CHECK(contains(message(horizontal_flip{.probability = std::nan("")}, shape), "probability"));
  CHECK(contains(message(horizontal_flip{}, empty), "horizontal_flip: input shape"));

  CHECK(message(random_affine{.max_translate = -0.1}, shape) ==
        "random_affine: max_translate must be in [0, 1], got -0.1");
  CHECK(contains(message(random_affine{.max_translate = 1.5}, shape), "max_translate"));
  CHECK(message(random_affine{.max_rotate_degrees = 200}, shape) ==
        "random_affine: max_rotate_degrees must be in [0, 180], got 200");
  CHECK(contains(message(random_affine{.max_rotate_degrees = -1}, shape), "max_rotate_degrees"));
  CHECK(contains(message(random_affine{.fill = std::numeric_limits<float>::infinity()}, shape),
                 "random_affine: fill must be finite"));
  CHECK(contains(message(random_affine{}, empty), "random_affine: input shape"));

  CHECK(message(random_erasing{.probability = 1.5}, shape) ==
        "random_erasing: probability must be in [0, 1], got 1.5");
  CHECK(contains(message(random_erasing{.area_min = 0.0}, shape), "random_erasing: area_min"));
  CHECK(contains(message(random_erasing{.area_min = 0.5, .area_max = 0.4}, shape),
                 "random_erasing: area_max"));
  CHECK(contains(message(random_erasing{.area_max = 1.5}, shape), "random_erasing: area_max"));
  CHECK(contains(message(random_erasing{.aspect_min = 0.0}, shape), "random_erasing: aspect_min"));
  CHECK(contains(message(random_erasing{.aspect_min = 2.0, .aspect_max = 1.0}, shape),
                 "random_erasing: aspect_max"));
  CHECK(contains(
      message(random_erasing{.aspect_max = std::numeric_limits<double>::infinity()}, shape),
      "random_erasing: aspect_max"));
  CHECK(contains(message(random_erasing{.value = std::nanf("")}, shape), "random_erasing: value"));
  CHECK(contains(message(random_erasing{.attempts = 0}, shape), "random_erasing: attempts"));
  CHECK(contains(message(random_erasing{.attempts = 101}, shape), "random_erasing: attempts"));
  CHECK(contains(message(random_erasing{}, empty), "random_erasing: input shape"));

  CHECK(message(gaussian_noise{.stddev = -1.0f}, shape) ==
        "gaussian_noise: stddev must be finite and >= 0, got -1");
  CHECK(contains(message(gaussian_noise{.stddev = std::numeric_limits<float>::infinity()}, shape),
                 "gaussian_noise: stddev"));
  CHECK(contains(message(gaussian_noise{.mean = std::nanf("")}, shape), "gaussian_noise: mean"));
  CHECK(contains(message(gaussian_noise{.clamp_min = 1.0f, .clamp_max = 0.0f}, shape),
                 "gaussian_noise: clamp_min must be at most clamp_max, got 1 and 0"));
  CHECK(contains(message(gaussian_noise{}, empty), "gaussian_noise: input shape"));

  const sample_shape rgb{.channels = 3, .height = 4, .width = 4};
  CHECK(message(normalize{.mean = {0.1f, 0.2f}, .stddev = {1.0f}}, rgb) ==
        "normalize: mean must have 1 or 3 values (one per channel), got 2");
  CHECK(contains(message(normalize{.mean = {}, .stddev = {1.0f}}, rgb), "normalize: mean must"));
  CHECK(contains(message(normalize{.mean = {0.0f}, .stddev = {1.0f, 2.0f}}, rgb),
                 "normalize: stddev must have 1 or 3 values"));
  CHECK(message(normalize{.mean = {0.0f}, .stddev = {1.0f, 0.0f, 1.0f}}, rgb) ==
        "normalize: stddev[1] must be positive and finite, got 0");
  CHECK(contains(message(normalize{.mean = {0.0f}, .stddev = {-1.0f}}, rgb), "stddev[0]"));
  CHECK(contains(message(normalize{.mean = {std::nanf("")}, .stddev = {1.0f}}, rgb),
                 "normalize: mean[0] must be finite"));
  CHECK(contains(message(normalize{}, empty), "normalize: input shape"));

  CHECK_THROWS_AS((void)random_erasing{.probability = 2.0}.output_shape(shape),
                  std::invalid_argument);
}

TEST_CASE("identity copies its input") {
  const sample_shape shape{.channels = 2, .height = 3, .width = 4};
  const std::vector<float> in = random_image(shape, 1);
  CHECK(same_bits(run(identity{}, in, shape, context_of(0)), in));
}

TEST_CASE("horizontal_flip mirrors rows with its probability") {
  const sample_shape shape{.channels = 2, .height = 3, .width = 5};
  const std::vector<float> in = ramp(shape);

  const horizontal_flip always{.probability = 1.0};
  const horizontal_flip never{.probability = 0.0};
  for (std::uint64_t sample = 0; sample < 32; ++sample) {
    const transform_context context = context_of(sample);
    const std::vector<float> once = run(always, in, shape, context);
    for (std::size_t row = 0; row < shape.channels * shape.height; ++row) {
      for (std::size_t x = 0; x < shape.width; ++x) {
        CHECK(once[row * shape.width + x] == in[row * shape.width + shape.width - 1 - x]);
      }
    }
    CHECK(same_bits(run(always, once, shape, context), in));
    CHECK(same_bits(run(never, in, shape, context), in));
  }

  // The decision is one bernoulli from context.rng().
  const horizontal_flip half{};
  int flipped = 0;
  for (std::uint64_t sample = 0; sample < 2000; ++sample) {
    const transform_context context = context_of(sample);
    rng_stream rng = context.rng();
    const bool expect_flip = rng.bernoulli(0.5);
    const std::vector<float> out = run(half, in, shape, context);
    CHECK(same_bits(out, expect_flip ? run(always, in, shape, context) : in));
    flipped += expect_flip ? 1 : 0;
  }
  CHECK(flipped > 900);
  CHECK(flipped < 1100);
}

TEST_CASE("random_crop is a shifted window of the padded input") {
  const sample_shape shape{.channels = 2, .height = 6, .width = 5};
  const std::vector<float> in = ramp(shape);

  for (std::uint64_t sample = 0; sample < 8; ++sample) {
    CHECK(
        same_bits(run(random_crop{.padding = 0, .fill = 9.0f}, in, shape, context_of(sample)), in));
  }

  for (const std::size_t padding : {std::size_t{1}, std::size_t{3}, std::size_t{7}}) {
    const random_crop crop{.padding = padding, .fill = -2.5f};
    for (std::uint64_t sample = 0; sample < 200; ++sample) {
      const transform_context context = context_of(sample, 3);
      rng_stream rng = context.rng();
      const auto top = static_cast<std::ptrdiff_t>(rng.uniform_int(2 * padding + 1));
      const auto left = static_cast<std::ptrdiff_t>(rng.uniform_int(2 * padding + 1));
      const auto pad = static_cast<std::ptrdiff_t>(padding);
      const std::vector<float> out = run(crop, in, shape, context);
      for (std::size_t c = 0; c < shape.channels; ++c) {
        for (std::ptrdiff_t y = 0; y < 6; ++y) {
          for (std::ptrdiff_t x = 0; x < 5; ++x) {
            const std::ptrdiff_t sy = y + top - pad;
            const std::ptrdiff_t sx = x + left - pad;
            const bool inside = sy >= 0 && sy < 6 && sx >= 0 && sx < 5;
            const float expected =
                inside ? in[c * shape.plane() + static_cast<std::size_t>(sy * 5 + sx)] : -2.5f;
            CHECK(out[c * shape.plane() + static_cast<std::size_t>(y * 5 + x)] == expected);
          }
        }
      }
    }
  }
}

TEST_CASE("random_affine with zero maxima is exactly the identity") {
  const sample_shape shape{.channels = 3, .height = 9, .width = 11};
  std::vector<float> in = random_image(shape, 9);
  in[0] = -0.0f;
  in[1] = 1e30f;
  in[2] = -7.0f;
  const random_affine still{.max_translate = 0.0, .max_rotate_degrees = 0.0, .fill = 5.0f};
  for (std::uint64_t sample = 0; sample < 16; ++sample) {
    CHECK(same_bits(run(still, in, shape, context_of(sample)), in));
  }
}

TEST_CASE("random_affine rotation keeps a constant image constant inside and the center fixed") {
  const sample_shape shape{.channels = 2, .height = 15, .width = 15};
  const std::vector<float> constant(shape.elements(), 0.75f);
  const random_affine rotate{.max_translate = 0.0, .max_rotate_degrees = 45.0, .fill = 0.0f};
  for (std::uint64_t sample = 0; sample < 50; ++sample) {
    const std::vector<float> out = run(rotate, constant, shape, context_of(sample));
    for (std::size_t c = 0; c < 2; ++c) {
      for (std::size_t y = 0; y < 15; ++y) {
        for (std::size_t x = 0; x < 15; ++x) {
          const float value = out[c * shape.plane() + y * 15 + x];
          const double dx = static_cast<double>(x) - 7.0;
          const double dy = static_cast<double>(y) - 7.0;
          if (dx * dx + dy * dy <= 6.0 * 6.0) {
            CHECK(value == 0.75f);
          }
          CHECK(value >= 0.0f);
          CHECK(value <= 0.75f);
        }
      }
    }
  }

  const std::vector<float> in = ramp(shape);
  bool changed = false;
  for (std::uint64_t sample = 0; sample < 20; ++sample) {
    const std::vector<float> out = run(rotate, in, shape, context_of(sample));
    CHECK(out[7 * 15 + 7] == in[7 * 15 + 7]);
    CHECK(out[shape.plane() + 7 * 15 + 7] == in[shape.plane() + 7 * 15 + 7]);
    changed = changed || !same_bits(out, in);
  }
  CHECK(changed);
}

TEST_CASE("random_affine maps pixels by the drawn rotation and shift") {
  // in(x, y) = x + 100 y is linear, so bilinear sampling returns the mapped point's value.
  const sample_shape shape{.channels = 1, .height = 21, .width = 17};
  std::vector<float> in(shape.elements());
  for (std::size_t y = 0; y < 21; ++y) {
    for (std::size_t x = 0; x < 17; ++x) {
      in[y * 17 + x] = static_cast<float>(x) + 100.0f * static_cast<float>(y);
    }
  }
  const random_affine affine{.max_translate = 0.1, .max_rotate_degrees = 20.0, .fill = -1.0f};
  for (std::uint64_t sample = 0; sample < 20; ++sample) {
    const transform_context context = context_of(sample);
    rng_stream rng = context.rng();
    const float angle_degrees = rng.uniform(-20.0f, 20.0f);
    const float shift_x = rng.uniform(-0.1f, 0.1f) * 17.0f;
    const float shift_y = rng.uniform(-0.1f, 0.1f) * 21.0f;
    CHECK(std::abs(angle_degrees) <= 20.0f);
    const double angle = angle_degrees * std::numbers::pi / 180.0;
    const std::vector<float> out = run(affine, in, shape, context);
    for (std::size_t y = 0; y < 21; ++y) {
      for (std::size_t x = 0; x < 17; ++x) {
        const double dx = static_cast<double>(x) - 8.0 - shift_x;
        const double dy = static_cast<double>(y) - 10.0 - shift_y;
        const double sx = std::cos(angle) * dx - std::sin(angle) * dy + 8.0;
        const double sy = std::sin(angle) * dx + std::cos(angle) * dy + 10.0;
        const float value = out[y * 17 + x];
        if (sx >= 0.0 && sx <= 16.0 && sy >= 0.0 && sy <= 20.0) {
          CHECK(value == doctest::Approx(sx + 100.0 * sy).epsilon(1e-4));
        } else if (sx <= -1.0 || sx >= 17.0 || sy <= -1.0 || sy >= 21.0) {
          CHECK(value == -1.0f);
        }
      }
    }
  }
}

TEST_CASE("random_erasing erases one rectangle within the area bounds") {
  const sample_shape shape{.channels = 1, .height = 28, .width = 28};
  const std::vector<float> ones(shape.elements(), 1.0f);

  for (std::uint64_t sample = 0; sample < 16; ++sample) {
    CHECK(
        same_bits(run(random_erasing{.probability = 0.0}, ones, shape, context_of(sample)), ones));
  }

  const random_erasing always{.probability = 1.0};
  const double image_area = 28.0 * 28.0;
  int erased_samples = 0;
  double smallest = 1.0;
  double largest = 0.0;
  for (std::uint64_t sample = 0; sample < 2000; ++sample) {
    const std::vector<float> out = run(always, ones, shape, context_of(sample));
    std::size_t count = 0;
    std::size_t top = 28;
    std::size_t bottom = 0;
    std::size_t left = 28;
    std::size_t right = 0;
    for (std::size_t y = 0; y < 28; ++y) {
      for (std::size_t x = 0; x < 28; ++x) {
        const float value = out[y * 28 + x];
        CHECK((value == 0.0f || value == 1.0f));
        if (value == 0.0f) {
          ++count;
          top = std::min(top, y);
          bottom = std::max(bottom, y);
          left = std::min(left, x);
          right = std::max(right, x);
        }
      }
    }
    if (count == 0) {
      continue;
    }
    ++erased_samples;
    CHECK(count == (bottom - top + 1) * (right - left + 1));  // one rectangle
    const double fraction = static_cast<double>(count) / image_area;
    CHECK(fraction >= always.area_min);
    CHECK(fraction <= always.area_max);
    smallest = std::min(smallest, fraction);
    largest = std::max(largest, fraction);
  }
  CHECK(erased_samples > 1900);
  CHECK(smallest < 0.05);
  CHECK(largest > 0.28);

  int half_erased = 0;
  const random_erasing half{.probability = 0.5};
  for (std::uint64_t sample = 0; sample < 2000; ++sample) {
    half_erased += same_bits(run(half, ones, shape, context_of(sample)), ones) ? 0 : 1;
  }
  CHECK(half_erased > 900);
  CHECK(half_erased < 1100);
}

TEST_CASE("random_erasing writes the same rectangle in every channel") {
  const sample_shape shape{.channels = 3, .height = 10, .width = 12};
  const std::vector<float> in = ramp(shape);
  const random_erasing erase{.probability = 1.0, .area_min = 0.1, .area_max = 0.4, .value = -3.0f};
  for (std::uint64_t sample = 0; sample < 100; ++sample) {
    const std::vector<float> out = run(erase, in, shape, context_of(sample));
    for (std::size_t i = 0; i < shape.plane(); ++i) {
      const bool erased = out[i] == -3.0f;
      for (std::size_t c = 0; c < 3; ++c) {
        const float value = out[c * shape.plane() + i];
        CHECK(value == (erased ? -3.0f : in[c * shape.plane() + i]));
      }
    }
  }
}

TEST_CASE("gaussian_noise has the configured mean and standard deviation") {
  const sample_shape shape{.channels = 1, .height = 256, .width = 256};
  const std::vector<float> zeros(shape.elements(), 0.0f);
  const std::vector<float> out =
      run(gaussian_noise{.stddev = 0.5f, .mean = 0.1f}, zeros, shape, context_of(0));
  double sum = 0.0;
  double square_sum = 0.0;
  for (const float v : out) {
    sum += v;
    square_sum += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(out.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(square_sum / n - mean * mean);
  CHECK(std::abs(mean - 0.1) < 0.01);
  CHECK(std::abs(stddev - 0.5) < 0.01);

  std::vector<float> in = random_image(shape, 3);
  in[0] = -0.0f;
  in[1] = std::numeric_limits<float>::quiet_NaN();
  in[2] = -std::numeric_limits<float>::infinity();
  CHECK(same_bits(run(gaussian_noise{.stddev = 0.0f}, in, shape, context_of(0)), in));

  const std::vector<float> clamped =
      run(gaussian_noise{.stddev = 0.5f, .clamp_min = 0.0f, .clamp_max = 1.0f}, in, shape,
          context_of(1));
  std::size_t at_min = 0;
  std::size_t at_max = 0;
  for (std::size_t i = 3; i < clamped.size(); ++i) {
    CHECK(clamped[i] >= 0.0f);
    CHECK(clamped[i] <= 1.0f);
    at_min += clamped[i] == 0.0f ? 1 : 0;
    at_max += clamped[i] == 1.0f ? 1 : 0;
  }
  CHECK(at_min > 1000);
  CHECK(at_max > 1000);

  const std::vector<float> shifted =
      run(gaussian_noise{.stddev = 0.0f, .mean = 2.0f}, in, shape, context_of(0));
  for (std::size_t i = 3; i < in.size(); ++i) {
    CHECK(shifted[i] == in[i] + 2.0f);
  }
}

TEST_CASE("normalize gives zero mean and unit deviation with the data's own statistics") {
  // A batch of 32 grayscale images normalized by the batch's mean and standard deviation.
  const sample_shape shape{.channels = 1, .height = 28, .width = 28};
  std::vector<std::vector<float>> batch;
  double sum = 0.0;
  double square_sum = 0.0;
  for (std::uint64_t i = 0; i < 32; ++i) {
    std::vector<float> image = random_image(shape, 100 + i);
    for (float& v : image) {
      v = 0.3f + 0.5f * v * v;
      sum += v;
      square_sum += static_cast<double>(v) * v;
    }
    batch.push_back(std::move(image));
  }
  const double count = 32.0 * static_cast<double>(shape.elements());
  const double mean = sum / count;
  const double stddev = std::sqrt(square_sum / count - mean * mean);
  const normalize norm{.mean = {static_cast<float>(mean)}, .stddev = {static_cast<float>(stddev)}};
  double out_sum = 0.0;
  double out_square_sum = 0.0;
  for (const std::vector<float>& image : batch) {
    for (const float v : run(norm, image, shape, context_of(0))) {
      out_sum += v;
      out_square_sum += static_cast<double>(v) * v;
    }
  }
  const double out_mean = out_sum / count;
  CHECK(std::abs(out_mean) < 1e-4);
  CHECK(std::abs(std::sqrt(out_square_sum / count - out_mean * out_mean) - 1.0) < 1e-3);

  // Per-channel numbers on a 3-channel image.
  const sample_shape rgb{.channels = 3, .height = 16, .width = 16};
  std::vector<float> image = random_image(rgb, 7);
  std::vector<float> means(3);
  std::vector<float> stddevs(3);
  for (std::size_t c = 0; c < 3; ++c) {
    double s = 0.0;
    double ss = 0.0;
    for (std::size_t i = c * rgb.plane(); i < (c + 1) * rgb.plane(); ++i) {
      image[i] = static_cast<float>(c) * 10.0f + (static_cast<float>(c) + 1.0f) * image[i];
      s += image[i];
      ss += static_cast<double>(image[i]) * image[i];
    }
    const double m = s / static_cast<double>(rgb.plane());
    means[c] = static_cast<float>(m);
    stddevs[c] = static_cast<float>(std::sqrt(ss / static_cast<double>(rgb.plane()) - m * m));
  }
  const std::vector<float> out =
      run(normalize{.mean = means, .stddev = stddevs}, image, rgb, context_of(0));
  for (std::size_t c = 0; c < 3; ++c) {
    double s = 0.0;
    double ss = 0.0;
    for (std::size_t i = c * rgb.plane(); i < (c + 1) * rgb.plane(); ++i) {
      CHECK(out[i] == (image[i] - means[c]) / stddevs[c]);
      s += out[i];
      ss += static_cast<double>(out[i]) * out[i];
    }
    const double m = s / static_cast<double>(rgb.plane());
    CHECK(std::abs(m) < 1e-4);
    CHECK(std::abs(std::sqrt(ss / static_cast<double>(rgb.plane()) - m * m) - 1.0) < 1e-3);
  }

  // One value serves every channel.
  const std::vector<float> broadcast =
      run(normalize{.mean = {0.5f}, .stddev = {2.0f}}, image, rgb, context_of(0));
  for (std::size_t i = 0; i < image.size(); ++i) {
    CHECK(broadcast[i] == (image[i] - 0.5f) / 2.0f);
  }
}

TEST_CASE("random transforms are deterministic per (seed, epoch, sample)") {
  const sample_shape shape{.channels = 2, .height = 12, .width = 10};
  check_deterministic(random_crop{.padding = 3}, shape);
  check_deterministic(horizontal_flip{}, shape);
  check_deterministic(random_affine{}, shape);
  check_deterministic(random_erasing{}, shape);
  check_deterministic(gaussian_noise{}, shape);
  check_deterministic(compose{random_crop{.padding = 1}, horizontal_flip{}, random_erasing{}},
                      shape);
  check_deterministic(strata::data::fashion_mnist_augmentation(),
                      sample_shape{.channels = 1, .height = 28, .width = 28});
}

TEST_CASE("compose runs stage k with context.child(k)") {
  const sample_shape shape{.channels = 1, .height = 8, .width = 9};
  const std::vector<float> in = random_image(shape, 11);
  const random_crop crop{.padding = 2, .fill = 0.0f};
  const horizontal_flip flip{};
  const gaussian_noise noise{.stddev = 0.1f};
  const compose chain{crop, flip, noise};
  static_assert(
      std::is_same_v<decltype(chain), const compose<random_crop, horizontal_flip, gaussian_noise>>);
  CHECK(chain.output_shape(shape) == shape);

  for (std::uint64_t sample = 0; sample < 32; ++sample) {
    const transform_context context = context_of(sample, 2);
    const std::vector<float> a = run(crop, in, shape, context.child(0));
    const std::vector<float> b = run(flip, a, shape, context.child(1));
    const std::vector<float> c = run(noise, b, shape, context.child(2));
    CHECK(same_bits(run(chain, in, shape, context), c));

    // Stages draw independently: dropping the noise leaves the first two stages' draws alone.
    CHECK(same_bits(run(compose{crop, flip}, in, shape, context), b));
    CHECK(
        same_bits(run(compose{crop, flip, gaussian_noise{.stddev = 0.0f}}, in, shape, context), b));

    // A nested compose is a stage like any other.
    const compose nested{compose{crop, flip}, noise};
    const std::vector<float> inner = run(compose{crop, flip}, in, shape, context.child(0));
    CHECK(same_bits(run(nested, in, shape, context), run(noise, inner, shape, context.child(1))));

    // One stage runs on the output buffer directly, still with child(0).
    CHECK(same_bits(run(compose{flip, identity{}}, in, shape, context),
                    run(flip, in, shape, context.child(0))));
    CHECK(same_bits(run(strata::data::make_compose(flip), in, shape, context),
                    run(flip, in, shape, context.child(0))));
  }

  // Zero stages copy.
  const compose<> none{};
  CHECK(none.output_shape(shape) == shape);
  CHECK(same_bits(run(none, in, shape, context_of(0)), in));
  CHECK(same_bits(run(compose{}, in, shape, context_of(0)), in));
  CHECK(to_string(none) == "compose{}");

  // make_compose always nests; deduction copies a lone compose.
  const compose pair{crop, flip};
  static_assert(std::is_same_v<decltype(strata::data::make_compose(pair)),
                               compose<compose<random_crop, horizontal_flip>>>);
  static_assert(std::is_same_v<decltype(compose{pair}), compose<random_crop, horizontal_flip>>);

  CHECK(chain == compose{crop, flip, noise});
  CHECK(chain != compose{crop, horizontal_flip{.probability = 1.0}, noise});
}

TEST_CASE("compose chains output shapes and reports the failing stage") {
  const sample_shape rgb{.channels = 3, .height = 8, .width = 8};
  const compose gray{first_channel{}, normalize{.mean = {0.5f}, .stddev = {0.25f}}};
  CHECK(gray.output_shape(rgb) == sample_shape{.channels = 1, .height = 8, .width = 8});
  const compose grow{upsample_2x{}, identity{}, upsample_2x{}};
  CHECK(grow.output_shape(rgb) == sample_shape{.channels = 3, .height = 32, .width = 32});

  const compose wrong{normalize{.mean = {0.1f, 0.2f}, .stddev = {1.0f}}, first_channel{}};
  CHECK(error_of([&] { (void)wrong.output_shape(rgb); }) ==
        "compose stage 0: normalize: mean must have 1 or 3 values (one per channel), got 2");
  const compose later{random_crop{}, random_erasing{.probability = 1.5}};
  CHECK(error_of([&] { (void)later.output_shape(rgb); }) ==
        "compose stage 1: random_erasing: probability must be in [0, 1], got 1.5");
  const compose outer{identity{}, compose{random_crop{}, horizontal_flip{.probability = 2.0}}};
  CHECK(error_of([&] { (void)outer.output_shape(rgb); }) ==
        "compose stage 1: compose stage 1: horizontal_flip: probability must be in [0, 1], got 2");

  // Intermediate shapes differ from input and output; buffers grow with larger samples.
  for (const std::size_t side : {std::size_t{2}, std::size_t{6}, std::size_t{3}}) {
    const sample_shape small{.channels = 2, .height = side, .width = side + 1};
    const std::vector<float> in = ramp(small);
    const std::vector<float> a = run(upsample_2x{}, in, small, context_of(0));
    const sample_shape twice = upsample_2x{}.output_shape(small);
    const std::vector<float> expected = run(upsample_2x{}, a, twice, context_of(0));
    CHECK(same_bits(run(grow, in, small, context_of(0)), expected));
    CHECK(same_bits(run(compose{grow, first_channel{}}, in, small, context_of(0)),
                    run(first_channel{}, expected, grow.output_shape(small), context_of(0))));
  }
}

TEST_CASE("user-defined transforms work inside compose") {
  const sample_shape shape{.channels = 1, .height = 6, .width = 6};
  const std::vector<float> in = random_image(shape, 4);
  const compose chain{random_crop{.padding = 1}, invert{}, random_offset{}};
  for (std::uint64_t sample = 0; sample < 16; ++sample) {
    const transform_context context = context_of(sample);
    const std::vector<float> a = run(random_crop{.padding = 1}, in, shape, context.child(0));
    const std::vector<float> b = run(invert{}, a, shape, context.child(1));
    rng_stream rng = context.child(2).rng();
    const float offset = rng.uniform_float();
    std::vector<float> expected = b;
    for (float& v : expected) {
      v += offset;
    }
    CHECK(same_bits(run(chain, in, shape, context), expected));
  }
  CHECK(to_string(chain) ==
        "compose{random_crop{.padding = 1, .fill = 0}, invert{}, <transform without to_string>}");
  CHECK(to_string(compose{compose{identity{}, invert{}}, horizontal_flip{}}) ==
        "compose{compose{identity{}, invert{}}, horizontal_flip{.probability = 0.5}}");

  // An exception from a stage leaves the scratch stack as it was.
  const compose failing{identity{}, compose{invert{}, fails_on_three{}, invert{}}, invert{}};
  CHECK_THROWS_AS(run(failing, in, shape, context_of(3)), std::runtime_error);
  CHECK(strata::data::detail::thread_scratch().depth == 0);
  CHECK(same_bits(run(failing, in, shape, context_of(2)), run(invert{}, in, shape, context_of(0))));
}

TEST_CASE("the Fashion-MNIST chains") {
  const sample_shape shape{.channels = 1, .height = 28, .width = 28};
  const auto augment = strata::data::fashion_mnist_augmentation();
  CHECK(augment.output_shape(shape) == shape);
  CHECK(augment == strata::data::fashion_mnist_augmentation());
  CHECK(std::get<0>(augment.stages) == random_crop{.padding = 2, .fill = 0.0f});
  CHECK(std::get<1>(augment.stages) == horizontal_flip{.probability = 0.5});
  CHECK(std::get<2>(augment.stages) ==
        random_affine{.max_translate = 0.05, .max_rotate_degrees = 8.0, .fill = 0.0f});
  CHECK(std::get<3>(augment.stages).probability == 0.25);
  CHECK(std::get<4>(augment.stages) == strata::data::fashion_mnist_normalize());
  CHECK(to_string(augment) ==
        "compose{random_crop{.padding = 2, .fill = 0}, horizontal_flip{.probability = 0.5}, "
        "random_affine{.max_translate = 0.05, .max_rotate_degrees = 8, .fill = 0}, "
        "random_erasing{.probability = 0.25, .area_min = 0.02, .area_max = 0.33, .aspect_min = "
        "0.3, .aspect_max = 3.3, .value = 0, .attempts = 10}, normalize{.mean = {0.286}, .stddev "
        "= {0.353}}}");

  const std::vector<float> in = random_image(shape, 8);
  const std::vector<float> evaluated =
      run(strata::data::fashion_mnist_normalize(), in, shape, context_of(0));
  for (std::size_t i = 0; i < in.size(); ++i) {
    CHECK(evaluated[i] == (in[i] - 0.2860f) / 0.3530f);
  }
  const std::vector<float> augmented = run(augment, in, shape, context_of(0));
  CHECK(augmented.size() == in.size());
  CHECK(std::all_of(augmented.begin(), augmented.end(), [](float v) { return std::isfinite(v); }));
}

TEST_CASE("apply from four threads equals the sequential results") {
  const sample_shape shape{.channels = 1, .height = 28, .width = 28};
  const compose augment{strata::data::fashion_mnist_augmentation(),
                        compose{gaussian_noise{.stddev = 0.1f}, invert{}}};
  constexpr std::size_t samples = 256;
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<float>> sequential;
  for (std::size_t i = 0; i < samples; ++i) {
    inputs.push_back(random_image(shape, 1000 + i));
    sequential.push_back(run(augment, inputs[i], shape, context_of(i, 4)));
  }
  std::vector<std::vector<float>> parallel(samples, std::vector<float>(shape.elements()));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < samples; i += 4) {
        augment.apply(inputs[i], shape, parallel[i], context_of(i, 4));
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (std::size_t i = 0; i < samples; ++i) {
    CHECK(same_bits(parallel[i], sequential[i]));
  }
}
