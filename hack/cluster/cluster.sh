#!/usr/bin/env bash
# cluster.sh - a Kubernetes cluster on this machine, for torbed's e2e tests: one node, and on
# request a second one that stands for a Raspberry Pi.
#
# Usage (as root):
#   hack/cluster/cluster.sh build               build/cache the binaries and images (hack/cluster/build.sh)
#   hack/cluster/cluster.sh up                  build if needed, start the cluster, wait until the node is
#                                       Ready and cluster DNS answers from a pod
#   hack/cluster/cluster.sh down [--purge]      stop everything `up` started and remove its leftovers
#                                       (--purge: also the certificates and the image store)
#   hack/cluster/cluster.sh status              what runs, API/node/DNS health, resident memory
#   hack/cluster/cluster.sh load-image IMG...   copy Docker images (or `docker save` tarballs) into the
#                                       cluster's containerd
#   hack/cluster/cluster.sh add-pi              add a second node, an emulated Raspberry Pi: arm64
#                                       images under qemu-user, labelled and tainted like a
#                                       Pi, its own namespace, containerd, kubelet, kube-proxy
#                                       and pod CIDR (hack/cluster/pi.sh); `down` removes it
#   hack/cluster/cluster.sh remove-pi           remove that node and everything it made
#   hack/cluster/cluster.sh load-image --node pi IMG...
#                                       the same into the Pi's containerd; an -arm64 tag is
#                                       also stored under its plain tag (the chart's)
#   hack/cluster/cluster.sh smoke               pod -> Service name -> ClusterIP -> pod check
#   hack/cluster/cluster.sh env                 print `export KUBECONFIG=...`
#
# The cluster is upstream Kubernetes built from source (kind, k3s and friends are not
# obtainable here): etcd, a containerd of its own with CRI, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy (iptables), bridge CNI and
# CoreDNS. Docker, if running, is left alone (its containerd has CRI off).
#
# Environment:
#   TORBED_CACHE          build cache (default ~/.cache/torbed; binaries under k8s/<version>)
#   TORBED_K8S_STATE      state: certs, kubeconfigs, etcd, kubelet, images, logs
#                         (default /var/lib/torbed-k8s)
#   TORBED_K8S_TIMEOUT    seconds each wait of `up` may take (default 180)
#   TORBED_K8S_NODE_IP    the node's IP (default: the source address of the default route)
#
# NetworkPolicy is NOT enforced: the bridge CNI plugin has no policy support.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/cluster/common.sh
. "$HERE/common.sh"

STATE=${TORBED_K8S_STATE:-/var/lib/torbed-k8s}
RUN=/run/torbed-k8s
TIMEOUT=${TORBED_K8S_TIMEOUT:-180}
PKI=$STATE/pki
CONF=$STATE/config
LOGS=$STATE/logs
PIDS=$RUN/pids
KUBECONFIG_PATH=$STATE/kubeconfig
CTRD_SOCK=$RUN/containerd/containerd.sock
CNI_NET=torbed-k8s

# Network layout (the usual kubeadm defaults, so charts and docs read familiar).
SERVICE_CIDR=10.96.0.0/12
API_SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
CLUSTER_CIDR=10.244.0.0/16
POD_CIDR=10.244.0.0/24        # the first /24 the controller-manager hands the only node
API_PORT=6443
# etcd on non-default ports: a Debian etcd service on 2379/2380 may exist on the machine.
ETCD_CLIENT=127.0.0.1:23790
ETCD_PEER=127.0.0.1:23800

# Start order; `down` stops in reverse, kubelet first.
COMPONENTS="etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy"
APT_PACKAGES="etcd-server containerd runc containernetworking-plugins iptables conntrack socat ebtables openssl curl"

LOG_TAG=cluster

KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH")
kc() { "${KUBECTL[@]}" "$@"; }
ctr_() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

# shellcheck source=hack/cluster/pi.sh
. "$HERE/pi.sh"

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it starts a kubelet, containerd and changes iptables)"; }

# One up/down at a time (a second `up` racing the first would start everything twice).
lock() {
  [ -z "${LOCKED:-}" ] || return 0   # `up` runs `down` while holding it
  LOCKED=1
  exec 8>/run/lock/torbed-k8s.lock
  flock -w 300 8 || die "another hack/cluster/cluster.sh up/down still runs after 300 s (/run/lock/torbed-k8s.lock)"
}

# ---------------------------------------------------------------- host preparation

install_packages() {
  local missing=() p
  for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return
  log "installing ${missing[*]} (apt)"
  # Debian's etcd-server and containerd packages would start system services; we run our own
  # instances, so keep the package scripts from starting theirs.
  local policy=/usr/sbin/policy-rc.d created=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; created=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    >"$STATE/apt.log" 2>&1 || { [ $created = 1 ] && rm -f $policy; die "apt-get install failed; see $STATE/apt.log"; }
  [ $created = 1 ] && rm -f $policy
  return 0
}

node_ip() {
  if [ -n "${TORBED_K8S_NODE_IP:-}" ]; then echo "$TORBED_K8S_NODE_IP"; return; fi
  local ip=""
  # The first global address of the default route's interface (not `ip route get X`: X may
  # happen to be local); any global address otherwise, but never a Docker or cluster bridge's.
  local dev
  dev=$(ip -4 route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
  [ -z "$dev" ] || ip=$(ip -4 -o addr show dev "$dev" scope global | awk '{ sub("/.*", "", $4); print $4; exit }')
  if [ -z "$ip" ]; then
    ip=$(ip -4 -o addr show scope global | awk '$2 !~ /^(docker|cni|br-|veth)/ { sub("/.*", "", $4); print $4; exit }')
  fi
  [ -n "$ip" ] || die "cannot find the host's primary IPv4 address; set TORBED_K8S_NODE_IP"
  echo "$ip"
}

node_name() {
  local n
  n=$(hostname -s 2>/dev/null | tr 'A-Z_' 'a-z-')
  [[ $n =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || n=torbed-node
  echo "$n"
}

sysctls() {
  # Pods route through the host, and pod -> Service -> pod on the same bridge only works when
  # bridged frames pass iptables (kube-proxy's DNAT and the reply's un-NAT).
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] \
    || die "net.bridge.bridge-nf-call-iptables is missing (br_netfilter not available)"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
    || die "cannot set net.ipv4.ip_forward / net.bridge.bridge-nf-call-iptables"
}

# The CNI firewall plugin inserts its FORWARD jump (accepting all pod traffic) at the top
# unless it already exists. Created here first and appended, it comes after kube-proxy's
# jumps (which kube-proxy prepends later), so a Service without ready endpoints is REJECTed
# by kube-proxy instead of being routed out of the host as ordinary traffic.
forward_chain() {
  iptables -w -N CNI-FORWARD 2>/dev/null || true
  iptables -w -C FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD 2>/dev/null \
    || iptables -w -A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD \
    || die "cannot add the CNI-FORWARD jump to the FORWARD chain (iptables)"
}

check_ports() {
  local p busy=()
  for p in ${ETCD_CLIENT##*:} ${ETCD_PEER##*:} $API_PORT 10250 10256 10257 10259; do
    ss -Hltn "sport = :$p" | grep . >/dev/null && busy+=("$p")
  done
  [ ${#busy[@]} = 0 ] || die "TCP port(s) ${busy[*]} already in use (another cluster or a stale process: ss -ltnp)"
}

# etcd preallocates a 64 MB write-ahead log and exits when it cannot; the image store and
# Docker's grow with every build. The image store is a cache of Docker's images (load-image
# refills it, and `up` re-imports the system images): when space is short, it goes first.
# Then refuse, naming what holds the space.
MIN_FREE_MB=${TORBED_K8S_MIN_FREE_MB:-2048}
free_mb() { echo $(($(df -Pk "$STATE" | awk 'NR==2 {print $4}') / 1024)); }
check_disk() {
  mkdir -p "$STATE"
  [ "$(free_mb)" -lt "$MIN_FREE_MB" ] || return 0
  if [ -d "$STATE/containerd/root" ]; then
    log "only $(free_mb) MB free on the file system of $STATE (need $MIN_FREE_MB): emptying the cluster's image store ($(du -sh "$STATE/containerd/root" 2>/dev/null | cut -f1)), a cache load-image refills"
    rm -rf "$STATE/containerd/root" "$STATE/loaded"
    [ "$(free_mb)" -lt "$MIN_FREE_MB" ] || return 0
  fi
  log "only $(free_mb) MB free on the file system of $STATE (need $MIN_FREE_MB); the largest users:"
  du -sh "${TORBED_CACHE:-$HOME/.cache/torbed}" \
    "$(timeout 5 docker info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)" 2>/dev/null | sed 's/^/  /' >&2 || true
  die "not enough disk space to start the cluster: free some (docker system prune; the caches under ${TORBED_CACHE:-$HOME/.cache/torbed})"
}

# ---------------------------------------------------------------- certificates, configs

# mkcert NAME SUBJECT [SANS]: a key and a certificate signed by the cluster CA (or by $CA).
# EC keys: fast to make, and every component accepts them.
mkcert() {
  local name=$1 subj=$2 sans=${3:-} ca=${CA:-ca}
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -z "$sans" ] || echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" 2>/dev/null \
    | openssl x509 -req -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial -days 3650 \
        -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null \
    || die "openssl failed to sign $name"
  rm -f "$PKI/$name.ext"
}

# kubeconfig FILE CERTNAME [SERVER]: a kubeconfig authenticating with PKI/CERTNAME.{crt,key}.
kubeconfig() {
  render kubeconfig.yaml SERVER="${3:-https://127.0.0.1:$API_PORT}" USER="$2" \
    CA_DATA="$(base64 -w0 "$PKI/ca.crt")" CERT_DATA="$(base64 -w0 "$PKI/$2.crt")" \
    KEY_DATA="$(base64 -w0 "$PKI/$2.key")" >"$1"
  chmod 600 "$1"
}

make_pki() {
  local node=$1 ip=$2 id="$1 $2"
  # Certificates name the node and its IP: remake them when either changed.
  if [ -f "$PKI/.identity" ] && [ "$(cat "$PKI/.identity")" = "$id" ] && [ -f "$PKI/sa.pub" ] \
    && [ -f "$PKI/front-proxy-client.crt" ]; then
    return
  fi
  log "generating certificates for node $node ($ip)"
  rm -rf "$PKI"
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=torbed-k8s-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/ca.crt" 2>/dev/null || die "openssl failed to make the cluster CA"
  mkcert apiserver "/CN=kube-apiserver" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$node,IP:$API_SERVICE_IP,IP:127.0.0.1,IP:$ip"
  mkcert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  mkcert admin "/O=system:masters/CN=torbed-admin"
  mkcert controller-manager "/CN=system:kube-controller-manager"
  mkcert scheduler "/CN=system:kube-scheduler"
  mkcert kube-proxy "/CN=system:kube-proxy"
  mkcert kubelet-client "/O=system:nodes/CN=system:node:$node"
  mkcert kubelet-serving "/O=system:nodes/CN=system:node:$node" "DNS:$node,DNS:localhost,IP:$ip,IP:127.0.0.1"
  # The request-header (front proxy) CA: the controller-manager and scheduler look it up to
  # authenticate requests, and it enables the aggregation layer (metrics APIs and the like).
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/front-proxy-ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/front-proxy-ca.key" -subj "/CN=torbed-k8s-front-proxy-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/front-proxy-ca.crt" 2>/dev/null || die "openssl failed to make the front-proxy CA"
  CA=front-proxy-ca mkcert front-proxy-client "/CN=front-proxy-client"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  mkdir -p "$STATE/kubeconfigs"
  kubeconfig "$KUBECONFIG_PATH" admin
  kubeconfig "$STATE/kubeconfigs/controller-manager" controller-manager
  kubeconfig "$STATE/kubeconfigs/scheduler" scheduler
  kubeconfig "$STATE/kubeconfigs/kube-proxy" kube-proxy
  kubeconfig "$STATE/kubeconfigs/kubelet" kubelet-client
  echo "$id" >"$PKI/.identity"
}

write_configs() {
  local node=$1 ip=$2
  mkdir -p "$CONF" "$STATE/cni/net.d" "$STATE/containerd/root"
  render containerd.toml STATE="$STATE" RUN="$RUN" CTRD_SOCK="$CTRD_SOCK" PAUSE_IMAGE="$PAUSE_IMAGE" \
    CONF="$CONF" >"$CONF/containerd.toml"
  local reg=${TORBED_REGISTRY_ADDR:-127.0.0.1:5000}
  mkdir -p "$CONF/certs.d/$reg"
  render registry-hosts.toml REGISTRY="$reg" >"$CONF/certs.d/$reg/hosts.toml"

  # bridge: pods on cni0 (masqueraded only toward addresses outside the cluster's pod
  # network: masquerade in hack/cluster/pi.sh). firewall: Docker sets the FORWARD policy to
  # DROP; this accepts pod traffic. portmap: hostPort support.
  cni_conflist "$STATE/cni/net.d" "$POD_CIDR" "$STATE/cni/ipam"

  # Pods with dnsPolicy Default (CoreDNS) get this: a nameserver nothing answers on, so a
  # stray lookup fails at once (the machine has no upstream DNS).
  echo "nameserver 127.0.0.1" >"$CONF/resolv.conf"

  render kubelet.yaml PKI="$PKI" CTRD_SOCK="$CTRD_SOCK" DNS_IP="$DNS_IP" CONF="$CONF" >"$CONF/kubelet.yaml"

  render kube-proxy.yaml STATE="$STATE" CLUSTER_CIDR="$CLUSTER_CIDR" NODE="$node" >"$CONF/kube-proxy.yaml"
}

# ---------------------------------------------------------------- processes

pid_of() {
  local f=$PIDS/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  # Guard against a recycled pid: it must still be the binary we started.
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -F -- "$(bin_of "$1")" >/dev/null || return 1
  echo "$pid"
}

bin_of() {
  case $1 in
    etcd) echo etcd ;;
    containerd) echo "containerd --config $CONF/containerd.toml" ;;
    containerd-pi) echo "containerd --config $CONF/containerd-pi.toml" ;;
    kubelet-pi) echo "$K8S_BIN/kubelet --config $CONF/kubelet-pi.yaml" ;;
    kube-proxy-pi) echo "$K8S_BIN/kube-proxy --config $CONF/kube-proxy-pi.yaml" ;;
    *) echo "$K8S_BIN/$1" ;;
  esac
}

# start NAME CMD...: run CMD detached, output to LOGS/NAME.log, pid to PIDS/NAME.pid.
start() {
  local name=$1
  shift
  mkdir -p "$LOGS" "$PIDS"
  echo "=== $(date -u +%FT%TZ) $*" >>"$LOGS/$name.log"
  # fd 8 is the up/down lock: the daemons must not inherit (and hold) it.
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 8>&- &
  local pid=$! i
  echo "$pid" >"$PIDS/$name.pid"
  # Until the forked shell has exec'd the daemon, /proc/PID/cmdline is still this script's, and
  # pid_of (which checks the command line against recycled pids) would call a healthy daemon
  # dead. On a cold machine the exec can take longer than the first health probe: wait for it.
  for ((i = 0; i < 100; i++)); do
    pid_of "$name" >/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 0  # exited at once: wait_for reports it with the log
    sleep 0.05
  done
  log "$name (pid $pid) has not exec'd $(bin_of "$name") after 5 s"
}

# stop NAME... : TERM them all (they take a second or two each to exit), then KILL what is
# still alive after STOP_WAIT seconds.
stop() {
  local name pid i alive pids=() names=()
  for name in "$@"; do
    if pid=$(pid_of "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      names+=("$name")
    fi
  done
  for ((i = 0; i < ${STOP_WAIT:-15} * 10; i++)); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 1 ] || break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for ${STOP_WAIT:-15}s; killing it"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
  done
  for name in "$@"; do rm -f "$PIDS/$name.pid"; done
}

# log_tail FILE: the last lines FILE got since its component was last started (the "=== " line
# start() writes), so a failed bring-up explains itself where only its output is kept (CI).
log_tail() {
  [ -f "$1" ] || return 0
  log "last lines of $1:"
  awk '/^=== /{n=0} {buf[n++]=$0} END{s=(n>20?n-20:0); for(i=s;i<n;i++) print "  | " buf[i]}' "$1" >&2
}

# wait_for WHAT LOG CMD...: poll CMD until it succeeds, at most TIMEOUT seconds; the component
# must also stay alive. LOG is what the error message points at.
wait_for() {
  local what=$1 logf=$2 component=$3 t0 deadline
  shift 3
  t0=$(now)
  deadline=$(($(date +%s) + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$component" ] && ! pid_of "$component" >/dev/null; then
      log_tail "$logf"
      die "$component exited while waiting for $what; see $logf"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || { log_tail "$logf"; die "timed out after ${TIMEOUT}s waiting for $what; see $logf"; }
    sleep 0.3
  done
  log "$what ($(elapsed "$t0") s)"
}

api_ready() { curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz" | grep ok >/dev/null; }
node_ready() { [ "$(kc get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
sa_ready() { kc -n default get serviceaccount default; }
coredns_ready() { [ "$(kc -n kube-system get deploy coredns -o 'jsonpath={.status.readyReplicas}' 2>/dev/null)" = 1 ]; }
pod_done() {
  local phase
  phase=$(kc -n "$1" get pod "$2" -o 'jsonpath={.status.phase}' 2>/dev/null) || return 1
  [ "$phase" = Failed ] && { DNS_CHECK_FAILED=1; return 0; }
  [ "$phase" = Succeeded ]
}

import_image() {
  ctr_ images import "$1" >>"$LOGS/images.log" 2>&1 \
    || die "importing $1 into the cluster's containerd failed; see $LOGS/images.log"
}

# ---------------------------------------------------------------- commands

cmd_build() { "$HERE/build.sh" all; }

cmd_up() {
  need_root
  lock
  local t0 node ip
  if all_running && api_ready; then
    log "already running"
    cmd_env
    return
  fi
  mkdir -p "$STATE" "$LOGS"
  install_packages
  "$HERE/build.sh" all
  t0=$(now)  # bring-up time excludes the (cached) build
  # Anything half-started or left by a killed run goes first.
  cmd_down --quiet
  # On failure the processes stay up for inspection; say how to get rid of them.
  trap 'up_failed $?' EXIT
  node=$(node_name)
  ip=$(node_ip)
  log "bringing up node $node ($ip); state in $STATE, logs in $LOGS"
  sysctls
  forward_chain
  masquerade ""
  check_ports
  check_disk
  make_pki "$node" "$ip"
  write_configs "$node" "$ip"
  mkdir -p "$RUN/containerd" "$STATE/etcd"

  start etcd etcd --name torbed-k8s --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
    --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
    --initial-cluster "torbed-k8s=http://$ETCD_PEER" --listen-metrics-urls "" \
    --snapshot-count 10000 --logger zap --log-outputs stderr
  start containerd containerd --config "$CONF/containerd.toml"

  wait_for "etcd healthy" "$LOGS/etcd.log" etcd curl -fsS --max-time 2 "http://$ETCD_CLIENT/health"
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://$ETCD_CLIENT" \
    --advertise-address "$ip" --secure-port "$API_PORT" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --authorization-mode Node,RBAC \
    --allow-privileged=true \
    --profiling=false
  wait_for "containerd serving" "$LOGS/containerd.log" containerd ctr_ version
  import_image "$PAUSE_DIR/pause.tar"
  import_image "$COREDNS_DIR/coredns.tar"
  import_image "$TOOLBOX_DIR/toolbox.tar"
  wait_for "kube-apiserver ready" "$LOGS/kube-apiserver.log" kube-apiserver api_ready

  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$STATE/kubeconfigs/controller-manager" \
    --authentication-kubeconfig "$STATE/kubeconfigs/controller-manager" \
    --authorization-kubeconfig "$STATE/kubeconfigs/controller-manager" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --use-service-account-credentials=true \
    --allocate-node-cidrs=true --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 24 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --profiling=false
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig "$STATE/kubeconfigs/scheduler" \
    --authentication-kubeconfig "$STATE/kubeconfigs/scheduler" \
    --authorization-kubeconfig "$STATE/kubeconfigs/scheduler" \
    --bind-address 127.0.0.1 --leader-elect=false --profiling=false
  start kubelet "$K8S_BIN/kubelet" \
    --config "$CONF/kubelet.yaml" \
    --kubeconfig "$STATE/kubeconfigs/kubelet" \
    --root-dir "$STATE/kubelet" \
    --hostname-override "$node" \
    --node-ip "$ip"
  start kube-proxy "$K8S_BIN/kube-proxy" --config "$CONF/kube-proxy.yaml"

  wait_for "node $node Ready" "$LOGS/kubelet.log" kubelet node_ready "$node"
  wait_for "default service account" "$LOGS/kube-controller-manager.log" kube-controller-manager sa_ready
  render coredns.yaml COREDNS_IMAGE="$COREDNS_IMAGE" DNS_IP="$DNS_IP" \
    | kc apply -f - >>"$LOGS/kubectl.log" 2>&1 || die "deploying CoreDNS failed; see $LOGS/kubectl.log"
  wait_for "CoreDNS ready" "$LOGS/kubelet.log" kubelet coredns_ready
  dns_check
  storage "$node"
  trap - EXIT
  log "cluster up in $(elapsed "$t0") s"
  cmd_env
}

# A default StorageClass with a few pre-made local volumes, so a chart's claim (the nightly
# history) binds as on a real cluster; no dynamic provisioner exists here. The volumes are
# directories under $STATE/volumes owned by the pods' user (uid 10000): local volumes get no
# fsGroup ownership change. Emptied at every `down`, like the rest of the cluster's state.
STORAGE_CLASS=torbed-local
VOLUMES=4
storage() {
  local node=$1 i dir manifest
  manifest="apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $STORAGE_CLASS
  annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain"
  for ((i = 0; i < VOLUMES; i++)); do
    dir=$STATE/volumes/pv$i
    mkdir -p "$dir"
    chown 10000:10000 "$dir"
    chmod 0770 "$dir"
    manifest+="
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: $STORAGE_CLASS-pv$i, labels: {torbed.io/volume: local}}
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: $STORAGE_CLASS
  local: {path: $dir}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$node]}]"
  done
  printf '%s\n' "$manifest" | kc apply -f - >>"$LOGS/kubectl.log" 2>&1 \
    || die "creating the storage class and volumes failed; see $LOGS/kubectl.log"
  log "storage class $STORAGE_CLASS (default) with $VOLUMES local volumes in $STATE/volumes"
}

up_failed() {
  [ "$1" = 0 ] || log "bring-up failed: components may still run (hack/cluster/cluster.sh status); logs in $LOGS; hack/cluster/cluster.sh down removes it all"
}

# A pod resolves the API server's Service by its short name (the pod's search list) through
# CoreDNS: proves pod networking, the DNS Service (kube-proxy) and CoreDNS at once. netcheck
# retries for up to 30 s (kube-proxy may still be programming the Service) and reports
# through its exit status.
# dns_check [POD KUBELET PLACEMENT WHERE]: on the main node by default; PLACEMENT is the pod
# spec's nodeSelector/tolerations lines, WHERE how messages name the node.
dns_check() {
  local pod=${1:-torbed-dns-check} kubelet=${2:-kubelet} placement=${3:-} where=${4:-}
  kc -n kube-system delete pod "$pod" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  render dns-check.yaml POD="$pod" PLACEMENT="$placement" TOOLBOX_IMAGE="$TOOLBOX_IMAGE" \
    | kc apply -f - >>"$LOGS/kubectl.log" 2>&1 || die "creating the DNS check pod $pod failed; see $LOGS/kubectl.log"
  DNS_CHECK_FAILED=0
  wait_for "DNS check pod${where:+ $where} finished" "$LOGS/$kubelet.log" "$kubelet" pod_done kube-system "$pod"
  if [ "$DNS_CHECK_FAILED" = 1 ]; then
    kc -n kube-system logs "$pod" >"$LOGS/$pod.log" 2>&1 || true
    die "a pod${where:+ $where} could not resolve kubernetes.default; see $LOGS/$pod.log and $LOGS/kube-proxy.log"
  fi
  log "cluster DNS answers pods${where:+ $where}: $(kc -n kube-system logs "$pod" 2>/dev/null | tr '\n' ' ')"
  kc -n kube-system delete pod "$pod" --wait=false >/dev/null 2>&1 || true
}

all_running() {
  local c
  for c in $COMPONENTS; do pid_of "$c" >/dev/null || return 1; done
}

# Processes of our containerd's shims and of the pods (cgroups under kubepods/).
pod_pids() {
  local f
  for f in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/memory/kubepods; do
    [ -d "$f" ] && { find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null; break; }
  done
  grep -l -s -F -- "$CTRD_SOCK" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 || true
}

# Delete the pods through the API while the kubelet still runs, so it tears each sandbox down
# through CRI and CNI (veths, IPs, portmap rules). The controller-manager and scheduler go
# first so nothing is recreated.
drain_pods() {
  api_ready 2>/dev/null && pid_of kubelet >/dev/null || return 0
  stop kube-controller-manager kube-scheduler
  kc delete pods --all --all-namespaces --grace-period=1 --wait=false >>"$LOGS/kubectl.log" 2>&1 || return 0
  local deadline=$(($(date +%s) + 60))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ -z "$(kc get pods -A --no-headers 2>/dev/null)" ] && [ -z "$(ctr_ tasks ls -q 2>/dev/null)" ] && return 0
    sleep 0.5
  done
  log "pods did not all terminate within 60 s; removing their containers directly"
}

# Containers the kubelet did not remove: kill and delete them through containerd.
remove_containers() {
  pid_of containerd >/dev/null || return 0
  local id
  for id in $(ctr_ tasks ls -q 2>/dev/null); do
    ctr_ tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr_ tasks ls -q 2>/dev/null); do
    ctr_ tasks delete --force "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr_ containers ls -q 2>/dev/null); do
    ctr_ containers delete "$id" >/dev/null 2>&1 || true
  done
}

unmount_under() {
  local prefix m
  for prefix in "$@"; do
    # Deepest first.
    for m in $(findmnt -rn -o TARGET | grep -E "^$prefix(/|\$)" | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2-); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
    done
  done
}

# Rules and chains of kube-proxy, the kubelet and the CNI plugins (KUBE-*, CNI-*); Docker's
# (DOCKER*) and everybody else's stay.
clean_iptables() {
  local ipt table rules line chain
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || continue
    for table in filter nat mangle raw; do
      rules=$($ipt -w -t $table -S 2>/dev/null) || continue
      # Jumps into our chains from chains that are not ours (built-ins, Docker's).
      while IFS= read -r line; do
        [ -n "$line" ] || continue
        eval "$ipt -w -t $table -D ${line#-A }" 2>/dev/null || true
      done < <(grep -E -- '^-A ' <<<"$rules" | grep -vE -- '^-A (KUBE|CNI)-' | grep -E -- '-j (KUBE|CNI)-' || true)
      for chain in $(grep -oE -- '^-N (KUBE|CNI)-[^ ]+' <<<"$rules" | cut -d' ' -f2); do
        $ipt -w -t $table -F "$chain" 2>/dev/null || true
      done
      for chain in $(grep -oE -- '^-N (KUBE|CNI)-[^ ]+' <<<"$rules" | cut -d' ' -f2); do
        $ipt -w -t $table -X "$chain" 2>/dev/null || true
      done
    done
  done
}

clean_network() {
  local l ns
  for l in $(ip -o link show master cni0 2>/dev/null | awk -F': ' '{ sub("@.*", "", $2); print $2 }'); do
    ip link del "$l" 2>/dev/null || true
  done
  ip link del cni0 2>/dev/null || true
  # Sandbox network namespaces containerd's CRI left (named cni-<uuid> by containerd).
  for ns in /var/run/netns/cni-*; do
    [ -e "$ns" ] || continue
    ip netns del "${ns##*/}" 2>/dev/null || { umount "$ns" 2>/dev/null; rm -f "$ns"; } || true
  done
  rm -f /var/lib/cni/results/"$CNI_NET"-* 2>/dev/null || true
  # Not `kube-proxy --cleanup`: it also resets IPVS and nftables state that may not be ours.
  clean_iptables
}

# kubelet's cgroups (cgroupfs driver: kubepods/... in each v1 hierarchy).
clean_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/kubepods; do
    [ -d "$h" ] || continue
    find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

cmd_down() {
  need_root
  lock
  local quiet=0 purge=0 a c pids p t0
  t0=$(now)
  for a in "$@"; do
    case $a in
      --quiet) quiet=1 ;;
      --purge) purge=1 ;;
      *) die "down: unknown option $a" ;;
    esac
  done
  mkdir -p "$LOGS"
  [ $quiet = 1 ] || log "stopping the cluster"
  ! pi_present || remove_pi
  drain_pods
  stop kubelet
  stop kube-proxy kube-scheduler kube-controller-manager kube-apiserver
  remove_containers
  STOP_WAIT=20 stop containerd
  # Anything still alive in the pods' cgroups or attached to our containerd (shims).
  pids=$(pod_pids | sort -u)
  if [ -n "$pids" ]; then
    for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.5
  fi
  stop etcd
  unmount_under "$STATE/kubelet" "$RUN" "$STATE/containerd"
  clean_network
  clean_cgroups
  if findmnt -rn -o TARGET | grep -E "^($STATE|$RUN)(/|\$)" >/dev/null; then
    die "mounts under $STATE or $RUN remain (findmnt); not deleting state"
  fi
  # Each `up` starts from an empty cluster; the certificates and the image store are kept.
  rm -rf "$RUN" "$STATE/etcd" "$STATE/kubelet" "$STATE/cni/ipam" "$STATE/volumes"
  if [ $purge = 1 ]; then
    rm -rf "$STATE"
    [ $quiet = 1 ] || log "purged $STATE"
  fi
  [ $quiet = 1 ] || log "stopped in $(elapsed "$t0") s"
}

rss_mb() {
  local total=0 p kb
  for p in "$@"; do
    kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
    total=$((total + ${kb:-0}))
  done
  echo $((total / 1024))
}

cmd_status() {
  local c pid ok=1 cp_pids=() node
  for c in $COMPONENTS; do
    if pid=$(pid_of "$c"); then
      printf '%-24s running (pid %s, %s MB)\n' "$c" "$pid" "$(rss_mb "$pid")"
      cp_pids+=("$pid")
    else
      printf '%-24s stopped\n' "$c"
      ok=0
    fi
  done
  if [ $ok = 1 ]; then
    node=$(node_name)
    local extra
    extra=$(pod_pids | sort -u)
    # shellcheck disable=SC2086
    printf '%-24s %s MB (components) + %s MB (shims and pods)\n' "resident memory" \
      "$(rss_mb "${cp_pids[@]}")" "$(rss_mb $extra)"
    if api_ready; then echo "api server               ready"; else echo "api server               NOT ready"; ok=0; fi
    if node_ready "$node"; then printf '%-24s Ready\n' "node $node"; else printf '%-24s NOT Ready\n' "node $node"; ok=0; fi
    if coredns_ready; then echo "coredns                  ready"; else echo "coredns                  NOT ready"; ok=0; fi
    if pi_present; then
      for c in $PI_COMPONENTS; do
        if pid=$(pid_of "$c"); then printf '%-24s running (pid %s, %s MB)\n' "$c" "$pid" "$(rss_mb "$pid")"
        else printf '%-24s stopped\n' "$c"; ok=0; fi
      done
      if node_ready "$PI_NODE"; then printf '%-24s Ready\n' "node $PI_NODE"; else printf '%-24s NOT Ready\n' "node $PI_NODE"; ok=0; fi
    fi
    echo "export KUBECONFIG=$KUBECONFIG_PATH"
  fi
  [ $ok = 1 ]
}

cmd_env() { echo "export KUBECONFIG=$KUBECONFIG_PATH"; }

cmd_load_image() {
  need_root
  if [ "${1:-}" = --node ]; then
    [ "${2:-}" = pi ] || die "load-image: --node takes 'pi' (the node of hack/cluster/cluster.sh add-pi)"
    shift 2
    [ $# -gt 0 ] || die "load-image: name at least one image"
    load_image_pi "$@"
    return
  fi
  [ $# -gt 0 ] || die "load-image: name at least one image (or docker-save tarball)"
  pid_of containerd >/dev/null || die "the cluster is not running (hack/cluster/cluster.sh up)"
  local refs=() a t0
  t0=$(now)
  for a in "$@"; do
    if [ -f "$a" ]; then
      import_image "$a"
      log "imported $a"
    else
      refs+=("$a")
    fi
  done
  if [ ${#refs[@]} -gt 0 ]; then
    command -v docker >/dev/null || die "load-image: docker is not installed (hack/images/docker.sh)"
    timeout 15 docker info >/dev/null 2>&1 || die "load-image: the Docker daemon is not reachable (hack/images/docker.sh)"
    local todo=() skipped=() id have
    have=$(ctr_ images ls -q 2>/dev/null)
    mkdir -p "$STATE/loaded"
    for a in "${refs[@]}"; do
      id=$(docker image inspect --format '{{.Id}}' "$a" 2>/dev/null) || die "load-image: Docker has no image $a"
      # The image store survives `down`: an image already imported with this content is skipped
      # (docker save | import of a dozen images takes minutes).
      if [ "$(cat "$STATE/loaded/${a//[\/:]/_}" 2>/dev/null)" = "$id" ] \
         && grep -qxF "docker.io/$a" <<<"$have"; then
        skipped+=("$a")
      else
        todo+=("$a")
      fi
    done
    if [ ${#todo[@]} -gt 0 ]; then
      docker save "${todo[@]}" | ctr_ images import - >>"$LOGS/images.log" 2>&1 \
        || die "load-image: docker save | ctr images import failed; see $LOGS/images.log"
      for a in "${todo[@]}"; do
        docker image inspect --format '{{.Id}}' "$a" > "$STATE/loaded/${a//[\/:]/_}"
      done
    fi
    log "imported ${todo[*]:-nothing}${skipped:+ (already there, same content: ${skipped[*]})} ($(elapsed "$t0") s)"
    drop_superseded "${refs[@]}"
  fi
}

# drop_superseded REF...: the store survives `down`, and every build with other content brings
# a new content tag (torbed/relay:vanilla-0.1.0-0123456789ab[-arm64]); remove the other digests
# of each content tag just loaded, so the store holds one build of each image, not every one
# since the cluster was made. containerd's garbage collector then frees their layers.
drop_superseded() {
  local a base suffix name old=()
  local have
  have=$(ctr_ images ls -q 2>/dev/null) || return 0
  for a in "$@"; do
    [[ $a =~ ^(.+)-[0-9a-f]{12}(-arm64|-amd64)?$ ]] || continue
    base=${BASH_REMATCH[1]}
    suffix=${BASH_REMATCH[2]}
    while read -r name; do
      [ -n "$name" ] && [ "$name" != "docker.io/$a" ] || continue
      [[ $name =~ ^docker\.io/(.+)-[0-9a-f]{12}(-arm64|-amd64)?$ ]] || continue
      [ "${BASH_REMATCH[1]}" = "$base" ] && [ "${BASH_REMATCH[2]}" = "$suffix" ] && old+=("$name")
    done <<<"$have"
  done
  [ ${#old[@]} -gt 0 ] || return 0
  ctr_ images rm "${old[@]}" >>"$LOGS/images.log" 2>&1 || true
  for name in "${old[@]}"; do
    name=${name#docker.io/}
    rm -f "$STATE/loaded/${name//[\/:]/_}"
  done
  log "removed ${#old[@]} superseded build(s) from the image store: ${old[*]#docker.io/}"
}

cmd_smoke() { "$HERE/smoke.sh"; }

# In a function so bash has read the whole file before anything runs (safe to edit meanwhile).
main() {
  case "${1:-}" in
    build) cmd_build ;;
    up) cmd_up ;;
    down) shift; cmd_down "$@" ;;
    status) cmd_status ;;
    load-image) shift; cmd_load_image "$@" ;;
    add-pi) cmd_add_pi ;;
    remove-pi) cmd_remove_pi ;;
    smoke) cmd_smoke ;;
    env) cmd_env ;;
    -h | --help | help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" ;;
    *) echo "usage: $0 build|up|down [--purge]|status|load-image [--node pi] IMAGE...|add-pi|remove-pi|smoke|env" >&2; exit 2 ;;
  esac
}

main "$@"
