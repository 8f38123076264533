// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the CPU's vector units can do, read with CPUID and checked against what the operating
// system saves (XGETBV): the GEMM provider's choice (model/gemm.hpp) and the log read it.
//
//   const strata::cpu_features cpu = strata::detect_cpu_features();
//   if (cpu.avx512_bf16 || cpu.amx_bf16) { ... }   // bfloat16 products in hardware
//
// On other architectures every flag is false and isa_level() is `baseline`.

#include <cstdint>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata {

struct cpu_features {
  bool avx2 = false;         // AVX2 and FMA
  bool avx512 = false;       // AVX-512 F, CD, BW, DQ, VL (the "core" set servers have)
  bool avx512_bf16 = false;  // AVX512-BF16: bfloat16 dot products
  bool avx512_fp16 = false;  // AVX512-FP16: float16 arithmetic
  bool amx_bf16 = false;     // AMX tiles with bfloat16
  bool amx_fp16 = false;     // AMX tiles with float16

  friend bool operator==(const cpu_features&, const cpu_features&) = default;
};

// The widest vector instruction set a GEMM kernel can use, in order.
enum class isa_level { baseline, avx, avx2, avx512 };

inline const char* to_string(isa_level level) {
  switch (level) {
    case isa_level::baseline:
      return "SSE";
    case isa_level::avx:
      return "AVX";
    case isa_level::avx2:
      return "AVX2";
    case isa_level::avx512:
      return "AVX-512";
  }
  return "?";
}

inline isa_level widest_isa(const cpu_features& cpu) {
  if (cpu.avx512) {
    return isa_level::avx512;
  }
  return cpu.avx2 ? isa_level::avx2 : isa_level::baseline;
}

// The widest of these the including translation unit was compiled for (-march): strata's own
// loops (activations, losses, optimizers, the loader's transforms) use no wider vectors, whatever
// the CPU has. The GEMM providers pick their kernels at run time and are not bound by it.
constexpr isa_level compiled_isa() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  return isa_level::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return isa_level::avx2;
#elif defined(__AVX__)
  return isa_level::avx;
#else
  return isa_level::baseline;
#endif
}

// A note for the log when a program was compiled for narrower vectors than the CPU it runs on
// has; empty when it was not.
inline std::string compiled_isa_note(isa_level compiled, isa_level cpu) {
  if (static_cast<int>(compiled) >= static_cast<int>(cpu)) {
    return {};
  }
  return std::string("this program was compiled for ") + to_string(compiled) + " and the CPU has " +
         to_string(cpu) + ": strata's own loops (activations, loss, optimizer, transforms) use " +
         to_string(compiled) + " vectors; compile with -march=native (or -m" +
         (cpu == isa_level::avx512 ? "arch=x86-64-v4" : "arch=x86-64-v3") +
         " for every CPU of this kind) to use the CPU's";
}

// "AVX-512, AVX512-BF16" and so on: the flags that are set, for logs.
inline std::string describe(const cpu_features& cpu) {
  std::string text = to_string(widest_isa(cpu));
  const auto add = [&](bool on, const char* name) {
    if (on) {
      text += std::string(", ") + name;
    }
  };
  add(cpu.avx512_bf16, "AVX512-BF16");
  add(cpu.avx512_fp16, "AVX512-FP16");
  add(cpu.amx_bf16, "AMX-BF16");
  add(cpu.amx_fp16, "AMX-FP16");
  return text;
}

namespace detail {

#if defined(__x86_64__) || defined(__i386__)
inline std::uint64_t xgetbv0() {
  std::uint32_t eax = 0;
  std::uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}
#endif

}  // namespace detail

inline cpu_features detect_cpu_features() {
  cpu_features cpu{};
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0;
  unsigned b = 0;
  unsigned c = 0;
  unsigned d = 0;
  if (__get_cpuid_max(0, nullptr) < 7 || __get_cpuid(1, &a, &b, &c, &d) == 0) {
    return cpu;
  }
  const bool osxsave = (c >> 27) & 1U;
  const bool fma = (c >> 12) & 1U;
  if (!osxsave) {
    return cpu;
  }
  const std::uint64_t xcr0 = detail::xgetbv0();
  const bool ymm_saved = (xcr0 & 0x6U) == 0x6U;            // SSE and AVX state
  const bool zmm_saved = (xcr0 & 0xE6U) == 0xE6U;          // and opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles_saved = (xcr0 & 0x60000U) == 0x60000U;  // XTILECFG, XTILEDATA
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_max = a;
  const auto bit = [](unsigned reg, int n) { return ((reg >> n) & 1U) != 0; };
  cpu.avx2 = ymm_saved && fma && bit(b, 5);
  cpu.avx512 = zmm_saved && bit(b, 16) && bit(b, 17) && bit(b, 28) && bit(b, 30) && bit(b, 31);
  cpu.avx512_fp16 = cpu.avx512 && bit(d, 23);
  cpu.amx_bf16 = tiles_saved && bit(d, 22) && bit(d, 24);
  if (leaf7_max >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    cpu.avx512_bf16 = cpu.avx512 && bit(a, 5);
    cpu.amx_fp16 = tiles_saved && bit(a, 21) && cpu.amx_bf16;
  }
#endif
  return cpu;
}

}  // namespace strata
