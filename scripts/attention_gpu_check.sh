#!/usr/bin/env bash
# Fused and decode attention on a GPU machine, beside PyTorch's scaled_dot_product_attention
# (docs/backend.md, "Attention on a GPU"). Run from the repository root:
#
#   scripts/attention_gpu_check.sh BUILD_OR_CARRY_DIR OUT_DIR
#
# BUILD_OR_CARRY_DIR is a CUDA build folder (tests/backend/backend_tests, backend/kernel_bench) or a
# carry folder from `scripts/calibrate_on_gpu.sh pack` (backend_tests, kernel_bench, lib/). OUT_DIR
# (outside docs/, e.g. results/attention) receives small text files:
#   env.txt        date, GPU, driver, the cuDNN and cuBLAS the binaries load, PyTorch's versions
#   tests.txt      the attention GPU tests (fused vs CPU reference and vs unfused, decode, caching)
#   shapes.json    the attention cases (kernel_bench --attention-shapes)
#   torch.txt      PyTorch flash and cuDNN SDPA times (scripts/torch_sdpa_reference.py)
#   torch_sdpa.json  the same, as JSON
#   bench.txt      kernel_bench --only attention --reference torch_sdpa.json: fused vs unfused TFLOP/s,
#                  decode GB/s of K/V read, and the ratio ours / max(flash, cudnn) per shape and direction
#   summary.txt    the test verdicts and the ratio lines
# Environment: TESTS_TIMEOUT (seconds, default 300), TORCH_TIMEOUT (400), BENCH_TIMEOUT (400),
# PYTHON (python3).
set -u
dir=$(cd "${1:?usage: $0 BUILD_OR_CARRY_DIR OUT_DIR}" && pwd)
out=${2:?usage: $0 BUILD_OR_CARRY_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/results_dir.sh"
refuse_tracked_out "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)

find_bin() {  # find_bin NAME PATH_IN_A_BUILD_FOLDER
  if [ -x "$dir/$1" ]; then echo "$dir/$1"; elif [ -x "$dir/$2" ]; then echo "$dir/$2"; fi
}
tests=$(find_bin backend_tests tests/backend/backend_tests)
bench=$(find_bin kernel_bench backend/kernel_bench)
[ -n "$tests" ] || { echo "no backend_tests in $dir (build target backend_tests)"; exit 2; }
[ -n "$bench" ] || { echo "no kernel_bench in $dir (build target kernel_bench)"; exit 2; }
export NCCL_NVLS_ENABLE=0
. "$here/carried_libs.sh"
link_carried_libs "$dir" "$tests" "$bench"
export THREEWALLS_SOURCE_DIR="$PWD"
PYTHON=${PYTHON:-python3}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  echo "kernel_bench loads:"
  ldd "$bench" | grep -E "not found|cudnn|cublas|cudart"
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

timeout "${TESTS_TIMEOUT:-300}" "$tests" --gtest_filter='*Attention*:AttentionShapes.*' > "$out/tests.txt" 2>&1
echo "backend_tests (attention) rc=$?" | tee -a "$out/tests.txt"

"$bench" --attention-shapes > "$out/shapes.json" 2> "$out/shapes.err" || { cat "$out/shapes.err"; exit 3; }
timeout "${TORCH_TIMEOUT:-400}" "$PYTHON" "$here/torch_sdpa_reference.py" --shapes "$out/shapes.json" \
  --out "$out/torch_sdpa.json" > "$out/torch.txt" 2>&1
echo "torch_sdpa_reference rc=$?" | tee -a "$out/torch.txt"
ref=()
[ -s "$out/torch_sdpa.json" ] && ref=(--reference "$out/torch_sdpa.json")
timeout "${BENCH_TIMEOUT:-400}" "$bench" --only attention "${ref[@]}" > "$out/bench.txt" 2>&1
echo "kernel_bench rc=$?" | tee -a "$out/bench.txt"

{
  grep -E "^\[  (FAILED|PASSED|SKIPPED|  OK) |Failure|Expected|Which is|rc=" "$out/tests.txt"
  echo
  cat "$out/torch.txt"
  echo
  cat "$out/bench.txt"
} > "$out/summary.txt"
cat "$out/summary.txt"
