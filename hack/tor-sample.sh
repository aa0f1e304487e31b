#!/usr/bin/env bash
# `make tor-sample`: regenerate scenarios/tor-sample-60.yaml from CollecTor's documents that
# the user downloaded (torbed never downloads anything; docs/generate.md, "The shipped sample").
#
#   COLLECTOR_DIR  where the documents are (default ~/.cache/torbed/collector)
#   CAPACITY       consensus (default): capacities from the consensus weights, exactly as the
#                  committed file was made; descriptors: from the server descriptors of
#                  2022-10 and 2022-11 (the method torbed prefers; a different file)
#   OUT            the scenario to write (default: the committed file for CAPACITY=consensus,
#                  scenarios/tor-sample-60-descriptors.yaml for CAPACITY=descriptors)
#   BUDGET         pinned (default): the 2-core, 22000 MiB budget the sample was sized for, so
#                  the output does not depend on the machine; for CAPACITY=consensus also the
#                  committed file's rates' sum (8.95 MB/s: it was sized with the first budget
#                  model, 0.04 cores per relayed MB/s; the measured model admits it, expecting
#                  2.96 MB/s relayed and 1.26 of 2 cores, and the network comes out identical);
#                  machine: this machine's budget
#
# Download (about 60 MB for the consensus archive, 2 x ~450 MB for the descriptors):
#   curl -O https://collector.torproject.org/archive/relay-descriptors/consensuses/consensuses-2022-11.tar.xz
#   tar -xJf consensuses-2022-11.tar.xz consensuses-2022-11/19/2022-11-19-10-00-00-consensus
#   mv consensuses-2022-11/19/2022-11-19-10-00-00-consensus "$COLLECTOR_DIR"/
#   curl -O https://collector.torproject.org/archive/relay-descriptors/server-descriptors/server-descriptors-2022-11.tar.xz
#   curl -O https://collector.torproject.org/archive/relay-descriptors/server-descriptors/server-descriptors-2022-10.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dir=${COLLECTOR_DIR:-$HOME/.cache/torbed/collector}
capacity=${CAPACITY:-consensus}
budget=${BUDGET:-pinned}
cons=2022-11-19-10-00-00-consensus
# The document the committed file was made from (a tor client's cache of the same consensus,
# without CollecTor's "@type" first line): its SHA-256.
want=49bbf2ccd9073776f4a4cacd9e5d21ec3097cadc6e6879d99b2a995834047ca2
case $capacity in
  consensus) out=${OUT:-scenarios/tor-sample-60.yaml}; sources=(--capacity-from-consensus) ;;
  descriptors) out=${OUT:-scenarios/tor-sample-60-descriptors.yaml}
    sources=("$dir/server-descriptors-2022-11.tar.xz" "$dir/server-descriptors-2022-10.tar.xz") ;;
  *) echo "tor-sample: CAPACITY=$capacity: use consensus or descriptors" >&2; exit 2 ;;
esac
case $budget in
  pinned) sizing=(--cores 2 --memory-mib 22000 --bench-dir '')
    if [ "$capacity" = consensus ]; then sizing+=(--total-rate 8.95MB/s); fi ;;
  machine) sizing=() ;;
  *) echo "tor-sample: BUDGET=$budget: use pinned or machine" >&2; exit 2 ;;
esac
for f in "$dir/$cons" "${sources[@]}"; do
  if [ "${f#--}" = "$f" ] && [ ! -f "$f" ]; then
    echo "tor-sample: $f: missing; download it from CollecTor (commands at the top of $0)" >&2
    exit 2
  fi
done
# CollecTor's copy starts with "@type network-status-consensus-3 1.0"; the rest is the document
# the authorities signed. Generate from that rest, under the same name, so the output records the
# same digest and path as the committed file when the document is the same one.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed '1{/^@type /d}' "$dir/$cons" > "$work/$cons"
got=$(sha256sum "$work/$cons" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "tor-sample: $dir/$cons: SHA-256 $got (without its @type line), not the $want the committed file records" >&2
  echo "tor-sample: continuing; the scenario will differ from the committed one" >&2
fi
case $out in /*) ;; *) out=$repo/$out ;; esac
abs_sources=()
for f in "${sources[@]}"; do
  case $f in --*) abs_sources+=("$f") ;; *) abs_sources+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")") ;; esac
done
cd "$work"
"$repo/.venv/bin/torbed" generate "$cons" "${abs_sources[@]}" --relays 60 --seed 1 "${sizing[@]}" \
  --variants vanilla,ewma-66,kist --name tor-sample-60 --force -o "$out"
echo "tor-sample: wrote $out; compare: git -C $repo diff --stat -- $out" >&2
