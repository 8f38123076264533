// SPDX-License-Identifier: Apache-2.0
#pragma once

// The element types of strata: the 16-bit floating-point host types float16 (IEEE binary16) and
// bfloat16 (the upper half of an IEEE binary32), and the dtype vocabulary that names every element
// type a buffer, a collective or a checkpoint may hold.
//
// float16 and bfloat16 store only their bits. Every conversion rounds to nearest, ties to even;
// NaN stays NaN (and comes out quiet), infinities and signed zeros are kept, values beyond the
// largest finite one become infinity, and float16 has gradual underflow through its subnormals.
// Arithmetic widens both operands to float, computes there and rounds back once. float carries at
// least twice the precision of either format plus two bits (24 >= 2 * 11 + 2), so + - * / give the
// correctly rounded IEEE result of the 16-bit operation.
//
// Conversion from other types is explicit (it may round); conversion to float is implicit (it is
// exact), so a 16-bit value mixed with a float, a double or an integer promotes to that type's
// arithmetic, the way float mixed with double does.

#include <array>
#include <bit>
#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "strata/core/error.hpp"

namespace strata {

namespace detail {

constexpr std::uint32_t float_bits(float x) noexcept {
  return std::bit_cast<std::uint32_t>(x);
}

constexpr float float_from_bits(std::uint32_t bits) noexcept {
  return std::bit_cast<float>(bits);
}

// Drops the low `shift` bits of `value` (1 <= shift <= 31) and rounds what remains to nearest,
// ties to even. A carry out of the kept mantissa moves into the exponent, as IEEE encodings want.
constexpr std::uint32_t round_bits_nearest_even(std::uint32_t value, int shift) noexcept {
  std::uint32_t kept = value >> shift;
  const std::uint32_t dropped = value & ((std::uint32_t{1} << shift) - 1u);
  const std::uint32_t halfway = std::uint32_t{1} << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (kept & 1u) != 0)) {
    ++kept;
  }
  return kept;
}

// float -> binary16 bits, round to nearest even.
constexpr std::uint16_t float_to_half_bits(float x) noexcept {
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: keep the top of the payload and set the quiet bit.
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu));
  }
  if (magnitude >= 0x477ff000u) {
    // At or above 65520, halfway between the largest finite value (65504) and 2^16: infinity.
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {
    // Normal (at least 2^-14): rebias the exponent from 127 to 15 and round the mantissa.
    return static_cast<std::uint16_t>(sign | round_bits_nearest_even(magnitude - 0x38000000u, 13));
  }
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 102) {
    // Below 2^-25, half the smallest subnormal: rounds to a signed zero.
    return static_cast<std::uint16_t>(sign);
  }
  // Subnormal result: the value is mantissa * 2^(exponent - 150); count it in units of 2^-24.
  const std::uint32_t mantissa = (magnitude & 0x007fffffu) | 0x00800000u;
  return static_cast<std::uint16_t>(
      sign | round_bits_nearest_even(mantissa, static_cast<int>(126 - exponent)));
}

// binary16 bits -> float (exact; a NaN comes out quiet with its payload).
constexpr float half_bits_to_float(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1fu;
  const std::uint32_t mantissa = half & 0x03ffu;
  if (exponent == 0x1fu) {
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return float_from_bits(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent != 0) {
    return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) {
    return float_from_bits(sign);
  }
  // Subnormal: mantissa * 2^-24; its leading one becomes the implicit bit of a normal float.
  const int lead = static_cast<int>(std::bit_width(mantissa)) - 1;
  const std::uint32_t fraction = (mantissa << (23 - lead)) & 0x007fffffu;
  return float_from_bits(sign | (static_cast<std::uint32_t>(lead + 103) << 23) | fraction);
}

// float -> bfloat16 bits, round to nearest even.
constexpr std::uint16_t float_to_bfloat16_bits(float x) noexcept {
  const std::uint32_t bits = float_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: the payload may lie entirely in the dropped half, so set the quiet bit explicitly.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<std::uint16_t>(round_bits_nearest_even(bits, 16));
}

// bfloat16 bits -> float (exact; a NaN comes out quiet).
constexpr float bfloat16_bits_to_float(std::uint16_t bf) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(bf) << 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return float_from_bits(nan ? bits | 0x00400000u : bits);
}

// Converts a wider floating-point value to float rounding to odd: an inexact result is the one of
// its two float neighbours whose last mantissa bit is 1. Rounding that float once more, to nearest
// even, into a format with at least two bits less precision gives the same result as rounding the
// original value there directly; it is how double and integer values reach float16 and bfloat16
// without the error of rounding twice. Values beyond the float range become infinity (both 16-bit
// formats overflow well below it).
template <std::floating_point T>
constexpr float to_float_round_odd(T x) noexcept {
  if (x != x) {
    return static_cast<float>(x);
  }
  const T magnitude = x < 0 ? -x : x;
  if (magnitude > static_cast<T>(std::numeric_limits<float>::max())) {
    return x < 0 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  const float nearest = static_cast<float>(x);
  if (static_cast<T>(nearest) == x) {
    return nearest;
  }
  std::uint32_t bits = float_bits(nearest);
  const float nearest_magnitude = nearest < 0 ? -nearest : nearest;
  if (static_cast<T>(nearest_magnitude) > magnitude) {
    --bits;  // step the magnitude back toward zero: the truncated value
  }
  return float_from_bits(bits | 1u);
}

template <class T>
concept convertible_integer = std::integral<T> && !std::same_as<T, bool> && sizeof(T) <= 8;

template <convertible_integer T>
constexpr float to_float_round_odd(T x) noexcept {
  // Conversion to uint64 is modulo 2^64, so negating there gives |x| even for the minimum.
  std::uint64_t magnitude = static_cast<std::uint64_t>(x);
  bool negative = false;
  if constexpr (std::is_signed_v<T>) {
    negative = x < 0;
    if (negative) {
      magnitude = 0 - magnitude;
    }
  }
  const int width = static_cast<int>(std::bit_width(magnitude));
  float result = 0.0f;
  if (width <= 24) {
    result = static_cast<float>(magnitude);  // exact
  } else {
    const int shift = width - 24;
    std::uint64_t kept = magnitude >> shift;
    if ((magnitude & ((std::uint64_t{1} << shift) - 1u)) != 0) {
      kept |= 1u;
    }
    // kept < 2^24 and the scale is a power of two: the product is exact.
    const float scale = float_from_bits(static_cast<std::uint32_t>(127 + shift) << 23);
    result = static_cast<float>(kept) * scale;
  }
  return negative ? -result : result;
}

// The types other than float that float16 and bfloat16 convert from: they go through
// to_float_round_odd, then through the float conversion.
template <class T>
concept rounds_through_float =
    (std::floating_point<T> && !std::same_as<T, float>) || convertible_integer<T>;

// Arithmetic and comparisons shared by float16 and bfloat16, as hidden friends: they are found
// only for the 16-bit types themselves, and a float16 mixed with another arithmetic type falls
// through to that type's built-in operators after the implicit widening to float.
template <class T>
struct narrow_float_operators {
  friend constexpr T operator+(T a) noexcept { return a; }
  friend constexpr T operator-(T a) noexcept {
    return T::from_bits(static_cast<std::uint16_t>(a.bits() ^ 0x8000u));
  }
  friend constexpr T operator+(T a, T b) noexcept {
    return T(static_cast<float>(a) + static_cast<float>(b));
  }
  friend constexpr T operator-(T a, T b) noexcept {
    return T(static_cast<float>(a) - static_cast<float>(b));
  }
  friend constexpr T operator*(T a, T b) noexcept {
    return T(static_cast<float>(a) * static_cast<float>(b));
  }
  friend constexpr T operator/(T a, T b) noexcept {
    return T(static_cast<float>(a) / static_cast<float>(b));
  }
  friend constexpr T& operator+=(T& a, T b) noexcept { return a = a + b; }
  friend constexpr T& operator-=(T& a, T b) noexcept { return a = a - b; }
  friend constexpr T& operator*=(T& a, T b) noexcept { return a = a * b; }
  friend constexpr T& operator/=(T& a, T b) noexcept { return a = a / b; }
  // IEEE comparisons: NaN is unordered and unequal to everything, -0 == +0.
  friend constexpr bool operator==(T a, T b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  friend constexpr std::partial_ordering operator<=>(T a, T b) noexcept {
    return static_cast<float>(a) <=> static_cast<float>(b);
  }
};

}  // namespace detail

// IEEE 754 binary16: 1 sign bit, 5 exponent bits, 10 mantissa bits. Largest finite 65504, smallest
// normal 2^-14, smallest subnormal 2^-24.
struct float16 : detail::narrow_float_operators<float16> {
  // Trivial, like float: `float16 x;` is uninitialized, `float16 x{};` is +0.
  float16() = default;
  explicit constexpr float16(float x) noexcept : bits_(detail::float_to_half_bits(x)) {}
  template <detail::rounds_through_float T>
  explicit constexpr float16(T x) noexcept : float16(detail::to_float_round_odd(x)) {}

  static constexpr float16 from_bits(std::uint16_t bits) noexcept {
    float16 out{};
    out.bits_ = bits;
    return out;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  constexpr operator float() const noexcept { return detail::half_bits_to_float(bits_); }

 private:
  std::uint16_t bits_;
};

// bfloat16: the upper 16 bits of a float. 1 sign bit, 8 exponent bits, 7 mantissa bits; the range
// of float (largest finite 3.3895314e38) with about 2 to 3 significant decimal digits.
struct bfloat16 : detail::narrow_float_operators<bfloat16> {
  // Trivial, like float: `bfloat16 x;` is uninitialized, `bfloat16 x{};` is +0.
  bfloat16() = default;
  explicit constexpr bfloat16(float x) noexcept : bits_(detail::float_to_bfloat16_bits(x)) {}
  template <detail::rounds_through_float T>
  explicit constexpr bfloat16(T x) noexcept : bfloat16(detail::to_float_round_odd(x)) {}

  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 out{};
    out.bits_ = bits;
    return out;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  constexpr operator float() const noexcept { return detail::bfloat16_bits_to_float(bits_); }

 private:
  std::uint16_t bits_;
};

using half = float16;
using fp16 = float16;
using bf16 = bfloat16;

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivially_copyable_v<bfloat16>);
static_assert(std::is_standard_layout_v<float16> && std::is_standard_layout_v<bfloat16>);

constexpr bool isnan(float16 x) noexcept {
  return (x.bits() & 0x7c00u) == 0x7c00u && (x.bits() & 0x03ffu) != 0;
}
constexpr bool isinf(float16 x) noexcept {
  return (x.bits() & 0x7fffu) == 0x7c00u;
}
constexpr bool isfinite(float16 x) noexcept {
  return (x.bits() & 0x7c00u) != 0x7c00u;
}

constexpr bool isnan(bfloat16 x) noexcept {
  return (x.bits() & 0x7f80u) == 0x7f80u && (x.bits() & 0x007fu) != 0;
}
constexpr bool isinf(bfloat16 x) noexcept {
  return (x.bits() & 0x7fffu) == 0x7f80u;
}
constexpr bool isfinite(bfloat16 x) noexcept {
  return (x.bits() & 0x7f80u) != 0x7f80u;
}

// ---------------------------------------------------------------------------------------------
// dtype: the name of an element type at run time.

// The element types of buffers, collectives and checkpoints. The numeric values are stable, so
// they may be stored (fingerprints, manifests); a new type is appended, never inserted.
enum class dtype : std::uint8_t {
  float32 = 0,   // float
  float64 = 1,   // double
  float16 = 2,   // strata::float16
  bfloat16 = 3,  // strata::bfloat16
  int32 = 4,     // std::int32_t
  int64 = 5,     // std::int64_t
  uint8 = 6,     // std::uint8_t
};

// Every dtype, in enum order.
inline constexpr std::array<dtype, 7> all_dtypes = {dtype::float32,  dtype::float64, dtype::float16,
                                                    dtype::bfloat16, dtype::int32,   dtype::int64,
                                                    dtype::uint8};

// True for exactly the seven C++ types that a dtype names (cv-unqualified, no references). On
// platforms where std::int64_t is long, long long is a different type and is not one of them.
template <class T>
concept arithmetic_dtype = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, float16> || std::same_as<T, bfloat16> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t>;

namespace detail {

template <class T>
consteval dtype dtype_of_impl() {
  static_assert(arithmetic_dtype<T>,
                "dtype_of<T>: T must be one of float, double, strata::float16, strata::bfloat16, "
                "std::int32_t, std::int64_t, std::uint8_t");
  if constexpr (std::same_as<T, double>) {
    return dtype::float64;
  } else if constexpr (std::same_as<T, float16>) {
    return dtype::float16;
  } else if constexpr (std::same_as<T, bfloat16>) {
    return dtype::bfloat16;
  } else if constexpr (std::same_as<T, std::int32_t>) {
    return dtype::int32;
  } else if constexpr (std::same_as<T, std::int64_t>) {
    return dtype::int64;
  } else if constexpr (std::same_as<T, std::uint8_t>) {
    return dtype::uint8;
  } else {
    return dtype::float32;
  }
}

[[noreturn]] inline void throw_invalid_dtype(std::string_view where, dtype type) {
  throw error(std::string(where) + ": invalid dtype value " +
              std::to_string(static_cast<unsigned>(type)));
}

}  // namespace detail

// The dtype of an element type: dtype_of<float> == dtype::float32. Any other type is a compile
// error that names the seven allowed ones.
template <class T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<T>();

// Bytes per element. Throws strata::error for a value outside the enum.
constexpr std::size_t size_of(dtype type) {
  switch (type) {
    case dtype::float32:
      return 4;
    case dtype::float64:
      return 8;
    case dtype::float16:
      return 2;
    case dtype::bfloat16:
      return 2;
    case dtype::int32:
      return 4;
    case dtype::int64:
      return 8;
    case dtype::uint8:
      return 1;
  }
  detail::throw_invalid_dtype("size_of", type);
}

// The config name of a dtype: "float32", "float64", "float16", "bfloat16", "int32", "int64",
// "uint8". These words are the values of config keys such as mixed_precision_dtype. A value outside
// the enum gives "unknown".
constexpr std::string_view to_string(dtype type) noexcept {
  switch (type) {
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::float16:
      return "float16";
    case dtype::bfloat16:
      return "bfloat16";
    case dtype::int32:
      return "int32";
    case dtype::int64:
      return "int64";
    case dtype::uint8:
      return "uint8";
  }
  return "unknown";
}

// The dtype whose config name is exactly `name` (case-sensitive, no aliases), or nullopt.
constexpr std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (const dtype type : all_dtypes) {
    if (to_string(type) == name) {
      return type;
    }
  }
  return std::nullopt;
}

// True for float32, float64, float16 and bfloat16.
constexpr bool is_floating(dtype type) noexcept {
  switch (type) {
    case dtype::float32:
    case dtype::float64:
    case dtype::float16:
    case dtype::bfloat16:
      return true;
    case dtype::int32:
    case dtype::int64:
    case dtype::uint8:
      return false;
  }
  return false;
}

}  // namespace strata

// numeric_limits for the 16-bit types, with the values of IEEE binary16 and of bfloat16.
namespace std {

template <>
struct numeric_limits<strata::float16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr strata::float16 min() noexcept { return strata::float16::from_bits(0x0400); }
  static constexpr strata::float16 lowest() noexcept { return strata::float16::from_bits(0xfbff); }
  static constexpr strata::float16 max() noexcept { return strata::float16::from_bits(0x7bff); }
  static constexpr strata::float16 epsilon() noexcept { return strata::float16::from_bits(0x1400); }
  static constexpr strata::float16 round_error() noexcept {
    return strata::float16::from_bits(0x3800);
  }
  static constexpr strata::float16 infinity() noexcept {
    return strata::float16::from_bits(0x7c00);
  }
  static constexpr strata::float16 quiet_NaN() noexcept {
    return strata::float16::from_bits(0x7e00);
  }
  static constexpr strata::float16 signaling_NaN() noexcept {
    return strata::float16::from_bits(0x7d00);
  }
  static constexpr strata::float16 denorm_min() noexcept {
    return strata::float16::from_bits(0x0001);
  }
};

template <>
struct numeric_limits<strata::bfloat16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = false;  // not one of the IEEE 754 interchange formats
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr strata::bfloat16 min() noexcept { return strata::bfloat16::from_bits(0x0080); }
  static constexpr strata::bfloat16 lowest() noexcept {
    return strata::bfloat16::from_bits(0xff7f);
  }
  static constexpr strata::bfloat16 max() noexcept { return strata::bfloat16::from_bits(0x7f7f); }
  static constexpr strata::bfloat16 epsilon() noexcept {
    return strata::bfloat16::from_bits(0x3c00);
  }
  static constexpr strata::bfloat16 round_error() noexcept {
    return strata::bfloat16::from_bits(0x3f00);
  }
  static constexpr strata::bfloat16 infinity() noexcept {
    return strata::bfloat16::from_bits(0x7f80);
  }
  static constexpr strata::bfloat16 quiet_NaN() noexcept {
    return strata::bfloat16::from_bits(0x7fc0);
  }
  static constexpr strata::bfloat16 signaling_NaN() noexcept {
    return strata::bfloat16::from_bits(0x7fa0);
  }
  static constexpr strata::bfloat16 denorm_min() noexcept {
    return strata::bfloat16::from_bits(0x0001);
  }
};

}  // namespace std
