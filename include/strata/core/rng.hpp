// SPDX-License-Identifier: Apache-2.0
#pragma once

// Counter-based random numbers: Philox4x32-10 and the streams built on it.
//
// A counter-based generator is a keyed bijection applied to a counter, so the n-th block of any
// stream is computed directly, without running through the n-1 before it. strata uses this to
// give every sample of every epoch its own stream, derived in O(1) from (seed, epoch, sample
// index): which loader worker or rank draws a sample, and in which order, never changes what it
// draws.
//
// Everything here is constexpr, noexcept, free of heap and virtual calls, and callable from
// CUDA device code (STRATA_HOST_DEVICE), except shuffle(), which is host-only. normal() and
// normal_float() call <cmath> and are not constexpr.

#include <cassert>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>

#include "strata/core/cpu_features.hpp"
#include "strata/core/macros.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define STRATA_RNG_AVX512 1
#include <immintrin.h>
#else
#define STRATA_RNG_AVX512 0
#endif

namespace strata {

// Four 32-bit words: a Philox4x32 counter, or one output block.
struct philox4x32_counter {
  std::uint32_t words[4] = {0, 0, 0, 0};

  friend constexpr bool operator==(const philox4x32_counter&, const philox4x32_counter&) = default;
};

// Two 32-bit words: a Philox4x32 key.
struct philox4x32_key {
  std::uint32_t words[2] = {0, 0};

  friend constexpr bool operator==(const philox4x32_key&, const philox4x32_key&) = default;
};

// Philox4x32 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// constants, one round, the key schedule, and the R-round bijection counter -> block.
struct philox4x32 {
  using counter_type = philox4x32_counter;
  using key_type = philox4x32_key;

  static constexpr std::uint32_t multiplier_0 = 0xD2511F53u;
  static constexpr std::uint32_t multiplier_1 = 0xCD9E8D57u;
  static constexpr std::uint32_t weyl_0 = 0x9E3779B9u;  // golden ratio
  static constexpr std::uint32_t weyl_1 = 0xBB67AE85u;  // sqrt(3) - 1
  static constexpr int default_rounds = 10;

  // One S-P round: two 32x32 -> 64 multiplies, the high halves mixed with the other two words
  // and the key, and a fixed word permutation.
  STRATA_HOST_DEVICE static STRATA_FORCEINLINE constexpr counter_type single_round(
      const counter_type& c, const key_type& k) noexcept {
    const std::uint64_t product_0 = std::uint64_t{multiplier_0} * c.words[0];
    const std::uint64_t product_1 = std::uint64_t{multiplier_1} * c.words[2];
    const auto high_0 = static_cast<std::uint32_t>(product_0 >> 32);
    const auto low_0 = static_cast<std::uint32_t>(product_0);
    const auto high_1 = static_cast<std::uint32_t>(product_1 >> 32);
    const auto low_1 = static_cast<std::uint32_t>(product_1);
    return counter_type{
        {high_1 ^ c.words[1] ^ k.words[0], low_1, high_0 ^ c.words[3] ^ k.words[1], low_0}};
  }

  // The key schedule: the key of the next round, a Weyl sequence step.
  STRATA_HOST_DEVICE static STRATA_FORCEINLINE constexpr key_type bump_key(
      const key_type& k) noexcept {
    return key_type{{k.words[0] + weyl_0, k.words[1] + weyl_1}};
  }

  // The Rounds-round bijection. Rounds = 10 is the standard, crush-resistant strength.
  template <int Rounds = default_rounds>
  STRATA_HOST_DEVICE static constexpr counter_type apply(counter_type c, key_type k) noexcept {
    static_assert(Rounds >= 1, "philox4x32: Rounds must be at least 1");
    c = single_round(c, k);
    for (int round = 1; round < Rounds; ++round) {
      k = bump_key(k);
      c = single_round(c, k);
    }
    return c;
  }
};

// Philox4x32-10: the pure function (counter, key) -> four random words.
STRATA_HOST_DEVICE constexpr philox4x32_counter philox4x32_round10(
    const philox4x32_counter& counter, const philox4x32_key& key) noexcept {
  return philox4x32::apply<10>(counter, key);
}

namespace detail {

// Philox4x32-10 of `blocks` consecutive counters (words[0] = first, first + 1, ..., wrapping
// modulo 2^32; words 1-3 fixed), written as 4 words each in block order. The same words as
// philox4x32_round10 block by block, computed 16 blocks at a time with the words of the 16 in
// separate arrays, so that the compiler runs the rounds in vector registers (32 x 32 -> 64-bit
// multiplies: pmuludq, vpmuludq). Host only; philox4x32_round10_blocks picks the AVX-512 form
// below where the CPU has it.
inline void philox4x32_round10_blocks_portable(std::uint32_t first, std::uint32_t word1,
                                               std::uint32_t word2, std::uint32_t word3,
                                               const philox4x32_key& key, std::size_t blocks,
                                               std::uint32_t* out) noexcept {
  constexpr std::size_t lanes = 16;
  for (std::size_t base = 0; base < blocks; base += lanes) {
    alignas(64) std::uint32_t w0[lanes];
    alignas(64) std::uint32_t w1[lanes];
    alignas(64) std::uint32_t w2[lanes];
    alignas(64) std::uint32_t w3[lanes];
    for (std::size_t j = 0; j < lanes; ++j) {
      w0[j] = first + static_cast<std::uint32_t>(base + j);
      w1[j] = word1;
      w2[j] = word2;
      w3[j] = word3;
    }
    std::uint32_t k0 = key.words[0];
    std::uint32_t k1 = key.words[1];
    for (int round = 0; round < philox4x32::default_rounds; ++round) {
      if (round > 0) {
        k0 += philox4x32::weyl_0;
        k1 += philox4x32::weyl_1;
      }
      for (std::size_t j = 0; j < lanes; ++j) {
        const std::uint64_t product_0 = std::uint64_t{philox4x32::multiplier_0} * w0[j];
        const std::uint64_t product_1 = std::uint64_t{philox4x32::multiplier_1} * w2[j];
        const auto next_0 = static_cast<std::uint32_t>(product_1 >> 32) ^ w1[j] ^ k0;
        const auto next_2 = static_cast<std::uint32_t>(product_0 >> 32) ^ w3[j] ^ k1;
        w1[j] = static_cast<std::uint32_t>(product_1);
        w3[j] = static_cast<std::uint32_t>(product_0);
        w0[j] = next_0;
        w2[j] = next_2;
      }
    }
    const std::size_t count = blocks - base < lanes ? blocks - base : lanes;
    for (std::size_t j = 0; j < count; ++j) {
      std::uint32_t* block = out + 4 * (base + j);
      block[0] = w0[j];
      block[1] = w1[j];
      block[2] = w2[j];
      block[3] = w3[j];
    }
  }
}

#if STRATA_RNG_AVX512
// GCC 12 warns inside its own AVX-512 intrinsics (the undefined value they start from reads as
// uninitialized once inlined); the code here initializes every value it uses.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The same words on AVX-512F, compiled for it whatever the build's -march (the caller checks the
// CPU): 16 blocks per register, word i of each block in register i, two such groups at a time so
// that one group's multiplies run while the other's wait. A 32 x 32 -> 64-bit multiply of 16
// lanes is two vpmuludq (even lanes, then odd lanes shifted down) whose halves are blended back
// into the lanes; the four registers are then transposed into block order. Writes Groups x 16
// blocks.
template <int Groups>
__attribute__((target("avx512f"), noinline)) inline void philox4x32_round10_groups_avx512(
    std::uint32_t first, std::uint32_t word1, std::uint32_t word2, std::uint32_t word3,
    const philox4x32_key& key, std::uint32_t* out) noexcept {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(philox4x32::multiplier_0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(philox4x32::multiplier_1));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr __mmask16 odd = 0xAAAA;
  __m512i w0[Groups];
  __m512i w1[Groups];
  __m512i w2[Groups];
  __m512i w3[Groups];
  for (int g = 0; g < Groups; ++g) {
    w0[g] = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(first + 16u * static_cast<unsigned>(g))), lane);
    w1[g] = _mm512_set1_epi32(static_cast<int>(word1));
    w2[g] = _mm512_set1_epi32(static_cast<int>(word2));
    w3[g] = _mm512_set1_epi32(static_cast<int>(word3));
  }
  std::uint32_t k0 = key.words[0];
  std::uint32_t k1 = key.words[1];
  for (int round = 0; round < philox4x32::default_rounds; ++round) {
    if (round > 0) {
      k0 += philox4x32::weyl_0;
      k1 += philox4x32::weyl_1;
    }
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < Groups; ++g) {
      const __m512i even_0 = _mm512_mul_epu32(w0[g], m0);
      const __m512i odd_0 = _mm512_mul_epu32(_mm512_srli_epi64(w0[g], 32), m0);
      const __m512i even_1 = _mm512_mul_epu32(w2[g], m1);
      const __m512i odd_1 = _mm512_mul_epu32(_mm512_srli_epi64(w2[g], 32), m1);
      const __m512i high_0 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(even_0, 32), odd_0);
      const __m512i low_0 = _mm512_mask_blend_epi32(odd, even_0, _mm512_slli_epi64(odd_0, 32));
      const __m512i high_1 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(even_1, 32), odd_1);
      const __m512i low_1 = _mm512_mask_blend_epi32(odd, even_1, _mm512_slli_epi64(odd_1, 32));
      // 0x96: the three-way exclusive or.
      w0[g] = _mm512_ternarylogic_epi32(high_1, w1[g], key0, 0x96);
      w2[g] = _mm512_ternarylogic_epi32(high_0, w3[g], key1, 0x96);
      w1[g] = low_1;
      w3[g] = low_0;
    }
  }
  for (int g = 0; g < Groups; ++g) {
    // Word pairs, then quadruples per 128-bit lane (blocks 0, 4, 8, 12 in u0; 1, 5, 9, 13 in u1;
    // ...), then the 128-bit lanes transposed so that each register holds 4 consecutive blocks.
    const __m512i t0 = _mm512_unpacklo_epi32(w0[g], w1[g]);
    const __m512i t1 = _mm512_unpackhi_epi32(w0[g], w1[g]);
    const __m512i t2 = _mm512_unpacklo_epi32(w2[g], w3[g]);
    const __m512i t3 = _mm512_unpackhi_epi32(w2[g], w3[g]);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2);
    const __m512i u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3);
    const __m512i u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE);
    const __m512i v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    std::uint32_t* o = out + 64 * g;
    _mm512_storeu_si512(o, _mm512_shuffle_i32x4(v0, v1, 0x88));
    _mm512_storeu_si512(o + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
    _mm512_storeu_si512(o + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
    _mm512_storeu_si512(o + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
  }
}

#pragma GCC diagnostic pop

// AVX-512F where the CPU has it and STRATA_CPU_ISA leaves it (core/cpu_features.hpp).
inline bool cpu_has_avx512f() noexcept {
  static const bool yes = detect_cpu_features().avx512;
  return yes;
}
#endif

// The whole groups of 16 blocks on AVX-512F (two groups per call while two remain); returns the
// number of blocks written, 0 where the CPU or the compiler has no AVX-512F.
inline std::size_t philox4x32_round10_blocks_avx512(std::uint32_t first, std::uint32_t word1,
                                                    std::uint32_t word2, std::uint32_t word3,
                                                    const philox4x32_key& key, std::size_t blocks,
                                                    std::uint32_t* out) noexcept {
#if STRATA_RNG_AVX512
  if (!cpu_has_avx512f()) {
    return 0;
  }
  std::size_t done = 0;
  for (; done + 32 <= blocks; done += 32) {
    philox4x32_round10_groups_avx512<2>(first + static_cast<std::uint32_t>(done), word1, word2,
                                        word3, key, out + 4 * done);
  }
  if (done + 16 <= blocks) {
    philox4x32_round10_groups_avx512<1>(first + static_cast<std::uint32_t>(done), word1, word2,
                                        word3, key, out + 4 * done);
    done += 16;
  }
  return done;
#else
  (void)first, (void)word1, (void)word2, (void)word3, (void)key, (void)blocks, (void)out;
  return 0;
#endif
}

// Whether philox4x32_round10_blocks runs on AVX-512F here (the CPU has it and the compiler
// builds it); elsewhere the portable form, which the compiler vectorizes for the build's ISA.
inline bool philox_blocks_use_avx512() noexcept {
#if STRATA_RNG_AVX512
  return cpu_has_avx512f();
#else
  return false;
#endif
}

// Philox4x32-10 of `blocks` consecutive counters, as philox4x32_round10_blocks_portable: whole
// groups of 16 on AVX-512F where the CPU has it (about 9 times faster than the portable form
// built for SSE2, twice as fast as built with -march=native, on an AVX-512 core), the rest
// portable. Host only.
inline void philox4x32_round10_blocks(std::uint32_t first, std::uint32_t word1, std::uint32_t word2,
                                      std::uint32_t word3, const philox4x32_key& key,
                                      std::size_t blocks, std::uint32_t* out) noexcept {
  const std::size_t done =
      philox4x32_round10_blocks_avx512(first, word1, word2, word3, key, blocks, out);
  philox4x32_round10_blocks_portable(first + static_cast<std::uint32_t>(done), word1, word2, word3,
                                     key, blocks - done, out + 4 * done);
}

}  // namespace detail

// The complete, exact position of an rng_stream: what a checkpoint stores. Restoring it with
// rng_stream(const rng_state&) continues the stream word for word.
struct rng_state {
  std::uint64_t seed = 0;                   // the Philox key: low word first
  std::uint32_t counter[4] = {0, 0, 0, 0};  // block of the next word (layout: rng_stream)
  std::uint32_t index = 0;                  // words of that block already drawn, 0..3

  friend constexpr bool operator==(const rng_state&, const rng_state&) = default;
};

namespace detail {

// The 128-bit product of two 64-bit words, by 32-bit halves (portable, constexpr, device-safe).
struct wide_product {
  std::uint64_t high;
  std::uint64_t low;
};

STRATA_HOST_DEVICE constexpr wide_product multiply_wide(std::uint64_t a, std::uint64_t b) noexcept {
  constexpr std::uint64_t mask = 0xFFFFFFFFu;
  const std::uint64_t a_low = a & mask;
  const std::uint64_t a_high = a >> 32;
  const std::uint64_t b_low = b & mask;
  const std::uint64_t b_high = b >> 32;
  const std::uint64_t low_low = a_low * b_low;
  const std::uint64_t low_high = a_low * b_high;
  const std::uint64_t high_low = a_high * b_low;
  const std::uint64_t high_high = a_high * b_high;
  const std::uint64_t middle = (low_low >> 32) + (low_high & mask) + (high_low & mask);
  return wide_product{high_high + (low_high >> 32) + (high_low >> 32) + (middle >> 32),
                      (middle << 32) | (low_low & mask)};
}

}  // namespace detail

// A stream of random 32-bit words: Philox4x32-10 keyed by a 64-bit seed, run over a 128-bit
// counter. The counter words are
//
//   words[3] = epoch                                   32 bits
//   words[2] = substream << 16 | sample_index >> 32    16 + 16 bits
//   words[1] = sample_index & 0xFFFFFFFF               32 bits
//   words[0] = block number within the stream          32 bits
//
// so distinct (seed, epoch, sample_index < 2^48, substream < 2^16) never share a block. Each
// block gives four words, drawn in order words[0], words[1], ...; a stream holds 2^32 blocks
// (2^34 words) and, past that, wraps to its own block 0, never into another stream. This layout
// is part of the data a run sees: changing it changes every augmentation.
//
// Every draw below consumes a fixed number of words whatever the values drawn, except
// uniform_int(), which rejects with probability below n / 2^32 (n / 2^64 above 2^32).
// Satisfies std::uniform_random_bit_generator.
class rng_stream {
 public:
  using result_type = std::uint32_t;

  static constexpr int sample_index_bits = 48;
  static constexpr int substream_bits = 16;
  static constexpr std::uint64_t max_sample_index = (std::uint64_t{1} << sample_index_bits) - 1;
  static constexpr std::uint32_t max_substream = (std::uint32_t{1} << substream_bits) - 1;
  static constexpr std::uint32_t words_per_block = 4;

  // The stream of seed 0, epoch 0, sample 0, substream 0.
  STRATA_HOST_DEVICE constexpr rng_stream() noexcept : rng_stream(rng_state{}) {}

  // The stream of (seed, epoch 0, sample 0, substream 0), for uses outside the data pipeline.
  STRATA_HOST_DEVICE explicit constexpr rng_stream(std::uint64_t seed) noexcept
      : rng_stream(rng_state{.seed = seed}) {}

  // Resumes exactly where position() was taken. position() writes index 0..3; 4 (block used up)
  // is accepted, and a larger index is read as 4.
  STRATA_HOST_DEVICE explicit constexpr rng_stream(const rng_state& saved) noexcept
      : seed_(saved.seed),
        counter_{{saved.counter[0], saved.counter[1], saved.counter[2], saved.counter[3]}},
        index_(saved.index < words_per_block ? saved.index : words_per_block) {
    refill();
  }

  // The stream of one sample in one epoch, in O(1). substream separates independent uses for the
  // same sample (crop, flip, noise, ...). Preconditions: sample_index <= max_sample_index and
  // substream <= max_substream (asserted; beyond them streams would alias).
  STRATA_HOST_DEVICE static constexpr rng_stream for_sample(std::uint64_t seed, std::uint32_t epoch,
                                                            std::uint64_t sample_index,
                                                            std::uint32_t substream = 0) noexcept {
    assert(sample_index <= max_sample_index && "rng_stream: sample_index must be below 2^48");
    assert(substream <= max_substream && "rng_stream: substream must be below 2^16");
    rng_state start{};
    start.seed = seed;
    start.counter[0] = 0;
    start.counter[1] = static_cast<std::uint32_t>(sample_index);
    start.counter[2] = static_cast<std::uint32_t>(sample_index >> 32) | (substream << 16);
    start.counter[3] = epoch;
    return rng_stream(start);
  }

  STRATA_HOST_DEVICE static constexpr result_type min() noexcept { return 0; }
  STRATA_HOST_DEVICE static constexpr result_type max() noexcept { return 0xFFFFFFFFu; }

  // The next 32-bit word.
  STRATA_HOST_DEVICE constexpr result_type operator()() noexcept {
    if (index_ == words_per_block) {
      ++counter_.words[0];
      refill();
      index_ = 0;
    }
    return block_.words[index_++];
  }

  // The next out.size() words, exactly as many operator() calls would return them, and the
  // stream advanced as far. Whole blocks are computed 16 at a time (vectorized): for bulk draws
  // such as dropout's masks. A fresh block (none of its words drawn) is computed again with the
  // others, so that a stream's first 4n words are n whole blocks. Host only.
  void fill(std::span<std::uint32_t> out) noexcept {
    std::size_t pos = 0;
    if (index_ > 0) {
      while (pos < out.size() && index_ < words_per_block) {
        out[pos++] = block_.words[index_++];
      }
    }
    // Here the current block is either untouched (index_ == 0) or used up.
    const std::size_t whole = (out.size() - pos) / words_per_block;
    if (whole > 0) {
      const philox4x32_key key{
          {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)}};
      const std::uint32_t first = counter_.words[0] + (index_ == 0 ? 0u : 1u);
      std::uint32_t* blocks = out.data() + pos;
      detail::philox4x32_round10_blocks(first, counter_.words[1], counter_.words[2],
                                        counter_.words[3], key, whole, blocks);
      // The last block written, used up.
      counter_.words[0] = first + static_cast<std::uint32_t>(whole - 1);
      for (std::size_t w = 0; w < words_per_block; ++w) {
        block_.words[w] = blocks[(whole - 1) * words_per_block + w];
      }
      index_ = words_per_block;
      pos += whole * words_per_block;
    }
    while (pos < out.size()) {
      out[pos++] = (*this)();
    }
  }

  // Two words; the first drawn is the low half.
  STRATA_HOST_DEVICE constexpr std::uint64_t next_u64() noexcept {
    const std::uint64_t low = (*this)();
    const std::uint64_t high = (*this)();
    return (high << 32) | low;
  }

  // [0, 1) on the grid k * 2^-24: one word.
  STRATA_HOST_DEVICE constexpr float uniform_float() noexcept {
    return static_cast<float>((*this)() >> 8) * 0x1.0p-24f;
  }

  // [0, 1) on the grid k * 2^-53: two words.
  STRATA_HOST_DEVICE constexpr double uniform_double() noexcept {
    return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  }

  // [a, b) for a < b (a rounding up to b is returned as a); a when a == b. float draws one word,
  // wider types two.
  template <std::floating_point T>
  STRATA_HOST_DEVICE constexpr T uniform(T a, T b) noexcept {
    T unit{};
    if constexpr (sizeof(T) <= sizeof(float)) {
      unit = uniform_float();
    } else {
      unit = static_cast<T>(uniform_double());
    }
    const T value = a + (b - a) * unit;
    return (a < b && !(value < b)) ? a : value;
  }

  // Uniform in [0, n), exactly unbiased (Lemire's multiply-and-reject). n <= 2^32 - 1 draws one
  // word per try, larger n two. Precondition n > 0; n == 0 returns 0 and draws nothing.
  STRATA_HOST_DEVICE constexpr std::uint64_t uniform_int(std::uint64_t n) noexcept {
    if (n == 0) {
      return 0;
    }
    if (n <= 0xFFFFFFFFu) {
      return below_u32(static_cast<std::uint32_t>(n));
    }
    return below_u64(n);
  }

  // true with probability p (p <= 0: never; p >= 1: always): two words.
  STRATA_HOST_DEVICE constexpr bool bernoulli(double p) noexcept { return uniform_double() < p; }

  // Standard normal by Box-Muller: four words (two doubles); the pair's second value is not kept,
  // so the stream's position depends only on the number of calls. Bit-identical for a given
  // build; across math libraries (host libm, CUDA) it may differ in the last bits.
  STRATA_HOST_DEVICE double normal() noexcept {
    const double radius_unit = 1.0 - uniform_double();  // (0, 1]: log is finite
    const double angle_unit = uniform_double();
    return std::sqrt(-2.0 * std::log(radius_unit)) * std::cos(two_pi * angle_unit);
  }

  STRATA_HOST_DEVICE double normal(double mean, double stddev) noexcept {
    return mean + stddev * normal();
  }

  // Standard normal in float arithmetic: two words.
  STRATA_HOST_DEVICE float normal_float() noexcept {
    const float radius_unit = 1.0f - uniform_float();
    const float angle_unit = uniform_float();
    return std::sqrt(-2.0f * std::log(radius_unit)) *
           std::cos(static_cast<float>(two_pi) * angle_unit);
  }

  // Advances by n blocks (4n words) in O(1): the same position as drawing 4n words. The block
  // number wraps modulo 2^32, staying within this stream.
  STRATA_HOST_DEVICE constexpr void skip(std::uint64_t n_blocks) noexcept {
    counter_.words[0] += static_cast<std::uint32_t>(n_blocks);
    refill();
  }

  // The exact position, to save in a checkpoint and resume with rng_stream(const rng_state&).
  // Canonical: two streams at the same word of the same stream report equal states (a used-up
  // block is reported as the next block with index 0).
  STRATA_HOST_DEVICE constexpr rng_state position() const noexcept {
    rng_state state{};
    state.seed = seed_;
    for (int word = 0; word < 4; ++word) {
      state.counter[word] = counter_.words[word];
    }
    state.index = index_;
    if (state.index == words_per_block) {
      ++state.counter[0];
      state.index = 0;
    }
    return state;
  }

 private:
  static constexpr double two_pi = 6.283185307179586476925286766559;

  STRATA_HOST_DEVICE constexpr void refill() noexcept {
    const philox4x32_key key{
        {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)}};
    block_ = philox4x32_round10(counter_, key);
  }

  STRATA_HOST_DEVICE constexpr std::uint32_t below_u32(std::uint32_t n) noexcept {
    std::uint64_t product = std::uint64_t{(*this)()} * n;
    auto low = static_cast<std::uint32_t>(product);
    if (low < n) {
      const std::uint32_t threshold = (std::uint32_t{0} - n) % n;  // 2^32 mod n
      while (low < threshold) {
        product = std::uint64_t{(*this)()} * n;
        low = static_cast<std::uint32_t>(product);
      }
    }
    return static_cast<std::uint32_t>(product >> 32);
  }

  STRATA_HOST_DEVICE constexpr std::uint64_t below_u64(std::uint64_t n) noexcept {
    detail::wide_product product = detail::multiply_wide(next_u64(), n);
    if (product.low < n) {
      const std::uint64_t threshold = (std::uint64_t{0} - n) % n;  // 2^64 mod n
      while (product.low < threshold) {
        product = detail::multiply_wide(next_u64(), n);
      }
    }
    return product.high;
  }

  std::uint64_t seed_ = 0;
  philox4x32_counter counter_{};
  philox4x32_counter block_{};
  std::uint32_t index_ = 0;
};

// Fisher-Yates with rng_stream::uniform_int: the same permutation on every platform and standard
// library (std::shuffle's is unspecified). Draws n - 1 uniform_int values for n elements.
template <std::random_access_iterator Iterator>
requires std::permutable<Iterator>
constexpr void shuffle(Iterator first, Iterator last, rng_stream& rng) {
  using difference_type = std::iter_difference_t<Iterator>;
  const difference_type count = last - first;
  for (difference_type i = count - 1; i > 0; --i) {
    const auto j = static_cast<difference_type>(rng.uniform_int(static_cast<std::uint64_t>(i) + 1));
    std::ranges::iter_swap(first + i, first + j);
  }
}

}  // namespace strata
