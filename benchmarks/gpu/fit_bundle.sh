#!/usr/bin/env bash
# Re-split the staged stack bundle (.devbundle/p*, from ../shared/device/build_bundle.sh) into parts that fit beside
# this working tree in one device transfer: a call carries the tree (tracked and untracked files; ~20 MiB, most of
# it benchmarks/results) plus one part, under 64 MiB, so 58-MiB parts no longer fit. The zstandard wheel goes with
# the last part. Prints the stage command per part.
#   bash benchmarks/gpu/fit_bundle.sh [LIMIT_MIB]      (default 64)
set -euo pipefail
cd "$(dirname "$0")/../.."
limit_mib=${1:-64}
ls .devbundle/p*/part* > /dev/null 2>&1 || { echo "no .devbundle parts: run ../shared/device/build_bundle.sh first" >&2; exit 1; }
# Tracked files moved aside (benchmarks/results, held out of a transfer) make du fail; count what is here.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2> /dev/null | tail -1 | cut -f1) || true
part=$(( (limit_mib - 2) * 1024 * 1024 - tree ))
[ "$part" -gt $((8 * 1024 * 1024)) ] || { echo "the tree ($tree bytes) leaves no room for a part" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat .devbundle/p*/part* > "$work/site.tar.zst"
cp .devbundle/p0/stage.sh "$work/"
cp .devbundle/p*/*.whl "$work/" 2> /dev/null || true
rm -rf .devbundle/p*
split -b "$part" -d -a 1 "$work/site.tar.zst" "$work/part"
parts=("$work"/part[0-9])
n=${#parts[@]}
for i in $(seq 0 $((n - 1))); do
  mkdir -p ".devbundle/p$i"
  mv "$work/part$i" ".devbundle/p$i/"
  cp "$work/stage.sh" ".devbundle/p$i/"
done
cp "$work"/*.whl ".devbundle/p$((n - 1))/" 2> /dev/null || true
echo "tree $((tree / 1024 / 1024)) MiB; $n parts of at most $((part / 1024 / 1024)) MiB. One call each, back to back:"
for i in $(seq 0 $((n - 1))); do
  last=""; [ "$i" = $((n - 1)) ] && last=" $n"
  echo "  carry .devbundle/p$i  ->  bash .devbundle/p$i/stage.sh .devbundle/p$i$last"
done
