#!/usr/bin/env bash
# Fails (exit 1, one line per file) when a Python or shell script of scripts/, bench/ or .ci/ does
# not parse: most of them run only on a GPU machine or by hand, so CI checks at least that they
# would start. Python with ast.parse (no bytecode written), shell with bash -n.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
status=0
for f in scripts/*.py bench/*.py; do
  [ -e "$f" ] || continue
  if ! out=$(python3 -c 'import ast, sys; ast.parse(open(sys.argv[1], encoding="utf-8").read(), sys.argv[1])' "$f" 2>&1); then
    echo "check_scripts_parse: $f: $(echo "$out" | tail -1)"
    status=1
  fi
done
for f in scripts/*.sh bench/*.sh .ci/run; do
  [ -e "$f" ] || continue
  if ! out=$(bash -n "$f" 2>&1); then
    echo "check_scripts_parse: $f: $(echo "$out" | head -1)"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "check_scripts_parse: every script parses"
exit "$status"
