# Sourced by the scripts that write raw GPU output (gpu_batch.sh, calibrate_on_gpu.sh, host_cpu_sweep.sh,
# bench/executor_gpu_validation.sh). Raw output goes outside the tracked tree: the untracked results/
# folder of the repository root, or any folder outside the repository; docs/validation/ holds only the
# Markdown summaries (docs/validation/README.md).
#
# refuse_tracked_out DIR: exits 2 with a message when DIR lies inside docs/ of this repository.
refuse_tracked_out() {
  local repo dir
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dir="$(realpath -m "$1")"
  case "$dir/" in
    "$repo"/docs/*)
      echo "error: output folder $1 is inside docs/: raw output goes to results/ (untracked), e.g. results/$(basename "$dir")" >&2
      exit 2 ;;
  esac
}
