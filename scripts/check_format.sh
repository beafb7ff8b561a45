#!/usr/bin/env bash
# Checks C++ formatting (.clang-format) where a change touched the code, never the whole tree:
#
#   scripts/check_format.sh                 the lines changed since the base (below), working tree included
#   scripts/check_format.sh --base REV      the lines changed since REV
#   scripts/check_format.sh FILE...         the whole of each FILE
#
# The default base (scripts/change_base.sh) is the merge-base of HEAD with main: on a branch, every
# commit since it left main (and what is not committed yet); on main itself, what is not committed
# yet, or when everything is committed, the last commit (HEAD~1).
# Each changed .cpp/.hpp/.cu/.cuh/.h file runs through `clang-format --dry-run -Werror` restricted to
# its changed line ranges (--lines). Exit 1 with clang-format's findings when any is misformatted
# (fix them with `git clang-format <base>`); exit 77 (CTest: skipped) with a one-line reason when
# clang-format is not installed, or when no base can be found (not a git checkout, no main, a
# shallow clone).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
skip() { echo "check_format: skipped: $*"; exit 77; }
command -v clang-format >/dev/null 2>&1 || skip "clang-format is not installed (scripts/install_deps.sh installs it)"

base=""
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="${2:?--base needs a revision}"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) files+=("$1"); shift ;;
  esac
done

fail=0
check() {  # file [--lines=a:b ...]
  local out
  if ! out="$(clang-format --style=file --dry-run -Werror "$@" 2>&1)"; then
    echo "$out"
    fail=1
  fi
}

if [ ${#files[@]} -gt 0 ]; then
  for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "check_format: no such file: $f"; exit 2; }
    check "$f"
  done
  n=${#files[@]}
  what="whole files"
else
  if [ -z "$base" ]; then
    . "$root/scripts/change_base.sh"
    change_base "$root" || skip "$CHANGE_SKIP"
    base="$CHANGE_BASE"
  fi
  git rev-parse -q --verify "$base^{commit}" >/dev/null || { echo "check_format: unknown base: $base"; exit 2; }
  # Added or modified line ranges on the new side of one rename-aware diff (a moved file counts only
  # its changed lines): "+++ b/<path>", then hunk headers "@@ -a[,b] +c[,d] @@".
  declare -A ranges=()
  while IFS=$'\t' read -r f r; do
    ranges["$f"]+="$r "
  done < <(git diff -U0 -M --no-color --no-ext-diff --src-prefix=a/ --dst-prefix=b/ --diff-filter=ACMR "$base" -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' |
    awk '/^\+\+\+ / { f = substr($0, 7); next }
         /^@@ / { split($3, a, ","); c = substr(a[1], 2); d = (a[2] == "") ? 1 : a[2];
                  if (d > 0 && f != "") printf "%s\t--lines=%d:%d\n", f, c, c + d - 1 }')
  n=0
  for f in "${!ranges[@]}"; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    # shellcheck disable=SC2086  # the ranges are words
    check ${ranges[$f]} "$f"
  done
  what="files with lines changed since $(git rev-parse --short "$base")"
fi
if [ $fail -ne 0 ]; then
  echo "check_format: misformatted lines above (.clang-format); fix with: git clang-format ${base:-<base>}"
  exit 1
fi
echo "check_format: $n $what, formatted"
