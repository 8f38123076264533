// SPDX-License-Identifier: Apache-2.0
// float16 and bfloat16 against references that share no code with the library: values decoded
// with ldexp from the bit fields, and rounding done by searching the sorted table of every finite
// value of the format. Plus numeric_limits and the dtype vocabulary.
#include "strata/core/dtype.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using strata::bfloat16;
using strata::float16;

std::string hex(std::uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::uint32_t bits_of(float x) {
  return std::bit_cast<std::uint32_t>(x);
}
float float_of(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}

// A format described by its field widths; enough to decode it and to round into it.
struct format {
  int exponent_bits;
  int mantissa_bits;

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint32_t max_finite_bits() const {
    return ((std::uint32_t{1} << (exponent_bits + mantissa_bits)) - 1u) -
           ((std::uint32_t{1} << mantissa_bits) - 1u) - 1u;
  }
  std::uint32_t infinity_bits() const { return max_finite_bits() + 1u; }
  std::uint32_t sign_bit() const { return std::uint32_t{1} << (exponent_bits + mantissa_bits); }

  // The value of a bit pattern, from the IEEE definition.
  double decode(std::uint32_t bits) const {
    const bool negative = (bits & sign_bit()) != 0;
    const std::uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1u);
    const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1u);
    double magnitude = 0.0;
    if (exponent == (1u << exponent_bits) - 1u) {
      magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                                : std::numeric_limits<double>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias() - mantissa_bits);
    } else {
      magnitude = std::ldexp(static_cast<double>(mantissa + (1u << mantissa_bits)),
                             static_cast<int>(exponent) - bias() - mantissa_bits);
    }
    return negative ? -magnitude : magnitude;
  }
};

constexpr format binary16{5, 10};
constexpr format brain16{8, 7};

// Rounds a double into a format to nearest, ties to even, by search: table[i] is the value of the
// non-negative pattern i, and one entry past the largest finite value stands for the first value
// that no longer fits (2^(max exponent + 1)): a value at or past the midpoint below it overflows.
class rounding_reference {
 public:
  explicit rounding_reference(format f) : format_(f) {
    for (std::uint32_t bits = 0; bits <= f.max_finite_bits(); ++bits) {
      table_.push_back(f.decode(bits));
    }
    table_.push_back(std::ldexp(1.0, f.bias() + 1));
  }

  std::uint16_t round(double x) const {
    const std::uint32_t sign = std::signbit(x) ? format_.sign_bit() : 0u;
    const double magnitude = std::fabs(x);
    if (magnitude >= table_.back()) {
      return static_cast<std::uint16_t>(sign | format_.infinity_bits());
    }
    // The last entry not above the value, and the one after it.
    const auto above = std::upper_bound(table_.begin(), table_.end(), magnitude);
    const auto below_index = static_cast<std::uint32_t>(above - table_.begin()) - 1u;
    const double below = table_[below_index];
    const double midpoint = (below + table_[below_index + 1]) / 2;  // exact in double
    std::uint32_t result = below_index;
    if (magnitude > midpoint || (magnitude == midpoint && (below_index & 1u) != 0)) {
      result = below_index + 1;
    }
    return static_cast<std::uint16_t>(sign | result);
  }

  // Every midpoint between two neighbouring non-negative values, including the overflow one.
  std::vector<double> midpoints() const {
    std::vector<double> out;
    for (std::size_t i = 0; i + 1 < table_.size(); ++i) {
      out.push_back((table_[i] + table_[i + 1]) / 2);
    }
    return out;
  }

 private:
  format format_;
  std::vector<double> table_;
};

const rounding_reference& half_reference() {
  static const rounding_reference reference(binary16);
  return reference;
}

const rounding_reference& bfloat16_reference() {
  static const rounding_reference reference(brain16);
  return reference;
}

// bfloat16 from the float bits: keep the upper half, round by the lower half, ties to even.
std::uint16_t bfloat16_from_float_bits(std::uint32_t bits) {
  std::uint32_t upper = bits >> 16;
  const std::uint32_t lower = bits & 0xffffu;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0)) {
    ++upper;
  }
  return static_cast<std::uint16_t>(upper);
}

// Floats spread over every exponent and sign: every `stride`-th bit pattern, NaNs left out.
template <class F>
void for_sampled_floats(std::uint32_t stride, F&& visit) {
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += stride) {
    const float x = float_of(static_cast<std::uint32_t>(bits));
    if (!std::isnan(x)) {
      visit(x);
    }
  }
}

// Values at a midpoint and at the floats right beside it, both signs.
template <class F>
void for_floats_around(const std::vector<double>& midpoints, F&& visit) {
  for (const double midpoint : midpoints) {
    const auto center = static_cast<float>(midpoint);
    REQUIRE(static_cast<double>(center) == midpoint);
    for (const float x : {std::nextafter(center, 0.0f), center,
                          std::nextafter(center, std::numeric_limits<float>::infinity())}) {
      visit(x);
      visit(-x);
    }
  }
}

// Counts mismatches and keeps the first, so a failing sweep reports one input, not millions.
struct sweep {
  std::uint64_t checked = 0;
  std::uint64_t failed = 0;
  std::string first;

  // `describe` builds the message, only for the first failure.
  template <class Describe>
  void expect(bool ok, Describe&& describe) {
    ++checked;
    if (!ok && failed++ == 0) {
      first = describe();
    }
  }
};

#define CHECK_SWEEP(s)                  \
  do {                                  \
    INFO("first failure: ", (s).first); \
    CHECK((s).checked > 0);             \
    CHECK((s).failed == 0);             \
  } while (false)

}  // namespace

TEST_CASE("float16 decodes every bit pattern to its IEEE value") {
  sweep s;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float value = float16::from_bits(static_cast<std::uint16_t>(bits));
    const double expected = binary16.decode(bits);
    const bool ok = std::isnan(expected)
                        ? std::isnan(value) && std::signbit(value) == ((bits & 0x8000u) != 0)
                        : static_cast<double>(value) == expected &&
                              std::signbit(value) == std::signbit(expected);
    s.expect(ok, [&] { return hex(bits); });
  }
  CHECK_SWEEP(s);
}

TEST_CASE("float16 round trip of all 65536 bit patterns through float") {
  sweep s;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto original = float16::from_bits(static_cast<std::uint16_t>(bits));
    const float widened = original;
    const float16 back(widened);
    if (strata::isnan(original)) {
      // NaN stays NaN, comes back quiet, keeps its sign.
      s.expect(std::isnan(widened) && strata::isnan(back) && (back.bits() & 0x0200u) != 0 &&
                   (back.bits() & 0x8000u) == (bits & 0x8000u),
               [&] { return hex(bits) + " -> " + hex(back.bits()); });
    } else {
      s.expect(back.bits() == bits, [&] { return hex(bits) + " -> " + hex(back.bits()); });
    }
    s.expect(strata::isnan(original) == std::isnan(widened), [&] { return "isnan " + hex(bits); });
    s.expect(strata::isinf(original) == std::isinf(widened), [&] { return "isinf " + hex(bits); });
    s.expect(strata::isfinite(original) == std::isfinite(widened),
             [&] { return "isfinite " + hex(bits); });
  }
  CHECK_SWEEP(s);
}

TEST_CASE("float16 from float matches the reference rounding") {
  const auto& reference = half_reference();
  sweep s;
  const auto check = [&](float x) {
    const std::uint16_t expected = reference.round(x);
    const std::uint16_t got = float16(x).bits();
    s.expect(got == expected,
             [&] { return hex(bits_of(x)) + ": got " + hex(got) + ", expected " + hex(expected); });
  };
  SUBCASE("floats over the whole range") {
    for_sampled_floats(2039, check);
  }
  SUBCASE("at and beside every halfway point") {
    for_floats_around(reference.midpoints(), check);
  }
  CHECK_SWEEP(s);
}

TEST_CASE("float16 from float: ties to even, overflow, underflow, subnormals, signed zero") {
  const auto bits = [](float x) { return float16(x).bits(); };
  // Spacing 2^-10 above 1: halfway points go to the even neighbour.
  CHECK(bits(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(bits(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(bits(std::nextafter(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  // Spacing 2 in [2048, 4096).
  CHECK(bits(2049.0f) == 0x6800);
  CHECK(bits(2051.0f) == 0x6802);
  // Largest finite 65504; 65520 is halfway to 2^16 and rounds to infinity (65504 is odd).
  CHECK(bits(65504.0f) == 0x7bff);
  CHECK(bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(bits(65520.0f) == 0x7c00);
  CHECK(bits(-65520.0f) == 0xfc00);
  CHECK(bits(1e10f) == 0x7c00);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  // Smallest normal 2^-14, largest subnormal 1023 * 2^-24, halfway between them rounds up.
  CHECK(bits(0x1p-14f) == 0x0400);
  CHECK(bits(1023 * 0x1p-24f) == 0x03ff);
  CHECK(bits(1023.5f * 0x1p-24f) == 0x0400);
  CHECK(bits(1022.5f * 0x1p-24f) == 0x03fe);
  // Smallest subnormal 2^-24; 2^-25 is halfway to zero and goes to zero; just above goes up.
  CHECK(bits(0x1p-24f) == 0x0001);
  CHECK(bits(0x1p-25f) == 0x0000);
  CHECK(bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(bits(3 * 0x1p-25f) == 0x0002);
  CHECK(bits(-0x1p-25f) == 0x8000);
  CHECK(bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  // Signed zero.
  CHECK(bits(0.0f) == 0x0000);
  CHECK(bits(-0.0f) == 0x8000);
  CHECK(bits(-1e-10f) == 0x8000);
  // NaN: quiet, payload kept where it fits, sign kept.
  CHECK(strata::isnan(float16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(strata::isnan(float16(std::numeric_limits<float>::signaling_NaN())));
  CHECK((float16(std::numeric_limits<float>::signaling_NaN()).bits() & 0x0200u) != 0);
  CHECK(strata::isnan(float16(float_of(0x7f800001u))));  // payload only in dropped bits
  CHECK(float16(float_of(0xffc00000u)).bits() == 0xfe00);
  // Exact values.
  CHECK(bits(1.0f) == 0x3c00);
  CHECK(bits(-2.0f) == 0xc000);
  CHECK(bits(0.5f) == 0x3800);
  CHECK(static_cast<float>(float16(0.1f)) == 0.0999755859375f);
}

TEST_CASE("float16 from double and integers rounds once") {
  const auto& reference = half_reference();
  sweep s;
  for (const double midpoint : reference.midpoints()) {
    // A double just beside a float16 halfway point rounds to the same float as the halfway point;
    // rounding that float again would take the tie. The direct result must not.
    for (const double x : {midpoint, midpoint * (1 + 0x1p-40), midpoint * (1 - 0x1p-40)}) {
      s.expect(float16(x).bits() == reference.round(x),
               [&] { return "double " + std::to_string(x); });
      s.expect(float16(-x).bits() == reference.round(-x),
               [&] { return "double " + std::to_string(-x); });
    }
  }
  for (std::int32_t i = -70000; i <= 70000; ++i) {
    s.expect(float16(i).bits() == reference.round(i), [&] { return "int " + std::to_string(i); });
  }
  CHECK_SWEEP(s);
  CHECK(float16(1.0 + 0x1p-11 + 0x1p-40).bits() == 0x3c01);
  CHECK(float16(1.0 + 0x1p-11).bits() == 0x3c00);
  CHECK(float16(1.0L + 0x1p-11L + 0x1p-40L).bits() == 0x3c01);
  CHECK(float16(1e300).bits() == 0x7c00);
  CHECK(float16(-1e300).bits() == 0xfc00);
  CHECK(float16(1e-300).bits() == 0x0000);
  CHECK(float16(-1e-300).bits() == 0x8000);
  CHECK(float16(std::numeric_limits<double>::denorm_min()).bits() == 0x0000);
  CHECK(strata::isnan(float16(std::numeric_limits<double>::quiet_NaN())));
  CHECK(float16(2049).bits() == 0x6800);
  CHECK(float16(2051u).bits() == 0x6802);
  CHECK(float16(std::int64_t{1} << 40).bits() == 0x7c00);
  CHECK(float16(std::numeric_limits<std::int64_t>::min()).bits() == 0xfc00);
  CHECK(float16(std::uint8_t{255}).bits() == 0x5bf8);
}

TEST_CASE("bfloat16 decodes every bit pattern to the upper half of a float") {
  sweep s;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto original = bfloat16::from_bits(static_cast<std::uint16_t>(bits));
    const float value = original;
    const double expected = brain16.decode(bits);
    if (std::isnan(expected)) {
      s.expect(std::isnan(value) && strata::isnan(original), [&] { return hex(bits); });
      s.expect((bits_of(value) & 0x00400000u) != 0, [&] { return "quiet " + hex(bits); });
    } else {
      s.expect(bits_of(value) == bits << 16, [&] { return hex(bits); });
      s.expect(static_cast<double>(value) == expected, [&] { return hex(bits); });
    }
    const bfloat16 back(value);
    if (std::isnan(expected)) {
      s.expect(strata::isnan(back) && (back.bits() & 0x8000u) == (bits & 0x8000u),
               [&] { return "round trip " + hex(bits); });
    } else {
      s.expect(back.bits() == bits, [&] { return "round trip " + hex(bits); });
    }
    s.expect(strata::isinf(original) == std::isinf(value), [&] { return "isinf " + hex(bits); });
    s.expect(strata::isfinite(original) == std::isfinite(value),
             [&] { return "isfinite " + hex(bits); });
  }
  CHECK_SWEEP(s);
}

TEST_CASE("bfloat16 from float matches rounding computed from the float bits") {
  sweep s;
  const auto check = [&](float x) {
    const std::uint16_t expected = bfloat16_from_float_bits(bits_of(x));
    const std::uint16_t got = bfloat16(x).bits();
    s.expect(got == expected,
             [&] { return hex(bits_of(x)) + ": got " + hex(got) + ", expected " + hex(expected); });
    s.expect(bfloat16_reference().round(x) == expected,
             [&] { return "table reference " + hex(bits_of(x)); });
  };
  SUBCASE("floats over the whole range") {
    for_sampled_floats(4093, check);
  }
  SUBCASE("at and beside every halfway point") {
    for (std::uint32_t upper = 0; upper < 0x7f80u; ++upper) {
      const std::uint32_t tie = (upper << 16) | 0x8000u;
      for (const std::uint32_t bits : {tie - 1, tie, tie + 1}) {
        check(float_of(bits));
        check(float_of(bits | 0x80000000u));
      }
    }
  }
  CHECK_SWEEP(s);
}

TEST_CASE("bfloat16 from float: ties to even, overflow, subnormals, NaN") {
  const auto bits = [](float x) { return bfloat16(x).bits(); };
  CHECK(bits(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(bits(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(bits(std::nextafter(1.0f + 0x1p-8f, 2.0f)) == 0x3f81);
  CHECK(bits(257.0f) == 0x4380);  // spacing 2 in [256, 512): 257 ties to 256
  CHECK(bits(259.0f) == 0x4382);
  // Largest finite 0x7f7f = 3.3895314e38; halfway above it rounds to infinity.
  CHECK(bits(3.3895314e38f) == 0x7f7f);
  CHECK(bits(float_of(0x7f7f7fffu)) == 0x7f7f);
  CHECK(bits(float_of(0x7f7f8000u)) == 0x7f80);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  // Subnormals of bfloat16 are the float subnormals with 7 mantissa bits.
  CHECK(bits(0x1p-133f) == 0x0001);
  CHECK(bits(0x1p-134f) == 0x0000);
  CHECK(bits(3 * 0x1p-134f) == 0x0002);
  CHECK(bits(std::numeric_limits<float>::min()) == 0x0080);
  CHECK(bits(-0.0f) == 0x8000);
  CHECK(bits(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(bfloat16(float_of(0x7f800001u)).bits() == 0x7fc0);  // payload only in dropped bits
  CHECK(bfloat16(float_of(0xffc00000u)).bits() == 0xffc0);
  CHECK(static_cast<float>(bfloat16(0.1f)) == 0.10009765625f);
}

TEST_CASE("bfloat16 from double and integers rounds once") {
  const auto& reference = bfloat16_reference();
  sweep s;
  for (const double midpoint : reference.midpoints()) {
    for (const double x : {midpoint, midpoint * (1 + 0x1p-40), midpoint * (1 - 0x1p-40)}) {
      s.expect(bfloat16(x).bits() == reference.round(x),
               [&] { return "double " + std::to_string(x); });
      s.expect(bfloat16(-x).bits() == reference.round(-x),
               [&] { return "double " + std::to_string(-x); });
    }
  }
  for (std::int32_t i = -5000; i <= 5000; ++i) {
    s.expect(bfloat16(i).bits() == reference.round(i), [&] { return "int " + std::to_string(i); });
  }
  CHECK_SWEEP(s);
  CHECK(bfloat16(1.0 + 0x1p-8 + 0x1p-40).bits() == 0x3f81);
  CHECK(bfloat16(1.0 + 0x1p-8).bits() == 0x3f80);
  CHECK(bfloat16(1e300).bits() == 0x7f80);
  CHECK(bfloat16(-1e300).bits() == 0xff80);
  CHECK(bfloat16(1e-300).bits() == 0x0000);
  CHECK(bfloat16(-1e-300).bits() == 0x8000);
  // 2^40 + 2^32 is halfway between 2^40 and 2^40 + 2^33; one more goes up. A detour through
  // float (24 bits) would lose the 1 and take the tie.
  const std::int64_t tie = (std::int64_t{1} << 40) + (std::int64_t{1} << 32);
  CHECK(bfloat16(tie).bits() == 0x5380);
  CHECK(bfloat16(tie + 1).bits() == 0x5381);
  CHECK(bfloat16(-(tie + 1)).bits() == 0xd381);
  CHECK(bfloat16(std::numeric_limits<std::int64_t>::min()).bits() == 0xdf00);
  CHECK(bfloat16(std::numeric_limits<std::uint64_t>::max()).bits() == 0x5f80);
}

TEST_CASE("arithmetic is correctly rounded") {
  // Sums, differences and products of two 16-bit values are exact in double, and a double
  // quotient rounds innocuously, so rounding the double result once is the IEEE answer.
  std::vector<std::uint16_t> operands;
  for (std::uint32_t bits = 0; bits <= 0xffffu; bits += 193) {
    operands.push_back(static_cast<std::uint16_t>(bits));
  }
  for (const std::uint16_t special : {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff,
                                      0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x3555, 0x7f7f, 0x7f80}) {
    operands.push_back(special);
  }
  const auto run = [&](auto tag, const format& f, const rounding_reference& reference) {
    using T = decltype(tag);
    sweep s;
    const auto expect = [&](T result, double exact, std::uint16_t a, std::uint16_t b, char op) {
      const bool ok =
          std::isnan(exact) ? strata::isnan(result) : result.bits() == reference.round(exact);
      s.expect(ok, [&] { return hex(a) + " " + op + " " + hex(b) + " = " + hex(result.bits()); });
    };
    for (const std::uint16_t a : operands) {
      for (const std::uint16_t b : operands) {
        const T x = T::from_bits(a);
        const T y = T::from_bits(b);
        const double dx = f.decode(a);
        const double dy = f.decode(b);
        expect(x + y, dx + dy, a, b, '+');
        expect(x - y, dx - dy, a, b, '-');
        expect(x * y, dx * dy, a, b, '*');
        expect(x / y, dx / dy, a, b, '/');
      }
    }
    CHECK_SWEEP(s);
  };
  SUBCASE("float16") {
    run(float16{}, binary16, half_reference());
  }
  SUBCASE("bfloat16") {
    run(bfloat16{}, brain16, bfloat16_reference());
  }
}

TEST_CASE("arithmetic, compound assignment and comparisons") {
  const float16 one(1.0f);
  const float16 two(2.0f);
  const float16 three(3.0f);
  CHECK((one + two).bits() == three.bits());
  CHECK((three - two).bits() == one.bits());
  CHECK((two * three).bits() == float16(6.0f).bits());
  CHECK((one / three).bits() == 0x3555);
  CHECK((float16(2048.0f) + one).bits() == 0x6800);  // 2049 ties to 2048
  CHECK((std::numeric_limits<float16>::max() + std::numeric_limits<float16>::max()).bits() ==
        0x7c00);
  CHECK((one / float16(0.0f)).bits() == 0x7c00);
  CHECK((-one / float16(0.0f)).bits() == 0xfc00);
  CHECK(strata::isnan(float16(0.0f) / float16(0.0f)));
  CHECK((-float16(0.0f)).bits() == 0x8000);
  CHECK((-float16::from_bits(0x7e00)).bits() == 0xfe00);
  CHECK((+two).bits() == two.bits());
  CHECK((bfloat16(1.0f) / bfloat16(3.0f)).bits() == 0x3eab);

  float16 x(1.0f);
  x += two;
  CHECK(x.bits() == three.bits());
  x -= one;
  CHECK(x.bits() == two.bits());
  x *= three;
  CHECK(x.bits() == float16(6.0f).bits());
  x /= two;
  CHECK(x.bits() == three.bits());
  bfloat16 y(1.0f);
  y += bfloat16(0x1p-8f);  // ties to even: stays 1
  CHECK(y.bits() == 0x3f80);

  CHECK(one < two);
  CHECK(two > one);
  CHECK(one <= one);
  CHECK(one == float16(1.0f));
  CHECK(one != two);
  CHECK(float16(0.0f) == float16(-0.0f));
  const float16 nan = std::numeric_limits<float16>::quiet_NaN();
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < one);
  CHECK_FALSE(nan > one);
  CHECK((nan <=> one) == std::partial_ordering::unordered);
  CHECK((one <=> two) == std::partial_ordering::less);
  CHECK(bfloat16(-1.0f) < bfloat16(0.0f));

  // Mixed with other types: the 16-bit value widens, the other type's arithmetic applies.
  static_assert(std::is_same_v<decltype(one + one), float16>);
  static_assert(std::is_same_v<decltype(one + 1.0f), float>);
  static_assert(std::is_same_v<decltype(1.0 * one), double>);
  static_assert(std::is_same_v<decltype(one + 1), float>);
  static_assert(std::is_same_v<decltype(bfloat16(1.0f) - bfloat16(1.0f)), bfloat16>);
  CHECK(one + 0.5f == 1.5f);
  CHECK(one == 1.0f);
  CHECK(2.0 > one);
  const double widened = three;
  CHECK(widened == 3.0);
  // Between the two 16-bit types: through float, rounded once.
  CHECK(float16(bfloat16(1.0f + 0x1p-7f)).bits() == 0x3c08);
  CHECK(bfloat16(float16::from_bits(0x3c01)).bits() == 0x3f80);
}

TEST_CASE("numeric_limits<float16>") {
  using limits = std::numeric_limits<float16>;
  static_assert(limits::is_specialized && limits::is_signed && !limits::is_integer);
  static_assert(limits::has_infinity && limits::has_quiet_NaN && limits::has_signaling_NaN);
  static_assert(limits::is_iec559);
  static_assert(limits::digits == 11 && limits::radix == 2);
  static_assert(limits::min_exponent == -13 && limits::max_exponent == 16);
  static_assert(std::numeric_limits<const float16>::digits == 11);
  CHECK(static_cast<float>(limits::max()) == 65504.0f);
  CHECK(static_cast<float>(limits::lowest()) == -65504.0f);
  CHECK(static_cast<float>(limits::min()) == 0x1p-14f);
  CHECK(static_cast<float>(limits::denorm_min()) == 0x1p-24f);
  CHECK(static_cast<float>(limits::epsilon()) == 0x1p-10f);
  CHECK(static_cast<float>(limits::round_error()) == 0.5f);
  CHECK(std::isinf(static_cast<float>(limits::infinity())));
  CHECK(static_cast<float>(limits::infinity()) > 0.0f);
  CHECK(strata::isnan(limits::quiet_NaN()));
  CHECK(strata::isnan(limits::signaling_NaN()));
  CHECK((limits::quiet_NaN().bits() & 0x0200u) != 0);
  CHECK((limits::signaling_NaN().bits() & 0x0200u) == 0);
  // The limits agree with the encoding: epsilon is the gap above 1, max is below infinity.
  CHECK((float16::from_bits(0x3c01) - float16(1.0f)).bits() == limits::epsilon().bits());
  CHECK(limits::max().bits() + 1 == limits::infinity().bits());
  // digits10 and max_digits10 follow from digits.
  CHECK(limits::digits10 == static_cast<int>(std::floor((limits::digits - 1) * std::log10(2.0))));
  CHECK(limits::max_digits10 == static_cast<int>(std::ceil(1 + limits::digits * std::log10(2.0))));
  CHECK(limits::max_exponent10 == static_cast<int>(std::floor(std::log10(65504.0))));
  CHECK(limits::min_exponent10 == static_cast<int>(std::ceil(std::log10(0x1p-14))));
}

TEST_CASE("numeric_limits<bfloat16>") {
  using limits = std::numeric_limits<bfloat16>;
  static_assert(limits::is_specialized && limits::is_signed && !limits::is_integer);
  static_assert(limits::digits == 8 && limits::radix == 2);
  static_assert(limits::min_exponent == -125 && limits::max_exponent == 128);
  CHECK(static_cast<float>(limits::max()) == 3.3895314e38f);
  CHECK(bits_of(limits::max()) == 0x7f7f0000u);
  CHECK(static_cast<float>(limits::lowest()) == -3.3895314e38f);
  CHECK(static_cast<float>(limits::min()) == 0x1p-126f);
  CHECK(static_cast<float>(limits::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(limits::denorm_min()) == 0x1p-133f);
  CHECK(static_cast<float>(limits::epsilon()) == 0x1p-7f);
  CHECK(static_cast<float>(limits::round_error()) == 0.5f);
  CHECK(static_cast<float>(limits::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(strata::isnan(limits::quiet_NaN()));
  CHECK(strata::isnan(limits::signaling_NaN()));
  CHECK((limits::quiet_NaN().bits() & 0x0040u) != 0);
  CHECK((limits::signaling_NaN().bits() & 0x0040u) == 0);
  CHECK((bfloat16::from_bits(0x3f81) - bfloat16(1.0f)).bits() == limits::epsilon().bits());
  CHECK(limits::max().bits() + 1 == limits::infinity().bits());
  CHECK(limits::digits10 == static_cast<int>(std::floor((limits::digits - 1) * std::log10(2.0))));
  CHECK(limits::max_digits10 == static_cast<int>(std::ceil(1 + limits::digits * std::log10(2.0))));
  CHECK(limits::max_exponent10 == static_cast<int>(std::floor(std::log10(3.3895314e38))));
  CHECK(limits::min_exponent10 == static_cast<int>(std::ceil(std::log10(0x1p-126))));
}

TEST_CASE("dtype: names, sizes, parsing") {
  using strata::dtype;
  CHECK(strata::to_string(dtype::float32) == "float32");
  CHECK(strata::to_string(dtype::float64) == "float64");
  CHECK(strata::to_string(dtype::float16) == "float16");
  CHECK(strata::to_string(dtype::bfloat16) == "bfloat16");
  CHECK(strata::to_string(dtype::int32) == "int32");
  CHECK(strata::to_string(dtype::int64) == "int64");
  CHECK(strata::to_string(dtype::uint8) == "uint8");
  CHECK(strata::to_string(static_cast<dtype>(200)) == "unknown");

  CHECK(strata::all_dtypes.size() == 7);
  for (const dtype type : strata::all_dtypes) {
    INFO(strata::to_string(type));
    CHECK(strata::parse_dtype(strata::to_string(type)) == type);
  }
  CHECK(strata::parse_dtype("fp16") == std::nullopt);
  CHECK(strata::parse_dtype("Float32") == std::nullopt);
  CHECK(strata::parse_dtype("float32 ") == std::nullopt);
  CHECK(strata::parse_dtype("") == std::nullopt);
  CHECK(strata::parse_dtype("unknown") == std::nullopt);

  CHECK(strata::size_of(dtype::float32) == sizeof(float));
  CHECK(strata::size_of(dtype::float64) == sizeof(double));
  CHECK(strata::size_of(dtype::float16) == sizeof(float16));
  CHECK(strata::size_of(dtype::bfloat16) == sizeof(bfloat16));
  CHECK(strata::size_of(dtype::int32) == sizeof(std::int32_t));
  CHECK(strata::size_of(dtype::int64) == sizeof(std::int64_t));
  CHECK(strata::size_of(dtype::uint8) == sizeof(std::uint8_t));
  CHECK_THROWS_AS(strata::size_of(static_cast<dtype>(200)), strata::error);
  CHECK_THROWS_WITH(strata::size_of(static_cast<dtype>(200)), "size_of: invalid dtype value 200");

  CHECK(strata::is_floating(dtype::float32));
  CHECK(strata::is_floating(dtype::float64));
  CHECK(strata::is_floating(dtype::float16));
  CHECK(strata::is_floating(dtype::bfloat16));
  CHECK_FALSE(strata::is_floating(dtype::int32));
  CHECK_FALSE(strata::is_floating(dtype::int64));
  CHECK_FALSE(strata::is_floating(dtype::uint8));
}

TEST_CASE("dtype_of agrees with size_of and to_string") {
  const auto check = [](auto value, std::string_view name) {
    using T = decltype(value);
    constexpr strata::dtype type = strata::dtype_of<T>;
    CHECK(strata::to_string(type) == name);
    CHECK(strata::size_of(type) == sizeof(T));
    CHECK(strata::is_floating(type) == !std::is_integral_v<T>);
    CHECK(strata::arithmetic_dtype<T>);
  };
  check(float{}, "float32");
  check(double{}, "float64");
  check(float16{}, "float16");
  check(bfloat16{}, "bfloat16");
  check(std::int32_t{}, "int32");
  check(std::int64_t{}, "int64");
  check(std::uint8_t{}, "uint8");
}
