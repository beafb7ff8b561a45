#!/usr/bin/env bash
# GPU validation of the executor (summary: docs/validation/executor_*.md; raw output: OUT_DIR, e.g. under
# the untracked results/). One GPU (H100/H200).
#   bench/executor_gpu_validation.sh BIN_DIR OUT_DIR
# BIN_DIR holds threewalls, profiler_overhead, threewalls_cuda_loop_example and lib/ (shared
# libraries the GPU machine may lack). Writes OUT_DIR/executor_gpu.log and OUT_DIR/run_dirs.tgz.
set -uo pipefail
BIN=$(cd "$1" && pwd)
OUT=$2
. "$(dirname "$0")/../scripts/results_dir.sh"
refuse_tracked_out "$OUT"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# Only the carried libraries the machine lacks (system copies of zlib, udev, ... stay in charge).
LIBS=$(mktemp -d)
export LD_LIBRARY_PATH="$LIBS:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for _ in 1 2 3 4 5 6; do
  missing=$(ldd "$BIN/threewalls" "$BIN/threewalls-gpu" "$BIN/libthreewalls_simgrid.so" "$BIN/profiler_overhead" "$BIN/threewalls_cuda_loop_example" 2>/dev/null |
            awk '/not found/ {print $1}' | sort -u)
  [ -z "$missing" ] && break
  for l in $missing; do [ -e "$BIN/lib/$l" ] && ln -sf "$BIN/lib/$l" "$LIBS/$l"; done
done
# small_moe_1gpu with CUDA graphs (attention and router scopes): the capture and timed-replay path.
GRAPHS=/tmp/small_moe_1gpu_graphs.toml
sed '/^\[train\]/a cuda_graph_scope = ["attn", "moe_router"]' scenarios/examples/small_moe_1gpu.toml |
  sed 's/^name = "small_moe_1gpu"/name = "small_moe_1gpu_graphs"/' > "$GRAPHS"
TW="$BIN/threewalls"
log="$OUT/executor_gpu.log"
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "carried libraries used: $(ls "$LIBS" | tr '\n' ' ')"
  ldd "$TW" | grep -E "not found|cublas|nccl|cudart" || true
  step "threewalls run small_moe_1gpu --steps 10 (every step recorded)"
  timeout 60 "$TW" run scenarios/examples/small_moe_1gpu.toml --out "$OUT/real_small_moe_1gpu" --steps 10
  echo "rc=$?"
  step "threewalls run small_moe_1gpu with cuda_graph_scope = [attn, moe_router] --steps 10"
  timeout 60 "$TW" run "$GRAPHS" --out "$OUT/real_small_moe_1gpu_graphs" --steps 10
  echo "rc=$?"
  step "threewalls run deepseek_v2_lite_offload --steps 6 (inference: prefill + 5 decode)"
  timeout 60 "$TW" run scenarios/examples/deepseek_v2_lite_offload.toml --out "$OUT/real_deepseek_v2_lite_offload" --steps 6
  echo "rc=$?"
  step "world-size refusal: a 2-GPU scenario on 1 GPU"
  timeout 30 "$TW" run scenarios/examples/small_moe_ep2.toml --out "$OUT/refused"
  echo "rc=$? (2 expected)"
  step "injected failure: --inject-fault fail:0:1"
  timeout 60 "$TW" run scenarios/examples/small_moe_1gpu.toml --out "$OUT/fail" --steps 3 --inject-fault fail:0:1
  echo "rc=$? (3 expected)"
  step "injected hang: --inject-fault hang:0:1 --timeout 5s"
  timeout 60 "$TW" run scenarios/examples/small_moe_1gpu.toml --out "$OUT/hang" --steps 3 --inject-fault hang:0:1 --timeout 5s
  echo "rc=$? (3 expected)"
  step "CUDA profiler example (30 steps, every 5th recorded)"
  timeout 30 "$BIN/threewalls_cuda_loop_example" "$OUT/cuda_loop" 30 5
  echo "rc=$?"
  step "profiler overhead on small_moe_1gpu (20 measured steps, 3 runs per mode)"
  timeout 170 "$BIN/profiler_overhead" scenarios/examples/small_moe_1gpu.toml 20 3 /tmp/tw_overhead
  echo "rc=$?"
  step done
} > "$log" 2>&1
tar czf "$OUT/run_dirs.tgz" -C "$OUT" $(cd "$OUT" && ls -d real_* cuda_loop 2>/dev/null)
rm -rf "$OUT"/real_* "$OUT/cuda_loop" "$OUT/refused" "$OUT/fail" "$OUT/hang"
