#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An example trainer under OPENBLAS_CORETYPE=Prescott, OpenBLAS's generic SSE3 kernels (what
# Debian 12's OpenBLAS picks on CPUs it does not know): with gemm = auto it does not compute on
# them, and with gemm = openblas its log says they are slow and how to fix it; a provider the
# build lacks is refused with the reason; every provider it has trains to the same test loss.
#   gemm_choice.sh PROGRAM WORK ARGS...
set -euo pipefail
program="$1"; work="$2"; shift 2
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OPENBLAS_CORETYPE=Prescott

fail() { echo "$1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }
run() {  # run NAME ARGS...: the log in NAME.log; exit 0 and a summary line required
  local name="$1"; shift
  "$program" "$@" --run_name "$name" > "$name.log" 2>&1 || fail "$name: exit status $?" "$name.log"
  grep -q "^summary: " "$name.log" || fail "$name: no summary line" "$name.log"
  grep -q "^gemm: " "$name.log" || fail "$name: no gemm line in the log" "$name.log"
}
loss() { sed -n 's/^summary: .*test_loss \([0-9.]*\).*/\1/p' "$1.log"; }

vector_cpu=0
grep -qw avx2 /proc/cpuinfo && vector_cpu=1

run auto "$@" --gemm auto
provider=$(sed -n 's/^gemm: \([a-z]*\) (.*/\1/p' auto.log | head -1)
[ -n "$provider" ] || fail "auto: the gemm line does not name a provider" auto.log
if [ "$vector_cpu" = 1 ] && [ "$provider" = openblas ]; then
  fail "auto computes on OpenBLAS's Prescott kernels on a CPU with AVX2" auto.log
fi
providers="$provider"

# gemm = openblas: a build without OpenBLAS refuses the key (exit 2, naming the package).
status=0
"$program" "$@" --gemm openblas --run_name openblas > openblas.log 2>&1 || status=$?
if [ "$status" = 2 ]; then
  grep -q "gemm.*libopenblas-dev" openblas.log || fail "gemm = openblas refused without the reason" openblas.log
  rm openblas.log
elif [ "$status" != 0 ] || ! grep -q "^summary: " openblas.log; then
  fail "gemm = openblas: exit status $status" openblas.log
else
  grep -q "^gemm: openblas (Prescott)" openblas.log ||
    fail "gemm = openblas under OPENBLAS_CORETYPE=Prescott: the log does not name its kernels" openblas.log
  providers="$providers openblas"
  if [ "$vector_cpu" = 1 ]; then
    grep -q "^gemm: OpenBLAS picked its Prescott kernels .*set OPENBLAS_CORETYPE=" openblas.log ||
      fail "gemm = openblas on Prescott kernels: the log does not say how to fix it" openblas.log
    # And auto said why it skipped OpenBLAS when it took Eigen.
    if [ "$provider" = eigen ]; then
      grep -q "^gemm: OpenBLAS picked its Prescott kernels .*not used" auto.log ||
        fail "auto took Eigen without saying why OpenBLAS was skipped" auto.log
    fi
  fi
fi

# gemm = eigen: a build with oneDNN or OpenBLAS leaves Eigen's kernels out unless compiled with
# STRATA_GEMM_EIGEN=1, and refuses the key (exit 2, saying so).
status=0
"$program" "$@" --gemm eigen --run_name eigen > eigen.log 2>&1 || status=$?
if [ "$status" = 2 ]; then
  grep -q "gemm.*STRATA_GEMM_EIGEN=1" eigen.log || fail "gemm = eigen refused without the reason" eigen.log
  [ "$provider" != eigen ] || fail "auto chose eigen, which gemm = eigen refuses" auto.log eigen.log
  rm eigen.log
elif [ "$status" != 0 ] || ! grep -q "^summary: " eigen.log; then
  fail "gemm = eigen: exit status $status" eigen.log
else
  providers="$providers eigen"
fi

# The same training on every provider: the test losses agree to rounding.
base=$(loss auto)
for name in openblas eigen; do
  [ -f "$name.log" ] || continue
  other=$(loss "$name")
  awk -v a="$base" -v b="$other" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.005) }' ||
    fail "test loss $other with gemm = $name, $base with auto" auto.log "$name.log"
done
echo "providers run: $providers; auto chose $provider"
