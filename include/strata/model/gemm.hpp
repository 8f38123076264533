// SPDX-License-Identifier: Apache-2.0
#pragma once

// gemm: the one seam every reference layer's matrix product goes through, and the choice of
// who computes it.
//
//   // C (m x n) = alpha * op(A) * op(B) + beta * C, all row-major with leading dimensions
//   strata::model::gemm({.transpose_b = true}, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
//
// Providers, each compiled in when the build found it (CMake options STRATA_USE_ONEDNN and
// STRATA_USE_BLAS define STRATA_HAVE_ONEDNN and STRATA_BLAS_OPENBLAS):
//   - onednn:   oneDNN's sgemm (dnnl_sgemm). It dispatches to the widest kernels it knows for
//               the CPU (AVX2, AVX-512, AMX) and runs on OpenMP threads.
//   - openblas: OpenBLAS's cblas_sgemm. Its kernels are picked at load time by the CPU's name;
//               an OpenBLAS older than the CPU falls back to generic ones (Debian 12's 0.3.21
//               picks its SSE3 "Prescott" kernels on some AVX-512 Xeons, a fifth of the speed).
//   - eigen:    Eigen's own kernels, for the vector ISA the translation unit was compiled for.
//               Compiled in when STRATA_GEMM_EIGEN is 1: by default only in builds without
//               oneDNN and OpenBLAS, since Eigen's GEMM templates add about 20 s of optimisation
//               to every translation unit that trains (define STRATA_GEMM_EIGEN=1 to have them
//               as a choice beside the others). Like the other two switches it must be the same
//               in every translation unit of a program.
//
// decide_gemm is the choice, a pure function of what the CPU can do and what the providers say
// of themselves (gemm_environment), so tests give it made-up machines. "auto" takes what the
// table of measured CPU classes (gemm_table: OpenBLAS on AMD's AVX2 cores) names for the CPU,
// else oneDNN, then an OpenBLAS whose kernels match the CPU, then Eigen (a slow OpenBLAS when
// the build has no Eigen kernels); it never takes a fallback silently: what it skipped or why it
// is slow, and how to fix it, are notes the trainer logs. A provider that is asked for by name
// is used, with the same notes. The choice is by capability and the table, not by a timing at
// start-up, so the same build on the same machine always computes with the same kernels (resumed
// runs and N-rank equivalences rely on it); measure_gemm times one product for the log, and
// measure_gemm_providers the step's product forms on each provider (the table's check).
//
// STRATA_CPU_ISA caps the CPU it sees (core/cpu_features.hpp) and oneDNN's kernels with it.
//
// The process has one current provider (use_gemm, gemm_scope); until something sets it, the
// first product decides "auto". Threads: set_blas_threads (blas.hpp) sets OpenBLAS's pool and
// the OpenMP team every thread that calls oneDNN uses; Eigen's kernels run on the caller alone.

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/cpu_features.hpp"

#if defined(STRATA_BLAS_OPENBLAS)
#include <cblas.h>
#endif
#if defined(STRATA_HAVE_ONEDNN)
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#if !defined(STRATA_GEMM_EIGEN)
#if defined(STRATA_HAVE_ONEDNN) || defined(STRATA_BLAS_OPENBLAS)
#define STRATA_GEMM_EIGEN 0
#else
#define STRATA_GEMM_EIGEN 1
#endif
#endif

namespace strata::model {

enum class gemm_provider { onednn, openblas, eigen };

inline const char* to_string(gemm_provider p) {
  switch (p) {
    case gemm_provider::onednn:
      return "onednn";
    case gemm_provider::openblas:
      return "openblas";
    case gemm_provider::eigen:
      return "eigen";
  }
  return "?";
}

// Whether this build has the provider.
constexpr bool gemm_compiled(gemm_provider p) {
  switch (p) {
    case gemm_provider::onednn:
#if defined(STRATA_HAVE_ONEDNN)
      return true;
#else
      return false;
#endif
    case gemm_provider::openblas:
#if defined(STRATA_BLAS_OPENBLAS)
      return true;
#else
      return false;
#endif
    case gemm_provider::eigen:
      return STRATA_GEMM_EIGEN != 0;
  }
  return false;
}

// The providers this build has, in the order "auto" prefers them.
inline std::vector<gemm_provider> available_gemm_providers() {
  std::vector<gemm_provider> out;
  for (const gemm_provider p :
       {gemm_provider::onednn, gemm_provider::openblas, gemm_provider::eigen}) {
    if (gemm_compiled(p)) {
      out.push_back(p);
    }
  }
  return out;
}

// What decide_gemm looks at: the CPU and what each provider says of its kernels.
struct gemm_environment {
  cpu_features cpu{};
  bool onednn = false;
  std::string onednn_isa{};      // the kernel set oneDNN dispatches to: "avx512_core", ...
  std::string onednn_version{};  // "2.6.3"
  bool openblas = false;
  std::string openblas_core{};  // openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...
  bool eigen = true;            // Eigen's kernels are compiled in
  isa_level eigen_isa = isa_level::baseline;  // what Eigen's kernels were compiled for

  friend bool operator==(const gemm_environment&, const gemm_environment&) = default;
};

// The vector ISA of OpenBLAS's kernels for a core name (what openblas_get_corename() says), or
// nullopt for a name not listed here. x86 only: OpenBLAS's names for other CPUs give nullopt.
inline std::optional<isa_level> openblas_core_isa(std::string_view core) {
  std::string name(core);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (name == n) {
      return isa_level::avx512;
    }
  }
  for (const char* n : {"haswell", "zen", "skylake"}) {
    if (name == n) {
      return isa_level::avx2;
    }
  }
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"}) {
    if (name == n) {
      return isa_level::avx;
    }
  }
  for (const char* n :
       {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai", "coppermine",
        "northwood", "banias", "opteron", "barcelona", "bobcat", "nano", "generic", "unknown"}) {
    if (name == n) {
      return isa_level::baseline;
    }
  }
  return std::nullopt;
}

// The vector ISA of a oneDNN kernel set name (dnnl_get_effective_cpu_isa, as named here).
inline isa_level onednn_isa_level(std::string_view isa) {
  if (isa.starts_with("avx512") || isa.starts_with("amx")) {
    return isa_level::avx512;
  }
  if (isa.starts_with("avx2")) {
    return isa_level::avx2;
  }
  return isa.starts_with("avx") ? isa_level::avx : isa_level::baseline;
}

struct gemm_decision {
  gemm_provider provider = gemm_provider::eigen;
  std::string kernel{};              // the provider's kernels: "avx512_core", "SkylakeX", ...
  std::vector<std::string> notes{};  // what was skipped or is slow, and how to fix it

  friend bool operator==(const gemm_decision&, const gemm_decision&) = default;
};

namespace detail {

inline std::string openblas_fix(const cpu_features& cpu) {
  return widest_isa(cpu) == isa_level::avx512 ? "OPENBLAS_CORETYPE=SkylakeX"
                                              : "OPENBLAS_CORETYPE=Haswell";
}

inline bool openblas_fallback(const gemm_environment& env) {
  const auto level = openblas_core_isa(env.openblas_core);
  return level.has_value() && *level < widest_isa(env.cpu);
}

inline std::string eigen_kernel(const gemm_environment& env) {
  return std::string("Eigen ") + to_string(env.eigen_isa);
}

}  // namespace detail

// Which provider computes fastest on a class of CPU, as measured (bench_trainer's per-provider
// limits; unit.model.dense_layers checks the row of the machine it runs on against a
// measurement): a row per maker and range of classes, oneDNN where no row says otherwise. A
// table and not a measurement at start-up, so that every run of a job on the same machine
// computes with the same kernels (resumed runs and N-rank equivalences are bit-identical).
struct gemm_table_row {
  cpu_vendor vendor = cpu_vendor::other;
  cpu_class from = cpu_class::baseline;  // the classes the row covers, inclusive
  cpu_class to = cpu_class::amx;
  gemm_provider first = gemm_provider::onednn;
  const char* measured = "";  // what the row rests on
};

inline constexpr std::array<gemm_table_row, 2> gemm_table{{
    {.vendor = cpu_vendor::amd,
     .from = cpu_class::avx2,
     .to = cpu_class::avx2,
     .first = gemm_provider::openblas,
     .measured = "AMD EPYC family 25 model 17 capped to AVX2 (OPENBLAS_CORETYPE=Haswell), 1 "
                 "thread, the step's product forms at 256 x 512 x 512: OpenBLAS 107 GFLOP/s, "
                 "oneDNN 2.6.3 (avx2) 80; at 256 x 1024 x 1024: 106 against 50. An EPYC with "
                 "AVX2 only: the trainer on oneDNN at 71% of OpenBLAS's limit"},
    {.vendor = cpu_vendor::amd,
     .from = cpu_class::avx512,
     .to = cpu_class::amx,
     .first = gemm_provider::onednn,
     .measured = "AMD EPYC family 25 model 17 (AVX-512, AVX512-BF16), 1 thread, the same "
                 "forms: oneDNN 2.6.3 (avx512_core_bf16) 111 GFLOP/s, OpenBLAS (Cooperlake) 102"},
}};

// The table's provider for a CPU (onednn where no row covers it).
inline gemm_provider gemm_table_choice(const cpu_features& cpu) {
  const auto c = static_cast<int>(class_of(cpu));
  for (const gemm_table_row& row : gemm_table) {
    if (row.vendor == cpu.vendor && c >= static_cast<int>(row.from) &&
        c <= static_cast<int>(row.to)) {
      return row.first;
    }
  }
  return gemm_provider::onednn;
}

// The provider for `requested` (nullopt: "auto") on `env`. "auto" takes the table's provider for
// the CPU (gemm_table_choice) where the build has it (OpenBLAS only on kernels that match the
// CPU), else oneDNN, then an OpenBLAS whose kernels match the CPU, then Eigen. Throws
// std::invalid_argument when a requested provider is not in this build.
inline gemm_decision decide_gemm(std::optional<gemm_provider> requested,
                                 const gemm_environment& env) {
  const std::string cpu = describe(env.cpu);
  const bool openblas_slow = env.openblas && detail::openblas_fallback(env);
  const auto openblas_note = [&](bool used) {
    const isa_level level = openblas_core_isa(env.openblas_core).value_or(isa_level::baseline);
    return std::string("OpenBLAS picked its ") + env.openblas_core + " kernels (" +
           to_string(level) + ") on this " + cpu + " CPU, which run at a fraction of its speed" +
           (used ? ": set " : "; it was not used: to use it, set ") +
           detail::openblas_fix(env.cpu) + " in the environment" +
           (used ? ", or gemm = \"auto\"" : "") + " (a newer OpenBLAS knows this CPU)";
  };
  const auto eigen_note = [&] {
    return "Eigen's kernels were compiled for " + std::string(to_string(env.eigen_isa)) +
           " on this " + cpu +
           " CPU: compile with -march=native, or install oneDNN (Debian: libdnnl-dev)";
  };
  gemm_decision d{};
  const auto take = [&](gemm_provider p) {
    d.provider = p;
    switch (p) {
      case gemm_provider::onednn:
        d.kernel = env.onednn_isa;
        if (onednn_isa_level(env.onednn_isa) < widest_isa(env.cpu)) {
          d.notes.push_back("oneDNN dispatches to its " + env.onednn_isa + " kernels on this " +
                            cpu +
                            " CPU: unset ONEDNN_MAX_CPU_ISA if it is set, or install a newer "
                            "oneDNN that knows this CPU");
        }
        break;
      case gemm_provider::openblas:
        d.kernel = env.openblas_core;
        if (openblas_slow) {
          d.notes.push_back(openblas_note(true));
        }
        if (const auto level = openblas_core_isa(env.openblas_core);
            level && *level > widest_isa(env.cpu)) {
          // Only under a cap (STRATA_CPU_ISA): OpenBLAS chose its kernels when it loaded.
          d.notes.push_back("OpenBLAS runs its " + env.openblas_core + " kernels (" +
                            to_string(*level) + "), wider than this " + cpu +
                            " CPU as capped: set OPENBLAS_CORETYPE=" +
                            std::string(cpu_class_openblas_core(class_of(env.cpu))) +
                            " before the program starts");
        }
        break;
      case gemm_provider::eigen:
        d.kernel = detail::eigen_kernel(env);
        if (env.eigen_isa < widest_isa(env.cpu)) {
          d.notes.push_back(eigen_note());
        }
        break;
    }
  };
  if (requested) {
    const bool present = *requested == gemm_provider::onednn     ? env.onednn
                         : *requested == gemm_provider::openblas ? env.openblas
                                                                 : env.eigen;
    if (!present) {
      const char* why =
          *requested == gemm_provider::onednn
              ? "has no oneDNN (Debian: libdnnl-dev; reconfigure with -DSTRATA_USE_ONEDNN=ON)"
          : *requested == gemm_provider::openblas
              ? "has no OpenBLAS (Debian: libopenblas-dev; reconfigure with -DSTRATA_USE_BLAS=ON)"
              : "leaves Eigen's kernels out, since it has oneDNN or OpenBLAS (compile with "
                "-DSTRATA_GEMM_EIGEN=1 to have them)";
      throw std::invalid_argument(std::string("gemm = \"") + to_string(*requested) +
                                  "\": this build " + why +
                                  "; use \"auto\" or one of the providers it has");
    }
    take(*requested);
    return d;
  }
  // The table's first choice for this CPU where it is here (and OpenBLAS only on kernels that
  // match the CPU), then oneDNN, then an OpenBLAS whose kernels match the CPU, then Eigen.
  const gemm_provider first = gemm_table_choice(env.cpu);
  if (first == gemm_provider::openblas && env.openblas && !openblas_slow) {
    take(gemm_provider::openblas);
  } else if (env.onednn) {
    take(gemm_provider::onednn);
  } else if (env.openblas && (!openblas_slow || !env.eigen)) {
    take(gemm_provider::openblas);  // a slow one only when there is nothing else, with its note
  } else {
    take(gemm_provider::eigen);
    if (env.openblas) {
      d.notes.insert(d.notes.begin(), openblas_note(false));
    }
  }
  return d;
}

#if defined(STRATA_HAVE_ONEDNN)
namespace detail {

// STRATA_CPU_ISA caps oneDNN too (core/cpu_features.hpp), unless ONEDNN_MAX_CPU_ISA or
// DNNL_MAX_CPU_ISA set a cap of their own: applied once, before oneDNN's first product or query
// (later it cannot change).
inline void cap_onednn_isa() {
  static const bool done = [] {
    const std::optional<cpu_class> cap = cpu_isa_cap();
    const auto set = [](const char* name) {
      const char* v = std::getenv(name);
      return v != nullptr && *v != '\0';
    };
    if (!cap || set("ONEDNN_MAX_CPU_ISA") || set("DNNL_MAX_CPU_ISA")) {
      return false;
    }
    dnnl_cpu_isa_t isa = dnnl_cpu_isa_all;
    switch (*cap) {
      case cpu_class::baseline:
        isa = dnnl_cpu_isa_sse41;
        break;
      case cpu_class::avx2:
        isa = dnnl_cpu_isa_avx2;
        break;
      case cpu_class::avx512:
        isa = dnnl_cpu_isa_avx512_core_vnni;
        break;
      case cpu_class::avx512_bf16:
        isa = dnnl_cpu_isa_avx512_core_bf16;
        break;
      case cpu_class::amx:
        isa = dnnl_cpu_isa_avx512_core_amx;
        break;
    }
    return dnnl_set_max_cpu_isa(isa) == dnnl_success;
  }();
  (void)done;
}

}  // namespace detail
#endif

// What the providers in this process say of themselves, and the CPU (capped by STRATA_CPU_ISA);
// no speeds (measure_gemm_providers).
inline gemm_environment detect_gemm_environment() {
  gemm_environment env{};
  env.cpu = detect_cpu_features();
#if defined(STRATA_HAVE_ONEDNN)
  detail::cap_onednn_isa();
  env.onednn = true;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      env.onednn_isa = "sse41";
      break;
    case dnnl_cpu_isa_avx:
      env.onednn_isa = "avx";
      break;
    case dnnl_cpu_isa_avx2:
      env.onednn_isa = "avx2";
      break;
    case dnnl_cpu_isa_avx2_vnni:
      env.onednn_isa = "avx2_vnni";
      break;
    case dnnl_cpu_isa_avx512_core:
      env.onednn_isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      env.onednn_isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      env.onednn_isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_amx:
      env.onednn_isa = "avx512_core_amx";
      break;
    default:
      env.onednn_isa = "other";
      break;
  }
  const dnnl_version_t* v = dnnl_version();
  env.onednn_version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#endif
#if defined(STRATA_BLAS_OPENBLAS)
  env.openblas = true;
  env.openblas_core = openblas_get_corename();
#endif
  env.eigen = gemm_compiled(gemm_provider::eigen);
#if defined(EIGEN_VECTORIZE_AVX512)
  env.eigen_isa = isa_level::avx512;
#elif defined(EIGEN_VECTORIZE_AVX2)
  env.eigen_isa = isa_level::avx2;
#elif defined(EIGEN_VECTORIZE_AVX)
  env.eigen_isa = isa_level::avx;
#else
  env.eigen_isa = isa_level::baseline;
#endif
  return env;
}

namespace detail {

inline std::atomic<int>& gemm_current() {
  static std::atomic<int> current{-1};  // -1: not chosen yet
  return current;
}

// The OpenMP team size every thread that calls oneDNN is to use (0: OpenMP's own default).
inline std::atomic<int>& gemm_omp_threads() {
  static std::atomic<int> threads{0};
  return threads;
}

#if defined(STRATA_HAVE_ONEDNN)
// OpenMP's team size is a per-thread setting: each thread that calls oneDNN applies the
// process's count before its first product and after every change. libgomp comes with oneDNN;
// it is looked up at run time so that nothing here is compiled with -fopenmp.
inline void apply_omp_threads() {
  cap_onednn_isa();
  thread_local int applied = 0;
  const int want = gemm_omp_threads().load(std::memory_order_relaxed);
  if (want <= 0 || want == applied) {
    return;
  }
  using setter = void (*)(int);
  static const auto set = reinterpret_cast<setter>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set != nullptr) {
    set(want);
  }
  applied = want;
}
#endif

}  // namespace detail

// Makes p the process's provider. Throws std::invalid_argument when this build lacks it.
inline void use_gemm(gemm_provider p) {
  if (!gemm_compiled(p)) {
    throw std::invalid_argument(std::string("use_gemm: this build has no ") + to_string(p));
  }
  detail::gemm_current().store(static_cast<int>(p));
}

// Decides (nullopt: "auto") on this machine, makes the result current and returns it.
// Decides (nullopt: "auto") on this machine, makes the result current and returns it.
inline gemm_decision select_gemm(std::optional<gemm_provider> requested) {
  gemm_decision d = decide_gemm(requested, detect_gemm_environment());
  use_gemm(d.provider);
  return d;
}

// The process's provider; "auto" decides it on first use.
inline gemm_provider current_gemm() {
  const int p = detail::gemm_current().load(std::memory_order_relaxed);
  if (p >= 0) {
    return static_cast<gemm_provider>(p);
  }
  return select_gemm(std::nullopt).provider;
}

// Sets the provider for a scope and restores the one before (tests and benchmarks).
class gemm_scope {
 public:
  explicit gemm_scope(gemm_provider p) : before_(detail::gemm_current().load()) { use_gemm(p); }
  ~gemm_scope() { detail::gemm_current().store(before_); }
  gemm_scope(const gemm_scope&) = delete;
  gemm_scope& operator=(const gemm_scope&) = delete;

 private:
  int before_;
};

struct gemm_options {
  bool transpose_a = false;  // A is stored k x m (lda >= m) and used transposed
  bool transpose_b = false;  // B is stored n x k (ldb >= k) and used transposed
  // A and B hold bfloat16 data in float (precision::mixed<bfloat16>'s activations and compute
  // copy): where bfloat16 products are on (bf16_products), oneDNN multiplies them as bfloat16
  // with float32 accumulation, rounding any value bfloat16 cannot hold to nearest even (the
  // model's input). Elsewhere the float32 product of the same values.
  bool bfloat16_inputs = false;
};

// What gemm_bias applies to C after the product and the bias: nothing, or ReLU (max(x, 0); a
// NaN gives +0, as relu{} does, on every provider: tested). On oneDNN's float32 matmul an
// eltwise post-op of the same primitive (no pass of its own); elsewhere a pass over C after the
// product.
enum class gemm_epilogue { none, relu };

// Whether products of bfloat16 inputs run in bfloat16 (oneDNN matmul): automatic = when the
// provider is oneDNN and the CPU has AMX-BF16 (bf16_products_automatic); on = with oneDNN on any
// CPU (oneDNN emulates the units it lacks, slowly: for tests and for users who want bfloat16
// products whatever they cost); off = never.
enum class bf16_products_mode { automatic, on, off };

// A CPU with AVX512-BF16 but no AMX-BF16 does one bfloat16 dot-product instruction where it
// does two float32 FMAs, so bfloat16 products there are at best as fast as float32 ones (oneDNN
// 2.6's reached half on an Emerald Rapids core); the automatic mode leaves them off there. The
// decision is by capability, not by timing, so every rank and every resumed run of a job decides
// alike. For the log, bf16_products_probe measures both once on such a CPU, on a 256 x 1024 x
// 1024 product with the threads set at the time.
struct bf16_probe_result {
  bool measured = false;  // false where no probe ran: no oneDNN, AMX-BF16, or no AVX512-BF16
  double bf16_gflops = 0.0;
  double fp32_gflops = 0.0;
};

// The automatic decision, a pure function of the CPU: bfloat16 products with AMX-BF16 only.
inline bool bf16_products_automatic(const cpu_features& cpu) {
  return cpu.amx_bf16;
}

// The probe's result, measured on first use (defined below).
inline const bf16_probe_result& bf16_products_probe();

namespace detail {
inline std::atomic<int>& bf16_products_setting() {
  static std::atomic<int> mode{static_cast<int>(bf16_products_mode::automatic)};
  return mode;
}
}  // namespace detail

inline void set_bf16_products(bf16_products_mode mode) {
  detail::bf16_products_setting().store(static_cast<int>(mode));
}

inline bf16_products_mode bf16_products_setting() {
  return static_cast<bf16_products_mode>(detail::bf16_products_setting().load());
}

// Whether this build and CPU can multiply bfloat16 inputs in bfloat16: oneDNN is compiled in
// and makes a bfloat16 matmul here (oneDNN 2.6 has one from AVX-512 on, emulating the bfloat16
// units a CPU without AVX512-BF16 lacks; under a cap, STRATA_CPU_ISA or ONEDNN_MAX_CPU_ISA, what
// the cap leaves). Asked of oneDNN once per process (defined below).
inline bool bf16_products_supported();

// Why bfloat16 products cannot run here and what would work, for errors (defined below).
inline std::string bf16_products_refusal();

// Whether provider p multiplies bfloat16 inputs in bfloat16 under the current mode (on where
// they are not supported: gemm_on refuses, the trainer refuses the configuration first).
inline bool bf16_products(gemm_provider p) {
  if (p != gemm_provider::onednn || !gemm_compiled(p)) {
    return false;
  }
  switch (static_cast<bf16_products_mode>(detail::bf16_products_setting().load())) {
    case bf16_products_mode::on:
      return true;
    case bf16_products_mode::off:
      return false;
    case bf16_products_mode::automatic:
      break;
  }
  static const bool amx = bf16_products_automatic(detect_cpu_features());
  return amx;
}

namespace detail {

using gemm_row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using gemm_const_map = Eigen::Map<const gemm_row_major, 0, Eigen::OuterStride<>>;
using gemm_map = Eigen::Map<gemm_row_major, 0, Eigen::OuterStride<>>;

#if STRATA_GEMM_EIGEN
// Eigen's kernels in one form only, A (m x k) times B (k x n), both row-major: a transposed
// operand is first copied into that form (O(mk) or O(kn) against the product's O(mnk)), so that
// every translation unit instantiates Eigen's GEMM once rather than once per transpose pair.
inline void eigen_gemm(gemm_options t, Eigen::Index m, Eigen::Index n, Eigen::Index k, float alpha,
                       const float* a, Eigen::Index lda, const float* b, Eigen::Index ldb,
                       float beta, float* c, Eigen::Index ldc) {
  thread_local gemm_row_major a_copy;
  thread_local gemm_row_major b_copy;
  if (t.transpose_a) {
    a_copy = gemm_const_map(a, k, m, Eigen::OuterStride<>(lda)).transpose();
    a = a_copy.data();
    lda = k;
  }
  if (t.transpose_b) {
    b_copy = gemm_const_map(b, n, k, Eigen::OuterStride<>(ldb)).transpose();
    b = b_copy.data();
    ldb = n;
  }
  const gemm_const_map am(a, m, k, Eigen::OuterStride<>(lda));
  const gemm_const_map bm(b, k, n, Eigen::OuterStride<>(ldb));
  gemm_map cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f) {
    cm.noalias() = alpha * am * bm;
  } else {
    if (beta != 1.0f) {
      cm *= beta;
    }
    cm.noalias() += alpha * am * bm;
  }
}
#endif

}  // namespace detail

#if defined(STRATA_HAVE_ONEDNN)
namespace detail {

// oneDNN matmul primitives, one per problem (shapes, transposes, leading dimensions, data type,
// alpha, beta, bias, OpenMP threads), created on first use and kept for the thread (a primitive
// runs on one stream; streams are not shared between threads); at most max_entries, the least
// recently used going first (batch sizes that keep changing, as under batch::adaptive, must not
// grow it without bound).
// Two uses: bfloat16 products (the operands rounded to bfloat16 into the thread's buffers,
// densely, in the layout they are stored in; the strides tell oneDNN which is transposed), and
// float32 products with the bias added in the same pass (gemm_bias). alpha is the primitive's
// output scale, beta a sum post-op.
struct onednn_matmul_cache {
  static constexpr std::size_t max_entries = 64;
  using key_type = std::array<std::int64_t, 10>;
  struct entry {
    key_type key{};
    dnnl_primitive_desc_t desc = nullptr;
    dnnl_primitive_t primitive = nullptr;
  };
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<entry> cache;
  std::vector<std::uint16_t> a;
  std::vector<std::uint16_t> b;

  onednn_matmul_cache() {
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine");
    check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream");
  }
  ~onednn_matmul_cache() {
    for (entry& e : cache) {
      destroy(e);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
  }
  onednn_matmul_cache(const onednn_matmul_cache&) = delete;
  onednn_matmul_cache& operator=(const onednn_matmul_cache&) = delete;

  static void destroy(entry& e) {
    dnnl_primitive_destroy(e.primitive);
    dnnl_primitive_desc_destroy(e.desc);
  }

  static void check(dnnl_status_t status, const char* what) {
    if (status != dnnl_success) {
      throw std::runtime_error(std::string("gemm: oneDNN matmul: ") + what +
                               " failed with status " + std::to_string(static_cast<int>(status)));
    }
  }
};

// float -> bfloat16, round to nearest even (NaN kept a NaN).
inline std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffU) > 0x7f800000U) {
    return static_cast<std::uint16_t>((u >> 16) | 0x40U);
  }
  u += 0x7fffU + ((u >> 16) & 1U);
  return static_cast<std::uint16_t>(u >> 16);
}

// Rows x cols of a row-major matrix with leading dimension ld, into dense bfloat16.
inline void round_to_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                          std::vector<std::uint16_t>& out) {
  out.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    std::uint16_t* dst = out.data() + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      dst[c] = to_bf16_bits(row[c]);
    }
  }
}

// C = alpha * op(A) * op(B) (+ bias, a 1 x n row added to every row) + beta * C through a cached
// matmul primitive; A and B are float32 (read in place, with their leading dimensions) or, with
// bf16, rounded to bfloat16 first.
inline void onednn_matmul(bool bf16, gemm_options t, std::int64_t m, std::int64_t n, std::int64_t k,
                          float alpha, const float* a, std::int64_t lda, const float* b,
                          std::int64_t ldb, const float* bias, float beta, float* c,
                          std::int64_t ldc, gemm_epilogue epilogue = gemm_epilogue::none) {
  thread_local onednn_matmul_cache ctx;
  using cache = onednn_matmul_cache;
  apply_omp_threads();
  const std::int64_t a_rows = t.transpose_a ? k : m;
  const std::int64_t a_cols = t.transpose_a ? m : k;
  const std::int64_t b_rows = t.transpose_b ? n : k;
  const std::int64_t b_cols = t.transpose_b ? k : n;
  const void* a_data = a;
  const void* b_data = b;
  if (bf16) {
    round_to_bf16(a, a_rows, a_cols, lda, ctx.a);
    round_to_bf16(b, b_rows, b_cols, ldb, ctx.b);
    a_data = ctx.a.data();
    b_data = ctx.b.data();
    lda = a_cols;
    ldb = b_cols;
  }
  std::int32_t alpha_bits = 0;
  std::int32_t beta_bits = 0;
  std::memcpy(&alpha_bits, &alpha, sizeof alpha);
  std::memcpy(&beta_bits, &beta, sizeof beta);
  const std::int64_t flags = (t.transpose_a ? 1 : 0) + (t.transpose_b ? 2 : 0) + (bf16 ? 4 : 0) +
                             (bias != nullptr ? 8 : 0) + (epilogue == gemm_epilogue::relu ? 16 : 0);
  // A primitive keeps the thread count it was made with: the count in force is part of the key.
  const cache::key_type key{
      m,         n,
      k,         flags,
      lda,       ldb,
      ldc,       alpha_bits,
      beta_bits, static_cast<std::int64_t>(gemm_omp_threads().load(std::memory_order_relaxed))};
  const dnnl_data_type_t in_type = bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t a_md;
  dnnl_memory_desc_t b_md;
  dnnl_memory_desc_t c_md;
  dnnl_memory_desc_t bias_md;
  const dnnl_dims_t a_dims{m, k};
  const dnnl_dims_t a_strides{t.transpose_a ? 1 : lda, t.transpose_a ? lda : 1};
  const dnnl_dims_t b_dims{k, n};
  const dnnl_dims_t b_strides{t.transpose_b ? 1 : ldb, t.transpose_b ? ldb : 1};
  const dnnl_dims_t c_dims{m, n};
  const dnnl_dims_t c_strides{ldc, 1};
  const dnnl_dims_t bias_dims{1, n};
  const dnnl_dims_t bias_strides{n, 1};
  cache::check(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, in_type, a_strides), "A");
  cache::check(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, in_type, b_strides), "B");
  cache::check(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides), "C");
  cache::check(dnnl_memory_desc_init_by_strides(&bias_md, 2, bias_dims, dnnl_f32, bias_strides),
               "bias");
  cache::entry* found = nullptr;
  for (std::size_t i = 0; i < ctx.cache.size(); ++i) {
    if (ctx.cache[i].key == key) {
      // The most recently used last, so that eviction takes the least recently used.
      std::rotate(ctx.cache.begin() + static_cast<std::ptrdiff_t>(i),
                  ctx.cache.begin() + static_cast<std::ptrdiff_t>(i) + 1, ctx.cache.end());
      found = &ctx.cache.back();
      break;
    }
  }
  if (found == nullptr) {
    dnnl_matmul_desc_t desc;
    cache::check(
        dnnl_matmul_desc_init(&desc, &a_md, &b_md, bias != nullptr ? &bias_md : nullptr, &c_md),
        "description");
    dnnl_primitive_attr_t attr = nullptr;
    cache::check(dnnl_primitive_attr_create(&attr), "attributes");
    dnnl_post_ops_t post_ops = nullptr;
    dnnl_status_t status = dnnl_success;
    if (alpha != 1.0f) {
      status = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    }
    if (status == dnnl_success && (beta != 0.0f || epilogue != gemm_epilogue::none)) {
      status = dnnl_post_ops_create(&post_ops);
      if (status == dnnl_success && beta != 0.0f) {
        status = dnnl_post_ops_append_sum(post_ops, beta);
      }
      if (status == dnnl_success && epilogue == gemm_epilogue::relu) {
        status = dnnl_post_ops_append_eltwise(post_ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
      }
      if (status == dnnl_success) {
        status = dnnl_primitive_attr_set_post_ops(attr, post_ops);
      }
    }
    cache::entry e{.key = key};
    if (status == dnnl_success) {
      status = dnnl_primitive_desc_create(&e.desc, &desc, attr, ctx.engine, nullptr);
    }
    if (post_ops != nullptr) {
      dnnl_post_ops_destroy(post_ops);
    }
    dnnl_primitive_attr_destroy(attr);
    cache::check(status, "primitive description");
    status = dnnl_primitive_create(&e.primitive, e.desc);
    if (status != dnnl_success) {
      dnnl_primitive_desc_destroy(e.desc);
      cache::check(status, "primitive");
    }
    if (ctx.cache.size() >= cache::max_entries) {
      cache::destroy(ctx.cache.front());
      ctx.cache.erase(ctx.cache.begin());
    }
    ctx.cache.push_back(e);
    found = &ctx.cache.back();
  }
  dnnl_memory_t memories[4] = {nullptr, nullptr, nullptr, nullptr};
  const auto release = [&] {
    for (dnnl_memory_t mem : memories) {
      if (mem != nullptr) {
        dnnl_memory_destroy(mem);
      }
    }
  };
  // oneDNN takes non-const handles; it only reads A, B and the bias.
  dnnl_status_t status =
      dnnl_memory_create(&memories[0], &a_md, ctx.engine, const_cast<void*>(a_data));
  if (status == dnnl_success) {
    status = dnnl_memory_create(&memories[1], &b_md, ctx.engine, const_cast<void*>(b_data));
  }
  if (status == dnnl_success) {
    status = dnnl_memory_create(&memories[2], &c_md, ctx.engine, c);
  }
  if (status == dnnl_success && bias != nullptr) {
    status = dnnl_memory_create(&memories[3], &bias_md, ctx.engine, const_cast<float*>(bias));
  }
  if (status == dnnl_success) {
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, memories[0]},
                                     {DNNL_ARG_WEIGHTS, memories[1]},
                                     {DNNL_ARG_DST, memories[2]},
                                     {DNNL_ARG_BIAS, memories[3]}};
    status = dnnl_primitive_execute(found->primitive, ctx.stream, bias != nullptr ? 4 : 3, args);
  }
  if (status == dnnl_success) {
    status = dnnl_stream_wait(ctx.stream);
  }
  release();
  cache::check(status, "execute");
}

// Whether oneDNN creates a bfloat16 matmul (16 x 16 x 16) on this CPU, under its cap.
inline bool onednn_has_bf16_matmul() {
  cap_onednn_isa();
  dnnl_engine_t engine = nullptr;
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
    return false;
  }
  const dnnl_dims_t dims{16, 16};
  const dnnl_dims_t strides{16, 1};
  dnnl_memory_desc_t in_md;
  dnnl_memory_desc_t out_md;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok = dnnl_memory_desc_init_by_strides(&in_md, 2, dims, dnnl_bf16, strides) == dnnl_success &&
            dnnl_memory_desc_init_by_strides(&out_md, 2, dims, dnnl_f32, strides) == dnnl_success &&
            dnnl_matmul_desc_init(&desc, &in_md, &in_md, nullptr, &out_md) == dnnl_success &&
            dnnl_primitive_desc_create(&pd, &desc, nullptr, engine, nullptr) == dnnl_success;
  if (pd != nullptr) {
    dnnl_primitive_desc_destroy(pd);
  }
  dnnl_engine_destroy(engine);
  return ok;
}

inline void onednn_bf16_gemm(gemm_options t, std::int64_t m, std::int64_t n, std::int64_t k,
                             float alpha, const float* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  onednn_matmul(true, t, m, n, k, alpha, a, lda, b, ldb, nullptr, beta, c, ldc);
}

}  // namespace detail
#endif

namespace detail {
// Sizes must fit an int (the BLAS interfaces take int); larger ones throw std::length_error.
inline void check_gemm_dims(std::size_t m, std::size_t n, std::size_t k, std::size_t lda,
                            std::size_t ldb, std::size_t ldc) {
  constexpr std::size_t int_max = 2147483647;
  if (std::max({m, n, k, lda, ldb, ldc}) > int_max) {
    throw std::length_error("gemm: a dimension above 2^31 - 1");
  }
}
}  // namespace detail

// C = alpha * op(A) * op(B) + beta * C on provider p (row-major; C is m x n with leading
// dimension ldc, op(A) m x k, op(B) k x n). beta = 0 overwrites C without reading it. Sizes must
// fit an int (the BLAS interfaces take int); larger ones throw std::length_error.
inline void gemm_on(gemm_provider p, gemm_options t, std::size_t m, std::size_t n, std::size_t k,
                    float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                    float beta, float* c, std::size_t ldc) {
  if (m == 0 || n == 0) {
    return;
  }
  detail::check_gemm_dims(m, n, k, lda, ldb, ldc);
  const auto i = [](std::size_t v) { return static_cast<int>(v); };
  if (k == 0) {  // an empty sum: C = beta * C, the same on every provider
    detail::gemm_map cm(c, i(m), i(n), Eigen::OuterStride<>(i(ldc)));
    if (beta == 0.0f) {
      cm.setZero();
    } else if (beta != 1.0f) {
      cm *= beta;
    }
    return;
  }
  switch (p) {
    case gemm_provider::onednn:
#if defined(STRATA_HAVE_ONEDNN)
    {
      if (t.bfloat16_inputs && bf16_products(p)) {
        if (!bf16_products_supported()) {
          throw std::invalid_argument("gemm: bfloat16 products are on (bf16_products = on), but " +
                                      bf16_products_refusal());
        }
        detail::onednn_bf16_gemm(t, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
        return;
      }
      detail::apply_omp_threads();
      const dnnl_status_t status =
          dnnl_sgemm(t.transpose_a ? 'T' : 'N', t.transpose_b ? 'T' : 'N', i(m), i(n), i(k), alpha,
                     a, i(lda), b, i(ldb), beta, c, i(ldc));
      if (status != dnnl_success) {
        throw std::runtime_error(
            "gemm: dnnl_sgemm failed with status " + std::to_string(static_cast<int>(status)) +
            " for " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
      }
      return;
    }
#else
      break;
#endif
    case gemm_provider::openblas:
#if defined(STRATA_BLAS_OPENBLAS)
      cblas_sgemm(CblasRowMajor, t.transpose_a ? CblasTrans : CblasNoTrans,
                  t.transpose_b ? CblasTrans : CblasNoTrans, i(m), i(n), i(k), alpha, a, i(lda), b,
                  i(ldb), beta, c, i(ldc));
      return;
#else
      break;
#endif
    case gemm_provider::eigen:
#if STRATA_GEMM_EIGEN
      detail::eigen_gemm(t, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
      return;
#else
      break;
#endif
  }
  throw std::invalid_argument(std::string("gemm: this build has no ") + to_string(p));
}

// The epilogue as a pass over C (m x n, leading dimension ldc), for products that did not fuse
// it: ReLU keeps the positive values and writes +0 elsewhere (a NaN included).
inline void apply_gemm_epilogue(gemm_epilogue epilogue, std::size_t m, std::size_t n, float* c,
                                std::size_t ldc) {
  if (epilogue != gemm_epilogue::relu || m == 0 || n == 0) {
    return;
  }
  detail::gemm_map cm(c, static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n),
                      Eigen::OuterStride<>(static_cast<Eigen::Index>(ldc)));
  cm.array() = (cm.array() > 0.0f).select(cm.array(), 0.0f);
}

// C = epilogue(op(A) * op(B) + bias): the 1 x n row `bias` added to every row of C (m x n,
// leading dimension ldc; its old values are not read), then the epilogue. On oneDNN in one pass:
// a matmul primitive with its bias argument and the epilogue as a post-op, cached per shape
// (about 15% faster than filling C with the bias and adding the product to it, at 256 x 1024 x
// 1024 on one Emerald Rapids core). Elsewhere, and for bfloat16 products, C's rows start as the
// bias, the product adds to them, and the epilogue is a pass over C.
inline void gemm_bias_on(gemm_provider p, gemm_options t, std::size_t m, std::size_t n,
                         std::size_t k, const float* a, std::size_t lda, const float* b,
                         std::size_t ldb, const float* bias, float* c, std::size_t ldc,
                         gemm_epilogue epilogue = gemm_epilogue::none) {
  if (m == 0 || n == 0) {
    return;
  }
#if defined(STRATA_HAVE_ONEDNN)
  if (p == gemm_provider::onednn && k > 0 && !(t.bfloat16_inputs && bf16_products(p))) {
    detail::check_gemm_dims(m, n, k, lda, ldb, ldc);
    const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
    detail::onednn_matmul(false, t, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), bias, 0.0f, c,
                          i(ldc), epilogue);
    return;
  }
#endif
  for (std::size_t r = 0; r < m; ++r) {
    std::copy(bias, bias + n, c + r * ldc);
  }
  gemm_on(p, t, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
  apply_gemm_epilogue(epilogue, m, n, c, ldc);
}

// The same on the process's current provider.
inline void gemm_bias(gemm_options t, std::size_t m, std::size_t n, std::size_t k, const float* a,
                      std::size_t lda, const float* b, std::size_t ldb, const float* bias, float* c,
                      std::size_t ldc, gemm_epilogue epilogue = gemm_epilogue::none) {
  gemm_bias_on(current_gemm(), t, m, n, k, a, lda, b, ldb, bias, c, ldc, epilogue);
}

// gemm_on on the process's current provider.
inline void gemm(gemm_options t, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
                 float* c, std::size_t ldc) {
  gemm_on(current_gemm(), t, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace detail {

// GFLOP/s of an m x n x k product (no transposes) computed by product(a, b, c): the best of
// repeats within `budget` after one warm-up call, on data that is not all zero and that
// bfloat16 holds exactly.
template <class Product>
double best_gflops(std::size_t m, std::size_t n, std::size_t k, std::chrono::milliseconds budget,
                   Product product) {
  std::vector<float> a(m * k);
  std::vector<float> b(k * n);
  std::vector<float> c(m * n);
  for (std::size_t j = 0; j < a.size(); ++j) {
    a[j] = static_cast<float>(j % 7) * 0.25f - 0.5f;
  }
  for (std::size_t j = 0; j < b.size(); ++j) {
    b[j] = static_cast<float>(j % 5) * 0.125f - 0.25f;
  }
  using clock = std::chrono::steady_clock;
  const auto once = [&] {
    const auto start = clock::now();
    product(a.data(), b.data(), c.data());
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  once();
  double best = once();
  const auto end = clock::now() + budget;
  for (int r = 0; r < 200 && clock::now() < end; ++r) {
    best = std::min(best, once());
  }
  return best > 0.0 ? 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                          static_cast<double>(k) / best / 1e9
                    : 0.0;
}

}  // namespace detail

// GFLOP/s of an m x n x k product (no transposes) on p: the best of repeats within `budget`
// after one warm-up call. For the log and benchmarks.
inline double measure_gemm(gemm_provider p, std::size_t m, std::size_t n, std::size_t k,
                           std::chrono::milliseconds budget = std::chrono::milliseconds(30)) {
  return detail::best_gflops(m, n, k, budget, [&](const float* a, const float* b, float* c) {
    gemm_on(p, {}, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  });
}

inline bool bf16_products_supported() {
#if defined(STRATA_HAVE_ONEDNN)
  static const bool yes = detail::onednn_has_bf16_matmul();
  return yes;
#else
  return false;
#endif
}

inline std::string bf16_products_refusal() {
  if (!gemm_compiled(gemm_provider::onednn)) {
    return "this build has no oneDNN, which computes bfloat16 products (Debian: libdnnl-dev; "
           "reconfigure with -DSTRATA_USE_ONEDNN=ON); bf16_products = auto or off multiplies the "
           "values rounded to bfloat16 in float32";
  }
  const gemm_environment env = detect_gemm_environment();
  return "oneDNN " + env.onednn_version + " has no bfloat16 matmul on this CPU (" +
         describe(env.cpu) + "; its kernels: " + env.onednn_isa +
         "): bfloat16 products need AVX-512 (in hardware with AVX512-BF16 or AMX-BF16); "
         "bf16_products = auto or off multiplies the values rounded to bfloat16 in float32";
}

// GFLOP/s of each provider this build has (index: gemm_provider; 0 for the others) on the
// three product forms of a layer's step at 256 x 512 x 512 (forward x * W^T, input gradient
// dy * W, weight gradient dy^T * x), with the threads set at the time: the best of repeats
// within `budget` shared between the providers. For the log and the table's check.
inline std::array<double, 3> measure_gemm_providers(
    std::chrono::milliseconds budget = std::chrono::milliseconds(45)) {
  constexpr std::size_t batch = 256;
  constexpr std::size_t width = 512;
  std::array<double, 3> out{};
  const std::vector<gemm_provider> providers = available_gemm_providers();
  const auto each = budget / static_cast<int>(std::max<std::size_t>(providers.size(), 1));
  std::vector<float> dx(batch * width);
  std::vector<float> dw(width * width);
  for (const gemm_provider p : providers) {
    // best_gflops times y = x * W (batch x width x width, its a, b, c); dx = y * W and
    // dW = y^T * x run with it, the same size each.
    const double rate = detail::best_gflops(
        batch, width, width, each, [&](const float* x, const float* w, float* y) {
          gemm_on(p, {.transpose_b = true}, batch, width, width, 1.0f, x, width, w, width, 0.0f, y,
                  width);
          gemm_on(p, {}, batch, width, width, 1.0f, y, width, w, width, 0.0f, dx.data(), width);
          gemm_on(p, {.transpose_a = true}, width, width, batch, 1.0f, y, width, x, width, 0.0f,
                  dw.data(), width);
        });
    out[static_cast<std::size_t>(p)] = rate * 3.0;  // three products of the timed size
  }
  return out;
}

inline const bf16_probe_result& bf16_products_probe() {
  static const bf16_probe_result result = [] {
    bf16_probe_result r;
#if defined(STRATA_HAVE_ONEDNN)
    const cpu_features cpu = detect_cpu_features();
    if (!cpu.avx512_bf16 || cpu.amx_bf16) {
      return r;
    }
    constexpr std::size_t m = 256;
    constexpr std::size_t n = 1024;
    constexpr std::size_t k = 1024;
    const std::chrono::milliseconds budget(30);
    r.fp32_gflops = measure_gemm(gemm_provider::onednn, m, n, k, budget);
    r.bf16_gflops =
        detail::best_gflops(m, n, k, budget, [&](const float* a, const float* b, float* c) {
          detail::onednn_bf16_gemm({}, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        });
    r.measured = true;
#endif
    return r;
  }();
  return result;
}

// "onednn (avx512_core, oneDNN 2.6.3)": the provider and its kernels, for logs.
inline std::string describe(const gemm_decision& d, const gemm_environment& env) {
  std::string text = std::string(to_string(d.provider)) + " (" + d.kernel;
  if (d.provider == gemm_provider::onednn && !env.onednn_version.empty()) {
    text += ", oneDNN " + env.onednn_version;
  }
  return text + ")";
}

}  // namespace strata::model
