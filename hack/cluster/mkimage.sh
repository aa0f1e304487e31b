#!/usr/bin/env bash
# mkimage.sh OUT.tar NAME:TAG ROOTFS_DIR ENTRYPOINT [ARG...]
#
# Write a one-layer image "FROM scratch" holding ROOTFS_DIR as a `docker save` style archive,
# which `ctr images import` (and `docker load`) accept. No Docker daemon is needed, so the
# cluster's own images (pause, CoreDNS, busybox) build on machines without one. The layer
# is reproducible: fixed owner, mtime and file order.
set -euo pipefail

[ $# -ge 4 ] || { echo "usage: $0 OUT.tar NAME:TAG ROOTFS_DIR ENTRYPOINT [ARG...]" >&2; exit 2; }
out=$1 ref=$2 rootfs=$3
shift 3
[ -d "$rootfs" ] || { echo "mkimage: $rootfs is not a directory" >&2; exit 1; }

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tar -C "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)

# JSON string list of the entrypoint words (they are plain paths and flags: no escaping needed
# beyond quotes and backslashes).
json_list() {
  local first=1 w
  printf '['
  for w in "$@"; do
    w=${w//\\/\\\\}
    w=${w//\"/\\\"}
    [ $first = 1 ] || printf ','
    printf '"%s"' "$w"
    first=0
  done
  printf ']'
}

printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":%s,"Env":["PATH=/bin:/"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"torbed hack/cluster/mkimage.sh"}]}' \
  "$arch" "$(json_list "$@")" "$diff_id" >"$work/config.json"
config_id=$(sha256sum "$work/config.json" | cut -d' ' -f1)

mkdir "$work/img" "$work/img/$diff_id"
mv "$work/layer.tar" "$work/img/$diff_id/layer.tar"
mv "$work/config.json" "$work/img/$config_id.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
  "$config_id" "$ref" "$diff_id" >"$work/img/manifest.json"

tar -C "$work/img" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$out.tmp" .
mv "$out.tmp" "$out"
