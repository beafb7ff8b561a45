#!/usr/bin/env bash
# Renders a threewalls HTML report (threewalls export --format html) to a PNG with headless Chromium
# (Debian package `chromium`), e.g. for docs/images/report.png:
#   scripts/render_report.sh REPORT.html OUT.png [WIDTH HEIGHT]
# The report is self-contained; every network feature of the browser is switched off anyway, and the
# browser runs with a fresh, throw-away profile.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH HEIGHT]" >&2
  exit 2
fi
report=$1
out=$2
width=${3:-1320}
height=${4:-2400}
[[ -f "$report" ]] || { echo "$0: $report: no such file" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$browser" ]] || { echo "$0: chromium not found (apt-get install -y chromium)" >&2; exit 3; }

profile=$(mktemp -d "${TMPDIR:-/tmp}/tw-chromium.XXXXXX")
trap 'rm -rf "$profile"' EXIT
abs_report=$(readlink -f "$report")
abs_out=$(readlink -m "$out")
mkdir -p "$(dirname "$abs_out")"
rm -f "$abs_out"

"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --hide-scrollbars --user-data-dir="$profile" \
  --window-size="${width},${height}" --screenshot="$abs_out" "file://${abs_report}" >/dev/null 2>&1 || true

if [[ ! -s "$abs_out" ]]; then
  echo "$0: chromium wrote no screenshot to $abs_out" >&2
  exit 3
fi
echo "wrote $abs_out (${width}x${height})"
