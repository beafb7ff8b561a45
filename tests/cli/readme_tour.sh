#!/usr/bin/env bash
# Runs the README's tour as a new user would: every command line of the ```sh block under
# "## A quick tour", in order, in one shell, in a fresh copy of the repository's tracked files, with
# the built binary at build/cli/threewalls. A line "# -> TEXT" after a command is the output to expect:
# TEXT must appear in that command's stdout+stderr (runs of blanks compare equal). Lines "# GPU: ..."
# need a GPU and are not run. Fails with the README line that failed. With DOC, the same for another
# document (docs/walkthrough_megatron.md), whose output blocks are expectations too (below).
# Usage: readme_tour.sh SOURCE_DIR THREEWALLS_BINARY [WORK_DIR [DOC]]   (DOC: default README.md)
set -uo pipefail
src=$(cd "$1" && pwd) || exit 2
bin=$2
work=${3:-$(mktemp -d)}
doc=${4:-README.md}
[[ -x $bin ]] || { echo "readme_tour: $bin: not an executable" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

# A fresh copy: the tracked files when git knows the tree (what a clone holds), else the tree without
# build folders.
rm -rf "$work" && mkdir -p "$work/repo" || exit 2
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached | while IFS= read -r -d '' f; do
     [[ -e $f ]] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -C "$work/repo" -xf - || exit 2
  how="tracked files"
else
  tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$work/repo" -xf - || exit 2
  how="the source tree"
fi
mkdir -p "$work/repo/build/cli" && ln -s "$bin" "$work/repo/build/cli/threewalls"

# The lines to run, as "LINE_NUMBER<TAB>TEXT". README.md: the ```sh block under "## A quick tour".
# Another document (DOC, a path relative to SOURCE_DIR): every ```sh block in order, and each line of a
# plain ``` block right after one is output to expect from that block's last command.
if [[ $doc == README.md ]]; then
  mapfile -t block < <(awk '/^## A quick tour/{t=1; next} t && /^```sh/{b=1; next} b && /^```/{exit} b{print NR "\t" $0}' \
                       "$src/$doc")
else
  mapfile -t block < <(awk '/^```sh/{b=1; next} b && /^```/{b=0; after=1; next}
                            after && /^```$/{o=1; after=0; next} o && /^```/{o=0; next}
                            /^[^`]/ && !b && !o && NF{after=0}
                            b{print NR "\t" $0} o && NF{print NR "\t# -> " $0}' "$src/$doc")
fi
[[ ${#block[@]} -gt 0 ]] || { echo "readme_tour: no command lines found in $doc" >&2; exit 1; }

squeeze() { tr -s ' \t' '  '; }
cd "$work/repo" || exit 2
echo "readme_tour: ${#block[@]} lines, in a copy of $how at $work/repo"
ran=0 skipped=0 checked=0
last_out="" last_line="" last_no=0
for entry in "${block[@]}"; do
  no=${entry%%$'\t'*}
  line=${entry#*$'\t'}
  if [[ $line =~ ^#\ -\>\ (.*)$ ]]; then
    [[ -n $last_line ]] || continue  # the expectation of a skipped (GPU) line
    want=$(printf '%s' "${BASH_REMATCH[1]}" | squeeze)
    if ! squeeze <"$last_out" | grep -F -- "$want" >/dev/null; then
      echo "$doc:$last_no: the output of: $last_line" >&2
      echo "  lacks ($doc:$no): $want" >&2
      echo "  output (last 20 lines):" >&2; tail -20 "$last_out" | sed 's/^/    /' >&2
      exit 1
    fi
    checked=$((checked + 1))
    continue
  fi
  if [[ $line =~ ^#\ GPU: ]]; then skipped=$((skipped + 1)); last_line=""; continue; fi
  [[ -z ${line// /} || $line =~ ^[[:space:]]*# ]] && continue
  last_out="$work/out_$no.txt" last_line=$line last_no=$no
  t0=$(date +%s)
  eval "$line" >"$last_out" 2>&1
  rc=$?
  echo "$doc:$no ($(( $(date +%s) - t0 )) s, exit $rc): $line"
  if [[ $rc -ne 0 ]]; then
    echo "$doc:$no: exit $rc: $line" >&2
    echo "  output (last 20 lines):" >&2; tail -20 "$last_out" | sed 's/^/    /' >&2
    exit 1
  fi
  ran=$((ran + 1))
done
echo "readme_tour: $ran lines ran, $checked outputs as $doc says, $skipped GPU lines skipped"
cd / && rm -rf "$work/repo"  # passed: the copy and its runs (a trace of ~100 MB) are not kept
