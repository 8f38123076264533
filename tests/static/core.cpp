// SPDX-License-Identifier: Apache-2.0
// Compile-time checks of the core vocabulary: the 16-bit float types are 2-byte trivially
// copyable values whose conversions and arithmetic work in constant expressions, and dtype_of,
// size_of, to_string and parse_dtype agree.
#include "strata/core/dtype.hpp"

#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

using strata::bfloat16;
using strata::dtype;
using strata::float16;

// Layout: two bytes holding the bits, copyable with memcpy, trivial to create.
static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivially_copyable_v<bfloat16>);
static_assert(std::is_trivially_default_constructible_v<float16>);
static_assert(std::is_trivially_default_constructible_v<bfloat16>);
static_assert(std::is_standard_layout_v<float16> && std::is_standard_layout_v<bfloat16>);
static_assert(std::is_same_v<strata::half, float16> && std::is_same_v<strata::fp16, float16>);
static_assert(std::is_same_v<strata::bf16, bfloat16>);

// Conversions: explicit in, implicit out.
static_assert(!std::is_convertible_v<float, float16>);
static_assert(!std::is_convertible_v<double, bfloat16>);
static_assert(!std::is_convertible_v<int, float16>);
static_assert(std::is_constructible_v<float16, float>);
static_assert(std::is_constructible_v<float16, double>);
static_assert(std::is_constructible_v<float16, long double>);
static_assert(std::is_constructible_v<float16, int>);
static_assert(std::is_constructible_v<bfloat16, std::uint64_t>);
static_assert(std::is_constructible_v<float16, bfloat16>);
static_assert(std::is_convertible_v<float16, float> && std::is_convertible_v<bfloat16, float>);

// Conversions in constant expressions.
static_assert(float16(1.0f).bits() == 0x3c00);
static_assert(float16(-2.0f).bits() == 0xc000);
static_assert(float16(65504.0f).bits() == 0x7bff);
static_assert(float16(65520.0f).bits() == 0x7c00);
static_assert(float16(0x1p-24f).bits() == 0x0001);
static_assert(float16(0x1p-25f).bits() == 0x0000);
static_assert(float16(-0.0f).bits() == 0x8000);
static_assert(float16(1.0 + 0x1p-11 + 0x1p-40).bits() == 0x3c01);
static_assert(float16(2049).bits() == 0x6800);
static_assert(static_cast<float>(float16::from_bits(0x3c00)) == 1.0f);
static_assert(static_cast<float>(float16::from_bits(0x0001)) == 0x1p-24f);
static_assert(static_cast<float>(float16::from_bits(0x03ff)) == 1023 * 0x1p-24f);
static_assert(static_cast<float>(float16::from_bits(0xfbff)) == -65504.0f);
static_assert(bfloat16(1.0f).bits() == 0x3f80);
static_assert(bfloat16(1.0f + 0x1p-8f).bits() == 0x3f80);
static_assert(bfloat16(1.0f + 3 * 0x1p-8f).bits() == 0x3f82);
static_assert(bfloat16(3.3895314e38f).bits() == 0x7f7f);
static_assert(static_cast<float>(bfloat16::from_bits(0x7f7f)) == 3.3895314e38f);
static_assert(static_cast<float>(bfloat16::from_bits(0x0001)) == 0x1p-133f);

// Arithmetic, comparisons and classification in constant expressions.
static_assert((float16(1.0f) + float16(2.0f)).bits() == 0x4200);
static_assert((float16(1.0f) / float16(3.0f)).bits() == 0x3555);
static_assert((-float16(1.0f)).bits() == 0xbc00);
static_assert(float16(1.0f) < float16(2.0f));
static_assert(float16(0.0f) == float16(-0.0f));
static_assert((bfloat16(1.0f) * bfloat16(3.0f)).bits() == 0x4040);
static_assert(strata::isnan(std::numeric_limits<float16>::quiet_NaN()));
static_assert(!(std::numeric_limits<float16>::quiet_NaN() ==
                std::numeric_limits<float16>::quiet_NaN()));
static_assert(strata::isinf(std::numeric_limits<bfloat16>::infinity()));
static_assert(strata::isfinite(std::numeric_limits<bfloat16>::max()));
static_assert(!strata::isfinite(float16::from_bits(0x7c00)));

// numeric_limits.
static_assert(std::numeric_limits<float16>::is_specialized);
static_assert(std::numeric_limits<float16>::digits == 11);
static_assert(std::numeric_limits<bfloat16>::digits == 8);
static_assert(static_cast<float>(std::numeric_limits<float16>::max()) == 65504.0f);
static_assert(static_cast<float>(std::numeric_limits<float16>::min()) == 0x1p-14f);
static_assert(static_cast<float>(std::numeric_limits<float16>::denorm_min()) == 0x1p-24f);
static_assert(static_cast<float>(std::numeric_limits<float16>::epsilon()) == 0x1p-10f);
static_assert(static_cast<float>(std::numeric_limits<bfloat16>::epsilon()) == 0x1p-7f);
static_assert(static_cast<float>(std::numeric_limits<bfloat16>::min()) == 0x1p-126f);

// The dtype vocabulary.
static_assert(strata::dtype_of<float> == dtype::float32);
static_assert(strata::dtype_of<double> == dtype::float64);
static_assert(strata::dtype_of<float16> == dtype::float16);
static_assert(strata::dtype_of<strata::half> == dtype::float16);
static_assert(strata::dtype_of<bfloat16> == dtype::bfloat16);
static_assert(strata::dtype_of<std::int32_t> == dtype::int32);
static_assert(strata::dtype_of<std::int64_t> == dtype::int64);
static_assert(strata::dtype_of<std::uint8_t> == dtype::uint8);
static_assert(strata::arithmetic_dtype<float> && strata::arithmetic_dtype<bfloat16>);
static_assert(!strata::arithmetic_dtype<const float>);
static_assert(!strata::arithmetic_dtype<float&>);
static_assert(!strata::arithmetic_dtype<bool>);
static_assert(!strata::arithmetic_dtype<char>);
static_assert(!strata::arithmetic_dtype<std::uint16_t>);
static_assert(!strata::arithmetic_dtype<long double>);
static_assert(strata::size_of(dtype::float16) == 2 && strata::size_of(dtype::float64) == 8);
static_assert(strata::size_of(dtype::uint8) == 1);
static_assert(strata::to_string(dtype::bfloat16) == "bfloat16");
static_assert(strata::parse_dtype("int64") == dtype::int64);
static_assert(!strata::parse_dtype("half").has_value());
static_assert(strata::is_floating(dtype::bfloat16) && !strata::is_floating(dtype::int32));
static_assert(static_cast<int>(dtype::float32) == 0 && static_cast<int>(dtype::uint8) == 6);

template <dtype... Types>
constexpr bool names_round_trip() {
  return ((strata::parse_dtype(strata::to_string(Types)) == Types) && ...);
}
static_assert(names_round_trip<dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                               dtype::int32, dtype::int64, dtype::uint8>());

}  // namespace

int main() {}
