// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the CPU's vector units can do, read with CPUID and checked against what the operating
// system saves (XGETBV): the GEMM provider's choice (model/gemm.hpp), the kernels that pick
// their instructions at run time (core/rng.hpp) and the log read it.
//
//   const strata::cpu_features cpu = strata::detect_cpu_features();
//   if (cpu.avx512_bf16 || cpu.amx_bf16) { ... }   // bfloat16 products in hardware
//
// The environment variable STRATA_CPU_ISA caps what detect_cpu_features reports to one of the
// x86-64 classes strata is tested on (cpu_class: baseline, avx2, avx512, avx512_bf16, amx), so a
// wide machine runs as a narrow one would: STRATA_CPU_ISA=avx2 on an AVX-512 Xeon. A cap only
// narrows; check_cpu_isa_cap() (called by the trainer before it trains) refuses a value that is
// not a class, or one above what the CPU has. detect_cpu_hardware() reads the CPU uncapped.
// oneDNN is capped with it (model/gemm.hpp); OpenBLAS picks its kernels when the program loads,
// so a capped run sets OPENBLAS_CORETYPE itself (cpu_class_openblas_core names the value).
//
// On other architectures every flag is false and isa_level() is `baseline`.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata {

// Who made the CPU (CPUID's vendor string): GEMM libraries are tuned differently per maker.
enum class cpu_vendor { other, intel, amd };

struct cpu_features {
  bool avx2 = false;         // AVX2 and FMA
  bool avx512 = false;       // AVX-512 F, CD, BW, DQ, VL (the "core" set servers have)
  bool avx512_bf16 = false;  // AVX512-BF16: bfloat16 dot products
  bool avx512_fp16 = false;  // AVX512-FP16: float16 arithmetic
  bool amx_bf16 = false;     // AMX tiles with bfloat16
  bool amx_fp16 = false;     // AMX tiles with float16
  cpu_vendor vendor = cpu_vendor::other;

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

inline const char* to_string(cpu_vendor v) {
  switch (v) {
    case cpu_vendor::intel:
      return "Intel";
    case cpu_vendor::amd:
      return "AMD";
    case cpu_vendor::other:
      break;
  }
  return "other";
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

// The CPU as CPUID and XGETBV report it, without STRATA_CPU_ISA's cap.
inline cpu_features detect_cpu_hardware() {
  cpu_features cpu{};
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0;
  unsigned b = 0;
  unsigned c = 0;
  unsigned d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) {
    return cpu;
  }
  __cpuid(0, a, b, c, d);
  // The vendor string is EBX, EDX, ECX: "GenuineIntel", "AuthenticAMD".
  if (b == 0x756e6547U && d == 0x49656e69U && c == 0x6c65746eU) {
    cpu.vendor = cpu_vendor::intel;
  } else if (b == 0x68747541U && d == 0x69746e65U && c == 0x444d4163U) {
    cpu.vendor = cpu_vendor::amd;
  }
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) {
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

// The x86-64 classes strata's tests cover, narrowest first: no AVX2; AVX2 and FMA (Haswell, Zen
// 1-3); AVX-512 without bfloat16 (Skylake-SP, Cascade Lake, Ice Lake); AVX-512 with AVX512-BF16
// (Cooper Lake, Zen 4); AMX (Sapphire Rapids and later).
enum class cpu_class { baseline, avx2, avx512, avx512_bf16, amx };

inline constexpr std::array<std::string_view, 5> cpu_class_names{"baseline", "avx2", "avx512",
                                                                 "avx512_bf16", "amx"};

inline std::string_view to_string(cpu_class c) noexcept {
  return cpu_class_names[static_cast<std::size_t>(c)];
}

inline std::optional<cpu_class> parse_cpu_class(std::string_view text) noexcept {
  for (std::size_t i = 0; i < cpu_class_names.size(); ++i) {
    if (cpu_class_names[i] == text) {
      return static_cast<cpu_class>(i);
    }
  }
  return std::nullopt;
}

// The class a CPU belongs to: the widest whose units it has.
inline cpu_class class_of(const cpu_features& cpu) noexcept {
  if (cpu.amx_bf16) {
    return cpu_class::amx;
  }
  if (cpu.avx512_bf16) {
    return cpu_class::avx512_bf16;
  }
  if (cpu.avx512) {
    return cpu_class::avx512;
  }
  return cpu.avx2 ? cpu_class::avx2 : cpu_class::baseline;
}

// What a CPU of `cpu`'s units shows when capped to `cap`: the units above the class turned off.
inline cpu_features capped(cpu_features cpu, cpu_class cap) noexcept {
  const auto at_least = [&](cpu_class c) { return static_cast<int>(cap) >= static_cast<int>(c); };
  cpu.avx2 = cpu.avx2 && at_least(cpu_class::avx2);
  cpu.avx512 = cpu.avx512 && at_least(cpu_class::avx512);
  cpu.avx512_bf16 = cpu.avx512_bf16 && at_least(cpu_class::avx512_bf16);
  cpu.avx512_fp16 = cpu.avx512_fp16 && at_least(cpu_class::amx);
  cpu.amx_bf16 = cpu.amx_bf16 && at_least(cpu_class::amx);
  cpu.amx_fp16 = cpu.amx_fp16 && at_least(cpu_class::amx);
  return cpu;
}

// OPENBLAS_CORETYPE for a class: the OpenBLAS kernels (Debian 12's 0.3.21 knows these names)
// that use no wider units than the class has.
inline std::string_view cpu_class_openblas_core(cpu_class c) noexcept {
  switch (c) {
    case cpu_class::baseline:
      return "Nehalem";
    case cpu_class::avx2:
      return "Haswell";
    case cpu_class::avx512:
      return "SkylakeX";
    case cpu_class::avx512_bf16:
    case cpu_class::amx:
      return "Cooperlake";
  }
  return "Haswell";
}

// ONEDNN_MAX_CPU_ISA for a class (oneDNN's names).
inline std::string_view cpu_class_onednn_isa(cpu_class c) noexcept {
  switch (c) {
    case cpu_class::baseline:
      return "SSE41";
    case cpu_class::avx2:
      return "AVX2";
    case cpu_class::avx512:
      return "AVX512_CORE_VNNI";
    case cpu_class::avx512_bf16:
      return "AVX512_CORE_BF16";
    case cpu_class::amx:
      return "AVX512_CORE_AMX";
  }
  return "ALL";
}

// STRATA_CPU_ISA as a class: nullopt when unset, empty or "native" (no cap), or when it names no
// class (check_cpu_isa_cap refuses that).
inline std::optional<cpu_class> cpu_isa_cap() {
  const char* value = std::getenv("STRATA_CPU_ISA");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "native") {
    return std::nullopt;
  }
  return parse_cpu_class(value);
}

// The CPU as strata's code sees it: the hardware (detect_cpu_hardware) capped by STRATA_CPU_ISA.
inline cpu_features detect_cpu_features() {
  const cpu_features hw = detect_cpu_hardware();
  const std::optional<cpu_class> cap = cpu_isa_cap();
  return cap ? capped(hw, *cap) : hw;
}

// Throws config_error (key STRATA_CPU_ISA) when the variable is set to something that is not a
// class, or to a class above this CPU's (`hw`: a cap cannot add units); the message names what
// the CPU has and the values that would work.
inline void check_cpu_isa_cap(std::string_view value, const cpu_features& hw) {
  if (value.empty() || value == "native") {
    return;
  }
  const cpu_class have = class_of(hw);
  std::string fits;
  for (std::size_t i = 0; i <= static_cast<std::size_t>(have); ++i) {
    fits += std::string(i == 0 ? "" : ", ") + std::string(cpu_class_names[i]);
  }
  const std::string has = "this CPU is of class " + std::string(to_string(have)) + " (" +
                          describe(hw) + "); use one of " + fits + ", or native (no cap)";
  const std::optional<cpu_class> cap = parse_cpu_class(value);
  if (!cap) {
    throw config_error({.key = "STRATA_CPU_ISA"},
                       "\"" + std::string(value) + "\" is not a CPU class; " + has);
  }
  if (static_cast<int>(*cap) > static_cast<int>(have)) {
    throw config_error({.key = "STRATA_CPU_ISA"},
                       "\"" + std::string(value) +
                           "\" asks for units this CPU lacks (a cap only "
                           "narrows); " +
                           has);
  }
}

// The same for this process's environment and CPU.
inline void check_cpu_isa_cap() {
  const char* value = std::getenv("STRATA_CPU_ISA");
  check_cpu_isa_cap(value == nullptr ? std::string_view() : std::string_view(value),
                    detect_cpu_hardware());
}

}  // namespace strata
