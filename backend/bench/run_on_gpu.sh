#!/usr/bin/env bash
# Runs the backend tests and kernel_bench on a GPU machine from prebuilt binaries.
#   backend/bench/run_on_gpu.sh BIN_DIR OUT_DIR
# BIN_DIR holds backend_tests, kernel_bench and lib/ (shared libraries the GPU machine lacks, e.g.
# libtomlplusplus). Each step has its own time limit so one hang cannot eat the others' output.
set -u
BIN=${1:?BIN_DIR}
OUT=${2:?OUT_DIR}
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export THREEWALLS_SOURCE_DIR="$PWD"
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
  ldd "$BIN/backend_tests" | grep -E "not found|cublas|nccl|cudart|toml"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 100 "$BIN/backend_tests" --gtest_filter='-Nccl.PeerThatNeverJoins*' > "$OUT/tests.txt" 2>&1
echo "backend_tests rc=$?" | tee -a "$OUT/tests.txt"
timeout 45 "$BIN/backend_tests" --gtest_filter='Nccl.PeerThatNeverJoins*' > "$OUT/tests_nccl_timeout.txt" 2>&1
echo "nccl timeout test rc=$?" | tee -a "$OUT/tests_nccl_timeout.txt"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|Expected|Which is|rel_error|^\s+[A-Za-z_]+.*: " "$OUT/tests.txt" | head -60
tail -3 "$OUT/tests_nccl_timeout.txt"
timeout "${BENCH_TIMEOUT:-150}" "$BIN/kernel_bench" ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1
echo "kernel_bench rc=$?" | tee -a "$OUT/bench.txt"
cat "$OUT/bench.txt"
