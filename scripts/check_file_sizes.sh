#!/usr/bin/env bash
# Fails (exit 1, one line per file) when a file tracked by git is over the limit: 1 MB (1,000,000
# bytes), or the first argument in bytes. Raw output (run archives, logs) belongs in the untracked
# results/ folder and a summary page in docs/validation/ (docs/validation/README.md).
# Exit 77 (CTest: skipped) with a one-line reason outside a git checkout.
set -uo pipefail
limit="${1:-1000000}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if ! command -v git >/dev/null 2>&1; then
  echo "check_file_sizes: skipped: git is not installed"
  exit 77
fi
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" != "$root" ]; then
  echo "check_file_sizes: skipped: $root is not a git checkout"
  exit 77
fi
# The index holds what is tracked (committed, or staged to be): the size of each blob in it.
over="$(git ls-files -s -z | tr '\0' '\n' | awk '{print $2 " " substr($0, index($0, "\t") + 1)}' |
  git cat-file --batch-check='%(objectsize) %(rest)' |
  awk -v limit="$limit" '$1 > limit { printf "tracked file over %d bytes: %s (%d bytes)\n", limit, substr($0, length($1) + 2), $1 }')"
if [ -n "$over" ]; then
  echo "$over"
  echo "check_file_sizes: move raw output to results/ (untracked) and summarize it in docs/validation/"
  exit 1
fi
echo "check_file_sizes: $(git ls-files | wc -l) tracked files, none over $limit bytes"
