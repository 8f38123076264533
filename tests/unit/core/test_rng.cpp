// SPDX-License-Identifier: Apache-2.0
#include "strata/core/rng.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using strata::philox4x32_counter;
using strata::philox4x32_key;
using strata::rng_state;
using strata::rng_stream;

static_assert(std::uniform_random_bit_generator<rng_stream>);

struct known_answer {
  philox4x32_counter counter;
  philox4x32_key key;
  philox4x32_counter expected;
};

// Random123 tests/kat_vectors (D. E. Shaw Research), the "philox4x32 10" and "philox4x32 7"
// lines: counter (4 words), key (2 words), expected output (4 words).
constexpr known_answer kat_10[] = {
    {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
     {{0x00000000u, 0x00000000u}},
     {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
    {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
     {{0xffffffffu, 0xffffffffu}},
     {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
    {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
     {{0xa4093822u, 0x299f31d0u}},
     {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
};

constexpr known_answer kat_7[] = {
    {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
     {{0x00000000u, 0x00000000u}},
     {{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}}},
    {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
     {{0xffffffffu, 0xffffffffu}},
     {{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}}},
    {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
     {{0xa4093822u, 0x299f31d0u}},
     {{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}}},
};

// The known answers hold at compile time too.
static_assert(strata::philox4x32_round10(kat_10[0].counter, kat_10[0].key) == kat_10[0].expected);
static_assert(strata::philox4x32_round10(kat_10[1].counter, kat_10[1].key) == kat_10[1].expected);
static_assert(strata::philox4x32_round10(kat_10[2].counter, kat_10[2].key) == kat_10[2].expected);

constexpr philox4x32_counter layout_counter(std::uint32_t block, std::uint32_t epoch,
                                            std::uint64_t sample_index, std::uint32_t substream) {
  return philox4x32_counter{{block, static_cast<std::uint32_t>(sample_index),
                             static_cast<std::uint32_t>(sample_index >> 32) | (substream << 16),
                             epoch}};
}

constexpr philox4x32_key seed_key(std::uint64_t seed) {
  return philox4x32_key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
}

// O(1) derivation: a stream for sample 10^12 is built and drawn from inside constant evaluation,
// whose step limit a loop over 10^12 samples would exceed by far.
constexpr std::uint32_t first_word_of_far_sample() {
  auto stream = rng_stream::for_sample(7, 3, 1'000'000'000'000ull, 5);
  return stream();
}
static_assert(first_word_of_far_sample() ==
              strata::philox4x32_round10(layout_counter(0, 3, 1'000'000'000'000ull, 5), seed_key(7))
                  .words[0]);

std::vector<std::uint32_t> draw_words(rng_stream& stream, std::size_t count) {
  std::vector<std::uint32_t> words(count);
  for (auto& word : words) {
    word = stream();
  }
  return words;
}

std::vector<std::uint32_t> first_words(const rng_stream& start, std::size_t count) {
  rng_stream stream = start;
  return draw_words(stream, count);
}

// What a sample's augmentation might draw: a mix of every kind of draw.
std::vector<double> augment_sample(std::uint64_t seed, std::uint32_t epoch, std::uint64_t index) {
  std::vector<double> out;
  auto crop = rng_stream::for_sample(seed, epoch, index, 0);
  out.push_back(crop.uniform_int(17));
  out.push_back(crop.uniform_int(1000003));
  out.push_back(crop.uniform(-0.25f, 0.25f));
  auto flip = rng_stream::for_sample(seed, epoch, index, 1);
  out.push_back(flip.bernoulli(0.5) ? 1.0 : 0.0);
  auto noise = rng_stream::for_sample(seed, epoch, index, 2);
  for (int i = 0; i < 8; ++i) {
    out.push_back(noise.normal());
    out.push_back(noise.normal_float());
    out.push_back(noise.uniform_double());
  }
  std::array<int, 10> order{};
  std::iota(order.begin(), order.end(), 0);
  strata::shuffle(order.begin(), order.end(), noise);
  out.insert(out.end(), order.begin(), order.end());
  return out;
}

std::vector<std::vector<double>> augment_epoch(std::uint64_t seed, std::uint32_t epoch,
                                               std::size_t samples, std::size_t threads) {
  std::vector<std::vector<double>> out(samples);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = t; i < samples; i += threads) {
        out[i] = augment_sample(seed, epoch, i);
      }
    });
  }
  for (auto& worker : workers) {
    worker.join();
  }
  return out;
}

}  // namespace

TEST_CASE("philox4x32-10 matches the Random123 known answers") {
  for (const auto& kat : kat_10) {
    const auto out = strata::philox4x32_round10(kat.counter, kat.key);
    for (int w = 0; w < 4; ++w) {
      CHECK(out.words[w] == kat.expected.words[w]);
    }
  }
}

TEST_CASE("philox4x32 with 7 rounds matches the Random123 known answers (key schedule check)") {
  for (const auto& kat : kat_7) {
    CHECK(strata::philox4x32::apply<7>(kat.counter, kat.key) == kat.expected);
  }
}

TEST_CASE("rng_stream draws the Philox blocks of its documented counter layout, in order") {
  const std::uint64_t seed = 0x0123456789abcdefull;
  const std::uint32_t epoch = 41;
  const std::uint64_t index = 0x0000'beef'cafe'f00dull;
  const std::uint32_t substream = 0x7abc;
  auto stream = rng_stream::for_sample(seed, epoch, index, substream);
  for (std::uint32_t block = 0; block < 3; ++block) {
    const auto expected =
        strata::philox4x32_round10(layout_counter(block, epoch, index, substream), seed_key(seed));
    for (int w = 0; w < 4; ++w) {
      CHECK(stream() == expected.words[w]);
    }
  }
  // The seed-only and default constructors are sample 0 of epoch 0, substream 0.
  CHECK(first_words(rng_stream(seed), 9) == first_words(rng_stream::for_sample(seed, 0, 0), 9));
  CHECK(first_words(rng_stream(), 9) == first_words(rng_stream::for_sample(0, 0, 0), 9));
  // next_u64 puts the first word drawn in the low half.
  auto a = rng_stream::for_sample(seed, epoch, index);
  auto b = a;
  const std::uint64_t low = b();
  const std::uint64_t high = b();
  CHECK(a.next_u64() == ((high << 32) | low));
}

TEST_CASE("for_sample: same inputs give the same stream, any change gives another") {
  const rng_stream base = rng_stream::for_sample(1234, 5, 678, 2);
  CHECK(first_words(base, 64) == first_words(rng_stream::for_sample(1234, 5, 678, 2), 64));

  const std::vector<rng_stream> variants = {
      base,
      rng_stream::for_sample(1235, 5, 678, 2),
      rng_stream::for_sample(1234ull + (1ull << 32), 5, 678, 2),  // seed high word
      rng_stream::for_sample(1234, 6, 678, 2),
      rng_stream::for_sample(1234, 5, 679, 2),
      rng_stream::for_sample(1234, 5, 678ull + (1ull << 32), 2),  // index high word
      rng_stream::for_sample(1234, 5, 678, 3),
      rng_stream::for_sample(1234, 5, 678, 0),
      rng_stream::for_sample(1234, 5, rng_stream::max_sample_index, rng_stream::max_substream),
  };
  std::set<std::vector<std::uint32_t>> distinct;
  for (const auto& variant : variants) {
    distinct.insert(first_words(variant, 16));
  }
  CHECK(distinct.size() == variants.size());

  // No shared 32-bit word among the first blocks of many neighbouring streams (2^-21 odds of a
  // chance collision among these 12800 words).
  std::set<std::uint32_t> words;
  std::size_t drawn = 0;
  for (std::uint32_t epoch = 0; epoch < 4; ++epoch) {
    for (std::uint64_t index = 0; index < 200; ++index) {
      for (std::uint32_t sub = 0; sub < 4; ++sub) {
        auto stream = rng_stream::for_sample(99, epoch, index, sub);
        for (int w = 0; w < 4; ++w) {
          words.insert(stream());
          ++drawn;
        }
      }
    }
  }
  CHECK(words.size() == drawn);
}

TEST_CASE("for_sample is O(1): a stream for sample 10^12 and substream 2^16-1 is immediate") {
  const std::uint64_t far = 1'000'000'000'000ull;
  auto stream = rng_stream::for_sample(3, 9, far, rng_stream::max_substream);
  const auto expected =
      strata::philox4x32_round10(layout_counter(0, 9, far, rng_stream::max_substream), seed_key(3));
  for (int w = 0; w < 4; ++w) {
    CHECK(stream() == expected.words[w]);
  }
}

TEST_CASE("per-sample draws do not depend on the number of worker threads") {
  const std::size_t samples = 301;
  const auto one = augment_epoch(2024, 3, samples, 1);
  const auto two = augment_epoch(2024, 3, samples, 2);
  const auto four = augment_epoch(2024, 3, samples, 4);
  CHECK(one == two);
  CHECK(one == four);
  // Nor on the order in which samples are visited.
  for (std::size_t i = samples; i-- > 0;) {
    CHECK(augment_sample(2024, 3, i) == one[i]);
  }
  // A different epoch gives a different augmentation.
  CHECK(augment_epoch(2024, 4, samples, 2) != one);
}

TEST_CASE("position() and rng_stream(rng_state) resume a stream exactly") {
  for (std::size_t already_drawn : {0u, 1u, 3u, 4u, 5u, 7u, 8u, 33u}) {
    CAPTURE(already_drawn);
    auto stream = rng_stream::for_sample(77, 1, 2, 3);
    draw_words(stream, already_drawn);
    const rng_state saved = stream.position();
    const auto continuation = draw_words(stream, 50);

    rng_stream resumed(saved);
    CHECK(resumed.position() == saved);
    CHECK(draw_words(resumed, 50) == continuation);
    CHECK(resumed.position() == stream.position());
  }

  // A state round-trips through its fields (what a checkpoint writes and reads back).
  auto stream = rng_stream::for_sample(0xfeedull << 40, 12, 345, 6);
  (void)stream.normal();
  (void)stream.uniform_float();
  const rng_state saved = stream.position();
  const rng_state copied{
      .seed = saved.seed,
      .counter = {saved.counter[0], saved.counter[1], saved.counter[2], saved.counter[3]},
      .index = saved.index};
  CHECK(copied == saved);
  rng_stream resumed(copied);
  CHECK(resumed.normal() == stream.normal());
  CHECK(resumed.uniform_int(1000) == stream.uniform_int(1000));
  CHECK(resumed.uniform_double() == stream.uniform_double());

  rng_state other = saved;
  other.index ^= 1;
  CHECK_FALSE(other == saved);

  // Positions are canonical: a used-up block reads as the next block at index 0, and a state
  // written with index 4 restores to the same place.
  auto four = rng_stream::for_sample(77, 1, 2, 3);
  draw_words(four, 4);
  const rng_state at_four = four.position();
  CHECK(at_four.counter[0] == 1u);
  CHECK(at_four.index == 0u);
  rng_state used_up = at_four;
  used_up.counter[0] = 0;
  used_up.index = 4;
  rng_stream from_used_up(used_up);
  CHECK(from_used_up.position() == at_four);
  CHECK(first_words(from_used_up, 9) == first_words(four, 9));
}

TEST_CASE("skip(n) is drawing n blocks") {
  for (std::size_t offset : {0u, 2u, 4u, 6u}) {
    for (std::uint64_t blocks : {0ull, 1ull, 2ull, 5ull, 1000ull}) {
      CAPTURE(offset);
      CAPTURE(blocks);
      auto skipped = rng_stream::for_sample(5, 6, 7, 8);
      auto drawn = skipped;
      draw_words(skipped, offset);
      draw_words(drawn, offset);
      skipped.skip(blocks);
      draw_words(drawn, blocks * rng_stream::words_per_block);
      CHECK(skipped.position() == drawn.position());
      CHECK(draw_words(skipped, 20) == draw_words(drawn, 20));
    }
  }
  // The block number wraps within the stream after 2^32 blocks.
  auto wrapped = rng_stream::for_sample(5, 6, 7, 8);
  wrapped.skip(std::uint64_t{1} << 32);
  CHECK(first_words(wrapped, 12) == first_words(rng_stream::for_sample(5, 6, 7, 8), 12));
}

TEST_CASE("fill(words) is drawing them one by one, from any position, across the wrap") {
  for (std::size_t offset : {0u, 1u, 3u, 4u, 7u}) {
    for (std::size_t count : {0u, 1u, 3u, 4u, 5u, 63u, 64u, 65u, 67u, 1000u}) {
      CAPTURE(offset);
      CAPTURE(count);
      auto filled = rng_stream::for_sample(11, 2, 300, 4);
      auto drawn = filled;
      draw_words(filled, offset);
      draw_words(drawn, offset);
      std::vector<std::uint32_t> words(count);
      filled.fill(words);
      CHECK(words == draw_words(drawn, count));
      CHECK(filled.position() == drawn.position());
      CHECK(draw_words(filled, 9) == draw_words(drawn, 9));
    }
  }
  // The block number wraps modulo 2^32 inside a fill, as it does one word at a time.
  auto filled = rng_stream::for_sample(3, 0, 1, 0);
  filled.skip((std::uint64_t{1} << 32) - 5);
  auto drawn = filled;
  std::vector<std::uint32_t> words(4 * 40 + 2);
  filled.fill(words);
  CHECK(words == draw_words(drawn, words.size()));
  CHECK(filled.position() == drawn.position());
}

TEST_CASE("Philox blocks in bulk: the AVX-512 and portable forms give philox4x32_round10's words") {
  const strata::philox4x32_key key{{0x9E3779B9u, 0x01234567u}};
  // The first counter 40 below 2^32: the larger counts wrap inside a group of 16.
  const std::uint32_t first = 0xFFFFFFD8u;
  const bool avx512 = strata::detail::philox_blocks_use_avx512();
  const std::string which = avx512 ? "runs here" : "is not available here (not checked)";
  MESSAGE("the AVX-512 form " << which);
  for (std::size_t blocks : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 48u, 49u, 64u, 100u}) {
    CAPTURE(blocks);
    std::vector<std::uint32_t> expected(4 * blocks);
    for (std::size_t j = 0; j < blocks; ++j) {
      const auto block =
          strata::philox4x32_round10({{first + static_cast<std::uint32_t>(j), 7u, 8u, 9u}}, key);
      std::copy(std::begin(block.words), std::end(block.words), expected.begin() + 4 * j);
    }
    // One word past the end shows that nothing is written beyond the blocks asked for.
    const std::uint32_t guard = 0xA5A5A5A5u;
    std::vector<std::uint32_t> portable(4 * blocks + 1, guard);
    strata::detail::philox4x32_round10_blocks_portable(first, 7u, 8u, 9u, key, blocks,
                                                       portable.data());
    CHECK(std::equal(expected.begin(), expected.end(), portable.begin()));
    CHECK(portable.back() == guard);
    std::vector<std::uint32_t> chosen(4 * blocks + 1, guard);
    strata::detail::philox4x32_round10_blocks(first, 7u, 8u, 9u, key, blocks, chosen.data());
    CHECK(std::equal(expected.begin(), expected.end(), chosen.begin()));
    CHECK(chosen.back() == guard);
    std::vector<std::uint32_t> wide(4 * blocks + 1, guard);
    const std::size_t done = strata::detail::philox4x32_round10_blocks_avx512(
        first, 7u, 8u, 9u, key, blocks, wide.data());
    CHECK(done == (avx512 ? blocks - blocks % 16 : 0u));
    CHECK(std::equal(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(4 * done),
                     wide.begin()));
    CHECK(wide[4 * done] == guard);
  }
}

TEST_CASE("fill(words) from a fresh stream: whole blocks from its first, then draws go on") {
  // A stream whose current block is untouched computes it again in the bulk draw; the words and
  // the position after are those of drawing one by one.
  for (std::size_t count : {4u, 8u, 64u, 128u, 512u, 514u}) {
    CAPTURE(count);
    auto filled = rng_stream::for_sample(21, 3, 77, 2);
    auto drawn = filled;
    std::vector<std::uint32_t> words(count);
    filled.fill(words);
    CHECK(words == draw_words(drawn, count));
    CHECK(filled.position() == drawn.position());
    CHECK(draw_words(filled, 6) == draw_words(drawn, 6));
    // Two fills in a row are one fill of both.
    auto twice = rng_stream::for_sample(21, 3, 77, 2);
    std::vector<std::uint32_t> half(count / 2);
    std::vector<std::uint32_t> rest(count - count / 2);
    twice.fill(half);
    twice.fill(rest);
    half.insert(half.end(), rest.begin(), rest.end());
    CHECK(half == words);
  }
}

TEST_CASE("uniform_float and uniform_double: range, mean and variance over 10^6 draws") {
  const int n = 1'000'000;
  auto stream = rng_stream::for_sample(11, 0, 0);
  double sum_f = 0;
  double sum_sq_f = 0;
  double sum_d = 0;
  double sum_sq_d = 0;
  bool in_range = true;
  for (int i = 0; i < n; ++i) {
    const float f = stream.uniform_float();
    const double d = stream.uniform_double();
    in_range = in_range && f >= 0.0f && f < 1.0f && d >= 0.0 && d < 1.0;
    sum_f += f;
    sum_sq_f += double{f} * f;
    sum_d += d;
    sum_sq_d += d * d;
  }
  CHECK(in_range);
  // The mean's standard error is 2.9e-4, the variance's 7.5e-5: bounds are about 7 of them.
  const double mean_f = sum_f / n;
  const double mean_d = sum_d / n;
  CHECK(std::abs(mean_f - 0.5) < 2e-3);
  CHECK(std::abs(mean_d - 0.5) < 2e-3);
  CHECK(std::abs(sum_sq_f / n - mean_f * mean_f - 1.0 / 12) < 5e-4);
  CHECK(std::abs(sum_sq_d / n - mean_d * mean_d - 1.0 / 12) < 5e-4);

  CHECK(rng_stream::min() == 0u);
  CHECK(rng_stream::max() == 0xFFFFFFFFu);
}

TEST_CASE("uniform(a, b) stays in [a, b)") {
  auto stream = rng_stream::for_sample(12, 0, 0);
  bool in_range = true;
  for (int i = 0; i < 100'000; ++i) {
    const float f = stream.uniform(-3.0f, 5.0f);
    const double d = stream.uniform(1e6, 1e6 + 1.0);
    in_range = in_range && f >= -3.0f && f < 5.0f && d >= 1e6 && d < 1e6 + 1.0;
  }
  CHECK(in_range);
  CHECK(stream.uniform(2.5, 2.5) == 2.5);
}

TEST_CASE("normal and normal_float: mean and variance over 10^6 draws") {
  const int n = 1'000'000;
  auto stream = rng_stream::for_sample(13, 0, 0);
  double sum = 0;
  double sum_sq = 0;
  double sum_f = 0;
  double sum_sq_f = 0;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    const double z = stream.normal();
    const float zf = stream.normal_float();
    finite = finite && std::isfinite(z) && std::isfinite(zf);
    sum += z;
    sum_sq += z * z;
    sum_f += zf;
    sum_sq_f += double{zf} * zf;
  }
  CHECK(finite);
  // Standard errors: 1e-3 for the mean, 1.4e-3 for the variance.
  CHECK(std::abs(sum / n) < 6e-3);
  CHECK(std::abs(sum_sq / n - 1.0) < 1e-2);
  CHECK(std::abs(sum_f / n) < 6e-3);
  CHECK(std::abs(sum_sq_f / n - 1.0) < 1e-2);

  // normal(mean, stddev) is the scaled standard normal of the same draws.
  auto a = rng_stream::for_sample(13, 1, 0);
  auto b = a;
  CHECK(a.normal(10.0, 2.0) == 10.0 + 2.0 * b.normal());
  // Each normal() draws exactly four words, each normal_float() two.
  auto c = rng_stream::for_sample(13, 2, 0);
  auto d = c;
  (void)c.normal();
  (void)c.normal_float();
  draw_words(d, 6);
  CHECK(c.position() == d.position());
}

TEST_CASE("uniform_int(10): chi-square over 10^6 draws") {
  const int n = 1'000'000;
  auto stream = rng_stream::for_sample(14, 0, 0);
  std::array<long, 10> counts{};
  bool in_range = true;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t k = stream.uniform_int(10);
    in_range = in_range && k < 10;
    if (k < 10) {
      ++counts[k];
    }
  }
  CHECK(in_range);
  double chi_square = 0;
  for (const long count : counts) {
    const double expected = n / 10.0;
    chi_square += (count - expected) * (count - expected) / expected;
  }
  CAPTURE(chi_square);
  // 9 degrees of freedom: P(chi2 > 40) ~ 7e-6, P(chi2 < 0.5) ~ 6e-5.
  CHECK(chi_square < 40.0);
  CHECK(chi_square > 0.5);
}

TEST_CASE("uniform_int: large and awkward ranges") {
  auto stream = rng_stream::for_sample(15, 0, 0);

  const std::uint64_t prime = 1'000'003;
  std::uint64_t low = prime;
  std::uint64_t high = 0;
  double sum = 0;
  bool in_range = true;
  const int n = 200'000;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t k = stream.uniform_int(prime);
    in_range = in_range && k < prime;
    low = std::min(low, k);
    high = std::max(high, k);
    sum += static_cast<double>(k);
  }
  CHECK(in_range);
  CHECK(low < 100);            // P(all >= 100) = (1 - 1e-4)^(2e5) ~ 2e-9
  CHECK(high >= prime - 100);  // likewise
  // Mean (n-1)/2 with standard error 0.29 n / sqrt(2e5) ~ 650.
  CHECK(std::abs(sum / n - (prime - 1) / 2.0) < 5000.0);

  // Past 2^32 the draw takes two words per try; the range still holds.
  const std::uint64_t big = (std::uint64_t{3} << 40) + 12345;
  double big_sum = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t k = stream.uniform_int(big);
    in_range = in_range && k < big;
    big_sum += static_cast<double>(k);
  }
  CHECK(in_range);
  CHECK(std::abs(big_sum / n / static_cast<double>(big) - 0.5) < 5e-3);

  // Degenerate and extreme n.
  for (int i = 0; i < 1000; ++i) {
    CHECK(stream.uniform_int(1) == 0u);
    const auto top = stream.uniform_int(0xFFFFFFFFull);
    CHECK(top < 0xFFFFFFFFull);
    (void)stream.uniform_int(0xFFFFFFFFFFFFFFFFull);
    CHECK(stream.uniform_int(std::uint64_t{1} << 32) < (std::uint64_t{1} << 32));
  }
  const auto before = stream.position();
  CHECK(stream.uniform_int(0) == 0u);
  CHECK(stream.position() == before);
}

TEST_CASE("detail::multiply_wide is the exact 128-bit product") {
#if defined(__SIZEOF_INT128__)
  __extension__ using u128 = unsigned __int128;
  auto stream = rng_stream::for_sample(16, 0, 0);
  const std::uint64_t edges[] = {0, 1, 0xFFFFFFFFull, 0x100000000ull, ~0ull, ~0ull - 1};
  for (int i = 0; i < 20'000; ++i) {
    const std::uint64_t a = i < 36 ? edges[i % 6] : stream.next_u64();
    const std::uint64_t b = i < 36 ? edges[i / 6] : stream.next_u64();
    const u128 exact = static_cast<u128>(a) * b;
    const auto wide = strata::detail::multiply_wide(a, b);
    CHECK(wide.high == static_cast<std::uint64_t>(exact >> 64));
    CHECK(wide.low == static_cast<std::uint64_t>(exact));
  }
#else
  const auto wide = strata::detail::multiply_wide(~0ull, ~0ull);
  CHECK(wide.high == ~0ull - 1);
  CHECK(wide.low == 1u);
#endif
}

TEST_CASE("bernoulli") {
  auto stream = rng_stream::for_sample(17, 0, 0);
  const int n = 1'000'000;
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    hits += stream.bernoulli(0.3) ? 1 : 0;
  }
  // Standard error 4.6e-4.
  CHECK(std::abs(hits / double{n} - 0.3) < 3e-3);
  for (int i = 0; i < 1000; ++i) {
    CHECK_FALSE(stream.bernoulli(0.0));
    CHECK(stream.bernoulli(1.0));
  }
}

TEST_CASE("shuffle is a deterministic permutation") {
  std::vector<int> base(1000);
  std::iota(base.begin(), base.end(), 0);

  auto first = base;
  auto second = base;
  auto rng_a = rng_stream::for_sample(18, 2, 0, 9);
  auto rng_b = rng_stream::for_sample(18, 2, 0, 9);
  strata::shuffle(first.begin(), first.end(), rng_a);
  strata::shuffle(second.begin(), second.end(), rng_b);
  CHECK(first == second);
  CHECK(first != base);
  CHECK(std::is_permutation(first.begin(), first.end(), base.begin()));
  CHECK(rng_a.position() == rng_b.position());

  auto other = base;
  auto rng_c = rng_stream::for_sample(18, 3, 0, 9);
  strata::shuffle(other.begin(), other.end(), rng_c);
  CHECK(other != first);
  CHECK(std::is_permutation(other.begin(), other.end(), base.begin()));

  // Empty and single-element ranges draw nothing.
  std::vector<int> empty;
  std::vector<int> single{42};
  auto rng_d = rng_stream::for_sample(18, 4, 0);
  const auto before = rng_d.position();
  strata::shuffle(empty.begin(), empty.end(), rng_d);
  strata::shuffle(single.begin(), single.end(), rng_d);
  CHECK(single == std::vector<int>{42});
  CHECK(rng_d.position() == before);

  // Every position receives every value about equally often: 3 elements, 6 permutations.
  std::array<int, 6> permutation_counts{};
  auto rng_e = rng_stream::for_sample(18, 5, 0);
  for (int i = 0; i < 60'000; ++i) {
    std::array<int, 3> small{0, 1, 2};
    strata::shuffle(small.begin(), small.end(), rng_e);
    permutation_counts[static_cast<std::size_t>(small[0] * 2 + (small[1] > small[2] ? 1 : 0))]++;
  }
  for (const int count : permutation_counts) {
    CHECK(std::abs(count - 10'000) < 600);  // standard deviation ~ 91
  }
}

TEST_CASE("rng_stream works with standard distributions and in constant evaluation") {
  std::uniform_int_distribution<int> dist(1, 6);
  auto stream = rng_stream::for_sample(19, 0, 0);
  for (int i = 0; i < 1000; ++i) {
    const int roll = dist(stream);
    CHECK(roll >= 1);
    CHECK(roll <= 6);
  }
  constexpr auto compile_time = [] {
    auto s = rng_stream::for_sample(20, 1, 2, 3);
    s.skip(10);
    const auto k = s.uniform_int(1000);
    const auto f = s.uniform_float();
    return k + static_cast<std::uint64_t>(f * 1000.0f);
  }();
  auto s = rng_stream::for_sample(20, 1, 2, 3);
  s.skip(10);
  const auto k = s.uniform_int(1000);
  const auto f = s.uniform_float();
  CHECK(compile_time == k + static_cast<std::uint64_t>(f * 1000.0f));
}
