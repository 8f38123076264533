# SPDX-License-Identifier: Apache-2.0
# Shared set-up of scripts/test and scripts/demo: the Debian packages strata builds, tests and
# runs with (docs/dependencies.md says why each one is there). Sourced, not run.

STRATA_PACKAGES=(
  cmake g++ make pkgconf
  libtomlplusplus-dev libcli11-dev doctest-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev
  libeigen3-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin
  dataset-fashion-mnist clang-format clang libclang-rt-14-dev python3-matplotlib
)

# How scripts/test and scripts/demo configure build/ (the same cache, so neither rebuilds the
# other's work): RelWithDebInfo at -O1 -g1 for the tests (CMakeLists.txt's first value, given
# here too so that a build/ configured before keeps to it; examples add -O3).
STRATA_CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")

# Installs whatever of STRATA_PACKAGES is missing: `apt-get update` once, then only those.
strata_install_packages() {
  local missing=()
  local pkg
  for pkg in "${STRATA_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "strata needs these Debian packages, which are not installed: ${missing[*]}" >&2
    echo "Run this script as root, or install them first:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# nvcc lives outside Debian (the CUDA toolkit of the machine image); put it on PATH if present.
strata_find_cuda() {
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

# Open MPI refuses to run as root unless told; CI runs as root on 2 cores.
strata_mpi_env() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# STRATA_CPU_ISA=CLASS (baseline, avx2, avx512, avx512_bf16, amx; core/cpu_features.hpp) runs
# the tests as on a CPU of that class: strata's own detection reads it, and the same cap is
# given to oneDNN (ONEDNN_MAX_CPU_ISA) and OpenBLAS (OPENBLAS_CORETYPE, which it reads when it
# loads) unless they are set already. Refuses a name that is not a class.
strata_cpu_isa_env() {
  local isa="${STRATA_CPU_ISA:-}" onednn openblas
  case "$isa" in
    ""|native) return 0 ;;
    baseline) onednn=SSE41; openblas=Nehalem ;;
    avx2) onednn=AVX2; openblas=Haswell ;;
    avx512) onednn=AVX512_CORE_VNNI; openblas=SkylakeX ;;
    avx512_bf16) onednn=AVX512_CORE_BF16; openblas=Cooperlake ;;
    amx) onednn=AVX512_CORE_AMX; openblas=Cooperlake ;;
    *)
      echo "STRATA_CPU_ISA=$isa is not a CPU class: baseline, avx2, avx512, avx512_bf16, amx or native" >&2
      exit 2
      ;;
  esac
  export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-$onednn}"
  export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$openblas}"
  echo "== STRATA_CPU_ISA=$isa: ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
}
