# Sourced by the scripts that run carried binaries on a GPU machine (gpu_batch.sh, host_cpu_sweep.sh).
#   link_carried_libs BIN_DIR BINARY...
# Links the shared libraries that BINARY... miss and BIN_DIR/lib carries (SimGrid and its
# dependencies, toml++; scripts/calibrate_on_gpu.sh pack) into a temporary folder put first on
# LD_LIBRARY_PATH, as often as new ones turn up missing: the machine's own copies stay in charge.
# Sets CARRIED_LIBS to that folder.
link_carried_libs() {
  local bin missing l
  bin=$(cd "$1" && pwd)  # absolute: the links live in a temporary folder
  shift
  CARRIED_LIBS=$(mktemp -d)
  export LD_LIBRARY_PATH="$CARRIED_LIBS:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  for _ in 1 2 3 4 5 6 7 8; do
    missing=$(ldd "$@" 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] && break
    for l in $missing; do [ -e "$bin/lib/$l" ] && ln -sf "$bin/lib/$l" "$CARRIED_LIBS/$l"; done
  done
}
