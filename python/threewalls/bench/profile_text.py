"""A calibration profile's TOML text with one family replaced: how the package's benchmarks hand a
measured family to the C++ profile writer (`threewalls_merge_families INTO FROM OUT FAMILY` refits
it). The text is edited, not re-serialised, so every other family stays byte for byte."""
from __future__ import annotations

from typing import List


def replace_or_add_family(profile_text: str, path: str, family: str, block: str, comment: str) -> str:
    """`profile_text` with [family] replaced by `block`, or, where the profile has no such family,
    with `block` appended after a `# comment` line (the families' heading)."""
    if any(line.strip() == f"[{family}]" for line in profile_text.split("\n")):
        return replace_family(profile_text, path, family, block)
    return profile_text.rstrip("\n") + f"\n\n# {comment}\n" + block.rstrip("\n") + "\n"


def replace_family(profile_text: str, path: str, family: str, block: str) -> str:
    """`profile_text` with the [family] table and its [family.fit] table replaced by `block`.
    SystemExit naming `path` when the profile has no single [family] table."""
    lines: List[str] = profile_text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == f"[{family}]"]
    if len(starts) != 1:
        raise SystemExit(f"{path}: no single [{family}] family to replace")
    end = starts[0] + 1
    while end < len(lines):  # the family and its fit table, up to the next family's comment or table
        stripped = lines[end].strip()
        if (stripped.startswith("#") or stripped.startswith("[")) and stripped != f"[{family}.fit]":
            break
        end += 1
    return "\n".join(lines[:starts[0]] + block.split("\n") + lines[end:])
