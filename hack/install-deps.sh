#!/usr/bin/env bash
# Installs the Debian packages torbed needs, only those missing (idempotent, quick when done).
# Used by `make setup`; CI and fresh machines get everything from here, nothing by hand.
set -euo pipefail

packages=(
  tor                 # tor-gencert and a system tor (--system-tor); variants build their own
  iproute2            # ip netns, tc
  util-linux          # unshare (rootless runs, kernel probes)
  procps psmisc
  python3-venv
  # building tor variants from Debian's source package (images/relay/build-tor.sh)
  gcc make pkg-config dpkg-dev libssl-dev libevent-dev zlib1g-dev liblzma-dev libzstd-dev libcap-dev
  autoconf automake
  ccache              # build-tor.sh's compiler cache: a variant after the first recompiles only what its patches change
  tcpdump             # torbed capture (and its integration test)
  prometheus          # live metrics of local runs (torbed.backends.local.prometheus); Debian's 2.42
  chromium            # the browser check of Prometheus' graph page (tests/integration)
)
# `hack/install-deps.sh --capture`: what hack/capture-traces.sh needs to make the project's
# own traces (an SSH server and client, ethtool to turn veth offloads off so captures show
# wire-sized segments; its headless browser, chromium, is in the list above); not needed by
# `make test`.
if [ "${1:-}" = "--capture" ]; then
  packages+=(openssh-server openssh-client ethtool)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
# Debian's tor package may start a system tor that would try to reach the public network;
# torbed never needs it.
if command -v service >/dev/null && service tor status >/dev/null 2>&1; then
  service tor stop || true
fi
# Likewise Debian's prometheus package starts a system server (scraping this host on :9090);
# torbed starts its own per run.
if command -v service >/dev/null && service prometheus status >/dev/null 2>&1; then
  service prometheus stop || true
fi
