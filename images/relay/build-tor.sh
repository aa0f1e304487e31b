#!/usr/bin/env bash
# build-tor.sh - build tor from Debian's (pinned) source package, optionally
# with torbed variant patches applied, and install the binaries into OUT/bin.
#
# Usage:
#   build-tor.sh --out DIR [--patch FILE]... [--check] [--tsan] [--jobs N]
#   build-tor.sh --list-patches VARIANT_DIR
#
#   --out DIR     install prefix of the result: DIR/bin/{tor,tor-gencert} and
#                 DIR/build.json.  DIR must not exist yet or is replaced.
#   --patch FILE  a -p1 unified diff against the pristine tor orig tree; may be
#                 repeated, patches are applied in the order given.
#   --check       also build tor's unit tests (with -Werror) and run the
#                 circuitmux test groups; the build fails if they fail.
#   --tsan        build with ThreadSanitizer (-fsanitize=thread -O1): the
#                 stress-check flavour of multi-threaded variants (mtrelay).
#                 Slow binaries, for checks only, never for measurements; run
#                 them with TSAN_OPTIONS=halt_on_error=1 to fail on a race.
#   --jobs N      parallel make jobs (default: number of CPUs).
#   --list-patches VARIANT_DIR
#                 print the patches of VARIANT_DIR/variant.yaml, one path a line,
#                 in the order they apply, and exit (the images' build stage has
#                 no Python; tests compare this with torbed.variants).
#
# Environment:
#   TORBED_CACHE        cache root (default $HOME/.cache/torbed); the source
#                       package is kept in $TORBED_CACHE/src.
#   TORBED_DEBIAN_MIRROR, TORBED_DEBIAN_SECURITY_MIRROR
#                       apt mirrors used to fetch the source package (defaults:
#                       the deb.debian.org URIs of Debian's own debian.sources).
#   TORBED_TOR_ORIG_URL direct URL of the orig tarball, used only when apt can
#                       no longer find the pinned version (e.g. a snapshot.debian.org
#                       URL).  The pinned checksum is verified either way.
#   CC, CFLAGS, LDFLAGS passed to configure as usual.
#   HOST                GNU triplet to cross-compile for (configure --host), e.g.
#                       aarch64-linux-gnu; gcc-$HOST is installed if missing (or
#                       set CC).  Used by the images' build stage for arm64.
#   DEB_HOST_ARCH       Debian arch whose -dev libraries to check/install when
#                       cross-compiling (e.g. arm64 -> libssl-dev:arm64); that
#                       architecture must have been added (dpkg --add-architecture).
#   PKG_CONFIG_LIBDIR   when cross-compiling, defaults to the target's multiarch
#                       pkg-config dirs (/usr/lib/$HOST/pkgconfig:/usr/share/pkgconfig).
#
# The script is used both by torbed's local backend (binaries cached per
# variant) and inside a `FROM debian:bookworm-slim` Docker build stage, so it
# only relies on what a fresh Debian 12 has (bash, apt, dpkg, coreutils, tar).
set -euo pipefail

# ---------------------------------------------------------------------------
# Pins.  Bump all three together; the checksum is the one apt reports in the
# Sources index (`apt-cache showsrc tor`) for the orig tarball.
# ---------------------------------------------------------------------------
TOR_VERSION=0.4.9.11
DEB_VERSION=0.4.9.11-0+deb12u1
ORIG_TARBALL="tor_${TOR_VERSION}.orig.tar.gz"
ORIG_SHA256=2e6c1720118c812acf0079fd47cf91b6bfaba5d766c321c4d3d2a28d6a11a8ed

DEBIAN_MIRROR=${TORBED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${TORBED_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

CACHE_ROOT=${TORBED_CACHE:-${HOME:-/root}/.cache/torbed}
SRC_CACHE="$CACHE_ROOT/src"

# Documentation formats need asciidoc; we never ship man pages in the testbed.
BASE_CONFIGURE_FLAGS=(--disable-asciidoc --disable-manpage --disable-html-manual)

# Build dependencies.  Libraries are per target architecture (matters only
# when cross-compiling); tools run on the build machine.
LIB_DEPS=(libssl-dev libevent-dev zlib1g-dev liblzma-dev libzstd-dev libcap-dev)
# (dpkg-dev also pulls in `patch`, which bookworm-slim lacks.)
TOOL_DEPS=(gcc make pkg-config dpkg-dev)
AUTOTOOLS_DEPS=(autoconf automake)

# Unit test groups run by --check, if the test binary has them (circuitmux_rr/
# only exists with the round-robin patch of variants/vanilla, torchestra/ with
# variants/torchestra, mtrelay/ with variants/mtrelay).  Set
# TORBED_CHECK_ALL=1 to run tor's whole unit test suite as well (~1 min).
CHECK_TEST_CANDIDATES=(circuitmux circuitmux_ewma circuitmux_rr torchestra mtrelay)

log() { printf '[build-tor] %s\n' "$*" >&2; }
die() { printf '[build-tor] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit "${1:-0}"
}

# The `patches:` key of a variant.yaml: a flow list (`patches: [a.patch, b.patch]`)
# or a block list (`- a.patch` lines); quotes and comments are allowed.
list_patches() {
  local dir=${1%/} yaml
  yaml="$dir/variant.yaml"
  [ -f "$yaml" ] || die "no variant.yaml in $dir"
  awk -v q="'" '
    function clean(x) {
      sub(/[ \t]+#.*$/, "", x); gsub(/^[ \t]+|[ \t]+$/, "", x)
      gsub("^[\"" q "]|[\"" q "]$", "", x); return x
    }
    /^patches:/ {
      rest = $0; sub(/^patches:[ \t]*/, "", rest); sub(/[ \t]*#.*$/, "", rest)
      if (rest ~ /^\[/) {
        gsub(/[][]/, "", rest); n = split(rest, a, ",")
        for (i = 1; i <= n; i++) { x = clean(a[i]); if (x != "") print x }
        exit
      }
      block = 1; next
    }
    block && /^[ \t]*-/ { x = $0; sub(/^[ \t]*-[ \t]*/, "", x); x = clean(x); if (x != "") print x; next }
    block && /^[ \t]*(#.*)?$/ { next }
    block { exit }
  ' "$yaml" | while IFS= read -r p; do
    [ -f "$dir/$p" ] || die "$yaml lists patch '$p', which is missing"
    printf '%s\n' "$dir/$p"
  done
}

# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------
OUT=""
PATCHES=()
CHECK=0
TSAN=0
JOBS=$(nproc 2>/dev/null || echo 2)

while [ $# -gt 0 ]; do
  case "$1" in
    --out)    [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
    --out=*)  OUT=${1#--out=}; shift ;;
    --patch)  [ $# -ge 2 ] || die "--patch needs a file"; PATCHES+=("$2"); shift 2 ;;
    --patch=*) PATCHES+=("${1#--patch=}"); shift ;;
    --check)  CHECK=1; shift ;;
    --tsan)   TSAN=1; shift ;;
    --jobs)   [ $# -ge 2 ] || die "--jobs needs a number"; JOBS=$2; shift 2 ;;
    --jobs=*) JOBS=${1#--jobs=}; shift ;;
    --list-patches) [ $# -ge 2 ] || die "--list-patches needs a variant directory"; list_patches "$2"; exit 0 ;;
    -h|--help) usage 0 ;;
    *) printf 'unknown argument: %s\n\n' "$1" >&2; usage 2 ;;
  esac
done

[ -n "$OUT" ] || { printf 'missing --out DIR\n\n' >&2; usage 2; }
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, got '$JOBS'"

# Resolve everything to absolute paths now: the build runs in a temp dir.
OUT=$(realpath -m -- "$OUT")
[ "$OUT" != "/" ] || die "refusing to use / as --out"
ABS_PATCHES=()
for p in ${PATCHES[@]+"${PATCHES[@]}"}; do
  [ -f "$p" ] || die "patch file not found: $p"
  ABS_PATCHES+=("$(realpath -- "$p")")
done

IS_ROOT=0
if [ "$(id -u)" -eq 0 ]; then IS_ROOT=1; fi

# ---------------------------------------------------------------------------
# Temp dirs and cleanup.  WORK holds the source tree and build; STAGE
# (OUT.tmp.XXXXXX, created at install time) is the staging area for the
# atomic install.  Both are removed on exit, so an interrupted or failed build
# never leaves a half-populated OUT (or a stale temp tree) behind.
# ---------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/build-tor.XXXXXX")
STAGE=""   # set to the OUT.tmp.* staging dir once we install
cleanup() {
  local rc=$?
  rm -rf -- "$WORK"
  [ -z "${STAGE:-}" ] || rm -rf -- "$STAGE"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
sha256() { sha256sum -- "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------------------
# Build dependencies: check with dpkg, install only what is missing.
# ---------------------------------------------------------------------------
pkg_installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

ensure_packages() {
  local missing=() p
  for p in "$@"; do
    pkg_installed "$p" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$IS_ROOT" -ne 1 ]; then
    die "missing build dependencies: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
  fi
  log "installing missing build dependencies: ${missing[*]}"
  # No `apt-get update` unless the install fails: a Docker stage or this
  # machine normally has fresh lists, and update is slow.  --no-remove: a
  # cross build's :arch -dev packages can conflict with the native ones
  # (libevent-dev); apt must fail then rather than remove the machine's packages.
  local apt=(apt-get install -y -q --no-install-recommends --no-remove)
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >&2; then
    log "apt-get install failed; refreshing package lists and retrying"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >&2 \
      || die "could not install: ${missing[*]} (cross-compiling? the target's -dev packages may conflict with this machine's: build in a container, e.g. the relay image's build stage)"
  fi
}

# Does any patch touch the autotools inputs?  Then Makefile.in/configure from
# the release tarball are stale and we must regenerate them.
patches_touch_build_system() {
  local p
  for p in ${ABS_PATCHES[@]+"${ABS_PATCHES[@]}"}; do
    if grep -Eq '^(\+\+\+|---) [^[:space:]]*(include\.am|Makefile\.am|configure\.ac|\.m4)([[:space:]]|$)' "$p"; then
      return 0
    fi
  done
  return 1
}

NEED_AUTORECONF=0
if patches_touch_build_system; then NEED_AUTORECONF=1; fi

DEPS=("${TOOL_DEPS[@]}")
if [ -n "${HOST:-}" ] && [ -z "${CC:-}" ]; then DEPS+=("gcc-$HOST"); fi
if [ -n "${DEB_HOST_ARCH:-}" ] && [ "$DEB_HOST_ARCH" != "$(dpkg --print-architecture)" ] \
   && ! dpkg --print-foreign-architectures | grep -qx "$DEB_HOST_ARCH"; then
  die "DEB_HOST_ARCH=$DEB_HOST_ARCH is not a configured architecture: dpkg --add-architecture $DEB_HOST_ARCH && apt-get update (best in a container: see below)"
fi
for p in "${LIB_DEPS[@]}"; do
  DEPS+=("$p${DEB_HOST_ARCH:+:$DEB_HOST_ARCH}")
done
if [ "$NEED_AUTORECONF" -eq 1 ]; then DEPS+=("${AUTOTOOLS_DEPS[@]}"); fi
ensure_packages "${DEPS[@]}"

# ---------------------------------------------------------------------------
# Fetch the pinned source package (cached).
#
# We use a private apt configuration (own sources.list with deb-src lines, own
# lists and cache dirs) so the system's apt sources are never modified; apt
# still verifies the archive signatures (Release -> Sources -> file hashes)
# and we additionally check the pinned sha256 of the orig tarball.
# ---------------------------------------------------------------------------
fetch_source() {
  local apt_dir="$WORK/apt" dl="$WORK/download"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dl" "$SRC_CACHE"

  local signed=""
  if [ -r "$DEBIAN_KEYRING" ]; then signed="[signed-by=$DEBIAN_KEYRING] "; fi
  cat > "$apt_dir/sources.list" <<EOF
deb-src ${signed}${DEBIAN_MIRROR} bookworm main
deb-src ${signed}${DEBIAN_MIRROR} bookworm-updates main
deb-src ${signed}${DEBIAN_SECURITY_MIRROR} bookworm-security main
EOF

  # The system's update hooks (docker-clean, packagekit, appstream) are about
  # the system's package lists, not ours: don't run them.
  cat > "$apt_dir/apt.conf" <<'EOF'
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
EOF

  local apt_opts=(
    -c "$apt_dir/apt.conf"
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Debug::NoLocking=1"
  )
  # apt drops privileges to _apt for downloads, which cannot read our
  # mode-0700 temp dir; we verify checksums ourselves, so just stay root.
  if [ "$IS_ROOT" -eq 1 ]; then apt_opts+=(-o "APT::Sandbox::User=root"); fi

  local ok=0
  log "fetching Debian source package tor=$DEB_VERSION (private apt config)"
  if apt-get "${apt_opts[@]}" -q update >&2 &&
     (cd "$dl" && apt-get "${apt_opts[@]}" -q source --download-only "tor=$DEB_VERSION" >&2); then
    ok=1
  elif [ -n "${TORBED_TOR_ORIG_URL:-}" ]; then
    log "apt could not fetch tor=$DEB_VERSION; trying TORBED_TOR_ORIG_URL"
    if command -v curl >/dev/null; then
      curl -fsSL -o "$dl/$ORIG_TARBALL" "$TORBED_TOR_ORIG_URL" && ok=1
    elif command -v wget >/dev/null; then
      wget -q -O "$dl/$ORIG_TARBALL" "$TORBED_TOR_ORIG_URL" && ok=1
    else
      log "neither curl nor wget is installed"
    fi
  fi
  if [ "$ok" -ne 1 ] || [ ! -f "$dl/$ORIG_TARBALL" ]; then
    die "could not download tor $DEB_VERSION source.  If Debian has superseded this
version, fetch $ORIG_TARBALL (sha256 $ORIG_SHA256) e.g. from
https://snapshot.debian.org/package/tor/$DEB_VERSION/ and either put it into
$SRC_CACHE/ or set TORBED_TOR_ORIG_URL."
  fi

  local got
  got=$(sha256 "$dl/$ORIG_TARBALL")
  [ "$got" = "$ORIG_SHA256" ] || die \
"checksum mismatch for downloaded $ORIG_TARBALL:
  expected $ORIG_SHA256
  got      $got"

  # Move into the cache only after verification (mv within one fs is atomic).
  local f
  for f in "$dl"/*; do
    cp -- "$f" "$SRC_CACHE/.$(basename "$f").part"
    mv -f -- "$SRC_CACHE/.$(basename "$f").part" "$SRC_CACHE/$(basename "$f")"
  done
}

T_FETCH=$(now)
ORIG="$SRC_CACHE/$ORIG_TARBALL"
if [ -f "$ORIG" ] && [ "$(sha256 "$ORIG")" = "$ORIG_SHA256" ]; then
  log "using cached $ORIG"
else
  if [ -f "$ORIG" ]; then log "cached $ORIG has the wrong checksum; refetching"; fi
  fetch_source
fi
FETCH_SECONDS=$(elapsed "$T_FETCH")

# ---------------------------------------------------------------------------
# Unpack and patch.
#
# We build the pristine upstream tree from the orig tarball and do NOT apply
# Debian's diff: for this version it only adds packaging under debian/ (there
# is no debian/patches series), so the tor code is identical to upstream and
# our patches apply to a tree anyone can reproduce from tor's release.
# ---------------------------------------------------------------------------
T_BUILD=$(now)
log "unpacking $ORIG_TARBALL"
tar -xzf "$ORIG" -C "$WORK"
SRC="$WORK/tor-$TOR_VERSION"
[ -d "$SRC" ] || die "orig tarball did not contain tor-$TOR_VERSION/"

PATCH_JSON=""
for p in ${ABS_PATCHES[@]+"${ABS_PATCHES[@]}"}; do
  log "applying $(basename "$p")"
  # --dry-run first so a failing patch leaves no partial changes behind and
  # its output is shown in full.
  if ! out=$(patch -p1 -N --dry-run -d "$SRC" < "$p" 2>&1); then
    printf '%s\n' "$out" >&2
    die "patch does not apply to tor $TOR_VERSION: $p"
  fi
  patch -p1 -N -s -d "$SRC" < "$p" || die "patch failed to apply: $p"
  PATCH_JSON+="${PATCH_JSON:+,}{\"file\": \"$(basename "$p")\", \"sha256\": \"$(sha256 "$p")\"}"
done

cd "$SRC"
if [ "$NEED_AUTORECONF" -eq 1 ]; then
  log "patches change the build system: running autoreconf -fi"
  autoreconf -fi >&2
fi

# ---------------------------------------------------------------------------
# Configure and build.
# ---------------------------------------------------------------------------
CONFIGURE_FLAGS=("${BASE_CONFIGURE_FLAGS[@]}")
if [ "$CHECK" -eq 1 ]; then
  # Check builds also prove that tor (including our patches and their unit
  # tests) compiles warning-free: -Werror with tor's own warning set.
  CONFIGURE_FLAGS+=(--enable-fatal-warnings)
else
  CONFIGURE_FLAGS+=(--disable-unittests)
  # Native builds use the same -Werror (configure adds it after its own checks,
  # so the binary is the one it would be without): a patch set's check build
  # then compiles tor's own files with the command lines of its variant build,
  # and the compiler cache serves them.  Not for cross or TSan builds, whose
  # compilers warn where the native one does not.
  if [ -z "${HOST:-}" ] && [ "$TSAN" -eq 0 ]; then
    CONFIGURE_FLAGS+=(--enable-fatal-warnings)
  fi
fi
# Cross-compilation: let configure pick $HOST-gcc (or $CC) and the target's
# pkg-config files; nothing below assumes the build machine's architecture.
if [ -n "${HOST:-}" ]; then
  CONFIGURE_FLAGS+=("--host=$HOST")
  # Without a $HOST-pkg-config wrapper configure would run the build machine's
  # pkg-config and find the native libraries' flags.
  export PKG_CONFIG_LIBDIR=${PKG_CONFIG_LIBDIR:-/usr/lib/$HOST/pkgconfig:/usr/share/pkgconfig}
fi

# The build dir has a random name; map it to a fixed one in debug info and
# __FILE__ strings so identical inputs give identical binaries (the binaries'
# sha256 in build.json is then meaningful across builds).
if [ "$TSAN" -eq 1 ]; then
  # -O1 keeps TSan's reports readable and its slowdown tolerable.
  CFLAGS="${CFLAGS:--g -O1} -fsanitize=thread -fno-omit-frame-pointer"
  export LDFLAGS="${LDFLAGS:-} -fsanitize=thread"
fi
CFLAGS_RECORDED="${CFLAGS:--g -O2} -ffile-prefix-map=<builddir>=tor-$TOR_VERSION"
export CFLAGS="${CFLAGS:--g -O2} -ffile-prefix-map=$SRC=tor-$TOR_VERSION"

log "configure ${CONFIGURE_FLAGS[*]} CFLAGS='$CFLAGS'"
./configure "${CONFIGURE_FLAGS[@]}" > "$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "configure failed (see output above)"; }

log "make -j$JOBS"
if [ "$CHECK" -eq 1 ]; then
  MAKE_TARGETS=(src/app/tor src/tools/tor-gencert src/test/test)
else
  MAKE_TARGETS=(src/app/tor src/tools/tor-gencert)
fi
make -j"$JOBS" "${MAKE_TARGETS[@]}" > "$WORK/make.log" 2>&1 \
  || { grep -E 'error|Error' "$WORK/make.log" | head -n 40 >&2; tail -n 20 "$WORK/make.log" >&2; die "build failed"; }

CHECK_TEST_GROUPS=()
if [ "$CHECK" -eq 1 ]; then
  tests_listed=$(./src/test/test --list-tests)
  for g in "${CHECK_TEST_CANDIDATES[@]}"; do
    if grep -Eq "^[[:space:]]*$g/" <<<"$tests_listed"; then CHECK_TEST_GROUPS+=("$g/.."); fi
  done
  log "running unit tests: ${CHECK_TEST_GROUPS[*]}"
  ./src/test/test "${CHECK_TEST_GROUPS[@]}" >&2 || die "unit tests failed: ${CHECK_TEST_GROUPS[*]}"
  if [ "${TORBED_CHECK_ALL:-0}" = 1 ]; then
    log "running tor's full unit test suite (TORBED_CHECK_ALL=1)"
    # shellcheck disable=SC2065  # tor's src/test/test binary, not test(1)
    ./src/test/test > "$WORK/test-all.log" 2>&1 \
      || { grep -E 'FAIL|\[.*FAILED\]' "$WORK/test-all.log" >&2; tail -n 3 "$WORK/test-all.log" >&2; die "tor unit tests failed"; }
    tail -n 1 "$WORK/test-all.log" >&2
    CHECK_TEST_GROUPS+=(all)
  fi
fi
BUILD_SECONDS=$(elapsed "$T_BUILD")

# ---------------------------------------------------------------------------
# Install into OUT.tmp.XXXXXX (unique, so concurrent builds of the same OUT
# cannot trample each other; same parent dir so the final rename is atomic),
# then rename it to OUT.
# ---------------------------------------------------------------------------
mkdir -p -- "$(dirname -- "$OUT")"
STAGE=$(mktemp -d "$OUT.tmp.XXXXXX")
chmod 0755 "$STAGE"
mkdir -p "$STAGE/bin"
install -m 0755 src/app/tor "$STAGE/bin/tor"
install -m 0755 src/tools/tor-gencert "$STAGE/bin/tor-gencert"

CC_CMD=${CC:-${HOST:+$HOST-}gcc}
CC_VERSION=$($CC_CMD --version 2>/dev/null | head -n 1 || echo unknown)
TARGET_TRIPLET=$($CC_CMD -dumpmachine 2>/dev/null || echo unknown)
REPORTED_VERSION=unknown
if [ -z "${HOST:-}" ]; then
  REPORTED_VERSION=$("$STAGE/bin/tor" --version 2>/dev/null | head -n 1 || echo unknown)
fi

json_str() { # minimal JSON string escaping for the values we emit
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$s"
}
json_array() {
  local first=1 v
  printf '['
  for v in "$@"; do
    [ $first -eq 1 ] || printf ', '
    json_str "$v"; first=0
  done
  printf ']'
}

cat > "$STAGE/build.json" <<EOF
{
  "tor_version": "$TOR_VERSION",
  "tor_version_output": $(json_str "$REPORTED_VERSION"),
  "debian_version": "$DEB_VERSION",
  "orig_tarball": "$ORIG_TARBALL",
  "orig_sha256": "$ORIG_SHA256",
  "debian_patches_applied": false,
  "patches": [${PATCH_JSON}],
  "autoreconf": $([ "$NEED_AUTORECONF" -eq 1 ] && echo true || echo false),
  "configure_flags": $(json_array "${CONFIGURE_FLAGS[@]}"),
  "cflags": $(json_str "$CFLAGS_RECORDED"),
  "check": $([ "$CHECK" -eq 1 ] && echo true || echo false),
  "tsan": $([ "$TSAN" -eq 1 ] && echo true || echo false),
  "check_test_groups": $([ "$CHECK" -eq 1 ] && json_array "${CHECK_TEST_GROUPS[@]}" || echo '[]'),
  "fetch_seconds": $FETCH_SECONDS,
  "build_seconds": $BUILD_SECONDS,
  "jobs": $JOBS,
  "compiler": $(json_str "$CC_VERSION"),
  "arch": $(json_str "$TARGET_TRIPLET"),
  "build_arch": $(json_str "$(uname -m)"),
  "binaries": {
    "tor": {"sha256": "$(sha256 "$STAGE/bin/tor")"},
    "tor-gencert": {"sha256": "$(sha256 "$STAGE/bin/tor-gencert")"}
  },
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF

# Replace OUT in two renames; the window without OUT is tiny and OUT is never
# half-written.  (Readers should treat a missing OUT/build.json as "absent".)
OLD=""
if [ -e "$OUT" ]; then
  OLD="$OUT.old.$$"
  mv -- "$OUT" "$OLD"
fi
mv -- "$STAGE" "$OUT"
STAGE=""
[ -z "$OLD" ] || rm -rf -- "$OLD"
log "installed tor $TOR_VERSION into $OUT (build ${BUILD_SECONDS}s)"
