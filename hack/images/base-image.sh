#!/usr/bin/env bash
# base-image.sh - make sure the base image exists in the local Docker engine for an
# architecture, so the Dockerfiles keep the standard `FROM debian:bookworm-slim`.
#
# Usage:
#   hack/images/base-image.sh [--arch amd64|arm64]
#
#   --arch A   architecture of the image (default: the host's). For a foreign architecture
#              qemu-user-static + binfmt_misc are set up too: debootstrap's second stage and
#              the RUN steps of that architecture's stages run under emulation.
#
# Prints the image reference to build FROM for that architecture on stdout.
#
# Order: `docker pull` (works where a registry is reachable); else debootstrap
# --variant=minbase bookworm, slimmed like the official image, and `docker import`.
# The rootfs tarball is cached as $TORBED_CACHE/base/debian-bookworm-minbase-<arch>.tar
# (default cache ~/.cache/torbed), so a re-import after `docker system prune` takes seconds.
#
# Tags: dockerd 20.10 keeps one image (one architecture) per tag, so `debian:bookworm-slim`
# is always the host's architecture (what `FROM --platform=$BUILDPLATFORM` stages and native
# builds resolve to) and each architecture's image is also kept as
# torbed/base:bookworm-slim-<arch>; a cross build passes that as the runtime stage's
# BASE_IMAGE. docker import ignores --platform on dockerd 20.10, so a foreign architecture is
# written into the image config (save -> edit -> load).
#
# Environment: TORBED_CACHE, TORBED_DEBIAN_MIRROR (default http://deb.debian.org/debian),
#              TORBED_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security),
#              DOCKER (client to use; default: docker).
set -euo pipefail

IMAGE=debian:bookworm-slim
DOCKER=${DOCKER:-docker}
CACHE_ROOT=${TORBED_CACHE:-${HOME:-/root}/.cache/torbed}
MIRROR=${TORBED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${TORBED_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
LOG_TAG=base-image

HOST_ARCH=$(dpkg --print-architecture)
ARCH=$HOST_ARCH
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) [ $# -ge 2 ] || die "--arch needs amd64 or arm64"; ARCH=$2; shift 2 ;;
    --arch=*) ARCH=${1#--arch=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) printf 'unknown argument: %s\n' "$1" >&2; exit 2 ;;
  esac
done
case "$ARCH" in amd64|arm64) ;; *) die "--arch must be amd64 or arm64, got '$ARCH'" ;; esac
KEEP=torbed/base:bookworm-slim-$ARCH
TARBALL=$CACHE_ROOT/base/debian-bookworm-minbase-$ARCH.tar

image_arch() { "$DOCKER" image inspect -f '{{.Architecture}}' "$1" 2>/dev/null || true; }

apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages: ${missing[*]} (needs root: apt-get install ${missing[*]})"
  log "installing ${missing[*]}"
  local apt=(apt-get -y -q -o DPkg::Lock::Timeout=600)
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2 || {
    "${apt[@]}" update >&2 || true
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2
  } || die "apt-get install ${missing[*]} failed"
}

# Foreign-architecture binaries (debootstrap's second stage, RUN in an arm64 stage) run via
# qemu. The F flag makes the kernel open the interpreter at registration time, which is what
# lets it work inside containers whose rootfs has no qemu.
ensure_binfmt() {
  [ "$ARCH" != "$HOST_ARCH" ] || return 0
  [ "$ARCH" = arm64 ] || die "no emulation set-up for $ARCH"
  apt_install qemu-user-static binfmt-support
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
      || die "cannot mount binfmt_misc (needs root and a kernel with binfmt_misc)"
  fi
  if ! grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
    update-binfmts --enable qemu-aarch64 >&2 || die "update-binfmts --enable qemu-aarch64 failed"
  fi
  grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || log "warning: qemu-aarch64 is registered without the F flag; RUN in arm64 stages may fail"
}

# Done when the image exists; for the host's architecture also make sure debian:bookworm-slim
# is there (a real one from a registry is kept as it is).
done_if_present() {
  if [ "$ARCH" = "$HOST_ARCH" ] && [ "$(image_arch "$IMAGE")" = "$ARCH" ]; then
    [ "$(image_arch "$KEEP")" = "$ARCH" ] || "$DOCKER" tag "$IMAGE" "$KEEP"
    echo "$IMAGE"; exit 0
  fi
  if [ "$(image_arch "$KEEP")" = "$ARCH" ]; then
    if [ "$ARCH" = "$HOST_ARCH" ]; then "$DOCKER" tag "$KEEP" "$IMAGE"; echo "$IMAGE"; else echo "$KEEP"; fi
    exit 0
  fi
}

ensure_binfmt
done_if_present

# A registry may be reachable elsewhere (CI with Docker Hub, a mirror): then the real image.
# Pulling a foreign architecture moves the debian:bookworm-slim tag: put it back.
log "trying docker pull --platform linux/$ARCH $IMAGE"
previous=$("$DOCKER" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
if timeout 60 "$DOCKER" pull -q --platform "linux/$ARCH" "$IMAGE" >/dev/null 2>&1 \
   && [ "$(image_arch "$IMAGE")" = "$ARCH" ]; then
  "$DOCKER" tag "$IMAGE" "$KEEP"
  if [ "$ARCH" != "$HOST_ARCH" ] && [ -n "$previous" ]; then "$DOCKER" tag "$previous" "$IMAGE"; fi
  done_if_present
fi
log "pull failed (no registry reachable); building the image with debootstrap"

make_rootfs() {
  [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
  apt_install debootstrap
  local dir t0=$SECONDS
  dir=$(mktemp -d "${TMPDIR:-/tmp}/torbed-rootfs.XXXXXX")
  # shellcheck disable=SC2064  # expand $dir now
  trap "rm -rf -- '$dir'" EXIT
  log "debootstrap --arch=$ARCH --variant=minbase bookworm ($MIRROR; ~30 s native, ~1.5 min emulated)"
  debootstrap --arch="$ARCH" --variant=minbase bookworm "$dir" "$MIRROR" \
    > "$dir.debootstrap.log" 2>&1 || { tail -n 30 "$dir.debootstrap.log" >&2; die "debootstrap failed"; }
  rm -f "$dir.debootstrap.log"

  # What the official slim image does, so images built on ours stay as small: no docs,
  # man pages or translations from later installs (copyright files stay), updates and
  # security sources, no package cache.
  cat > "$dir/etc/dpkg/dpkg.cfg.d/torbed-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "$dir"/usr/share/{man,info,locale,lintian}/* 
  rm -f "$dir/etc/apt/sources.list"
  cat > "$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat > "$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* "$dir"/var/log/*.log "$dir"/tmp/*
  : > "$dir/etc/resolv.conf"
  : > "$dir/etc/hostname"

  mkdir -p "$(dirname "$TARBALL")"
  tar --numeric-owner -C "$dir" -cf "$TARBALL.part" .
  mv -f "$TARBALL.part" "$TARBALL"
  rm -rf -- "$dir"
  trap - EXIT
  log "rootfs cached: $TARBALL ($(du -h "$TARBALL" | cut -f1), $((SECONDS - t0)) s)"
}

# dockerd 20.10 records the daemon's architecture for imported images whatever --platform
# says; rewrite it in the image config and load the result.
fix_arch() {
  local ref=$1 dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/torbed-image.XXXXXX")
  "$DOCKER" save "$ref" | tar -C "$dir" -xf -
  python3 - "$dir" "$ARCH" <<'EOF'
import hashlib, json, os, sys
d, arch = sys.argv[1], sys.argv[2]
with open(os.path.join(d, "manifest.json")) as f:
    manifest = json.load(f)
old = manifest[0]["Config"]
with open(os.path.join(d, old)) as f:
    config = json.load(f)
config["architecture"] = arch
if arch == "arm64":
    config["variant"] = "v8"
data = json.dumps(config, separators=(",", ":")).encode()
new = hashlib.sha256(data).hexdigest() + ".json"
os.remove(os.path.join(d, old))
with open(os.path.join(d, new), "wb") as f:
    f.write(data)
manifest[0]["Config"] = new
with open(os.path.join(d, "manifest.json"), "w") as f:
    json.dump(manifest, f)
EOF
  local before
  before=$("$DOCKER" image inspect -f '{{.Id}}' "$ref")
  tar -C "$dir" -cf - . | "$DOCKER" load -q >&2
  rm -rf -- "$dir"
  "$DOCKER" rmi "$before" >/dev/null 2>&1 || true
}

[ -s "$TARBALL" ] || make_rootfs
log "docker import $TARBALL as $KEEP"
"$DOCKER" import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["bash"]' \
  -m "debootstrap --variant=minbase bookworm ($ARCH), made by torbed hack/images/base-image.sh" \
  "$TARBALL" "$KEEP" >/dev/null
if [ "$(image_arch "$KEEP")" != "$ARCH" ]; then fix_arch "$KEEP"; fi
[ "$(image_arch "$KEEP")" = "$ARCH" ] || die "$KEEP has architecture $(image_arch "$KEEP"), expected $ARCH"
log "$KEEP: linux/$ARCH, $("$DOCKER" image inspect -f '{{.Size}}' "$KEEP" | awk '{printf "%.0f MB", $1/1e6}')"
done_if_present
die "internal error: $KEEP missing after import"
