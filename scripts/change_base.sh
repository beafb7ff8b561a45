# Sourced by scripts/check_format.sh and scripts/check_tidy.sh: where "the change" starts.
#
# change_base ROOT: sets CHANGE_BASE to the merge-base of HEAD with main (on a branch: every commit
# since it left main, and what is not committed yet). On main itself, or behind it, that is HEAD:
# then the uncommitted C++ changes if there are any, else the last commit (HEAD~1). Returns 1 with
# a one-line reason in CHANGE_SKIP outside a git checkout, without a main branch, or without a commit
# before HEAD (a shallow clone).
CXX_PATHSPEC=('*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
change_base() {
  local root="$1"
  CHANGE_BASE=""
  CHANGE_SKIP=""
  if [ "$(git -C "$root" rev-parse --show-toplevel 2>/dev/null)" != "$root" ]; then
    CHANGE_SKIP="$root is not a git checkout"; return 1
  fi
  git -C "$root" rev-parse -q --verify main >/dev/null || { CHANGE_SKIP="no main branch to compare with"; return 1; }
  CHANGE_BASE="$(git -C "$root" merge-base HEAD main)" || { CHANGE_SKIP="HEAD and main have no common commit"; return 1; }
  if [ "$CHANGE_BASE" = "$(git -C "$root" rev-parse HEAD)" ] &&
     git -C "$root" diff --quiet HEAD -- "${CXX_PATHSPEC[@]}"; then
    CHANGE_BASE="$(git -C "$root" rev-parse -q --verify HEAD~1)" ||
      { CHANGE_SKIP="no commit before HEAD to compare with (a shallow clone?)"; return 1; }
  fi
  return 0
}
