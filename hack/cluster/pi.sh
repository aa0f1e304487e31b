# shellcheck shell=bash disable=SC2034
# The emulated Raspberry Pi: a second node of the local cluster (sourced by hack/cluster/cluster.sh,
# which provides start/stop/pid_of/mkcert/wait_for and the settings).
#
# A node of its own, as a Pi joined with `kubeadm join` or a k3s agent would be:
#   - its own network namespace ($PI_NETNS), joined to the host by a veth pair
#     ($PI_HOST_IF $PI_HOST_IP <-> $PI_IF $PI_IP): the node's InternalIP, what the API server
#     and the other node reach it by;
#   - its own containerd (root, state, socket, CNI config under $STATE/pi), kubelet
#     (root dir, pod logs, cgroup root /$PI_NODE: its pods' cgroups are apart from the main
#     node's) and kube-proxy (iptables in its namespace), all started in the namespace;
#   - the pod CIDR the controller-manager assigns it (the next /24 of 10.244.0.0/16), on a
#     bridge in its namespace, with routes between the nodes' pod CIDRs: pod-to-pod traffic
#     between nodes is routed, never NATed (the shapers and the isolation see pod addresses);
#   - labelled and tainted like a Pi (docs/raspberry-pi.md): torbed.io/hardware=rpi, taint
#     torbed.io/hardware=rpi:NoSchedule (its kubernetes.io/arch stays the kubelet's amd64).
# Its arm64 images (`load-image --node pi`, the -arm64 tags of `make images-arm64` under
# their plain tags) run under qemu-user through binfmt_misc: an emulator's timings, not a Pi's.
# Its pause and toolbox images are the host's static amd64 ones.

PI_NODE=torbed-pi
PI_NETNS=torbed-pi
PI_HOST_IF=tbpi-host
PI_IF=tbpi0
PI_HOST_IP=10.243.255.1
PI_IP=10.243.255.2
PI_STATE=$STATE/pi
PI_RUN=$RUN/pi
PI_CTRD_SOCK=$PI_RUN/containerd/containerd.sock
PI_CGROUP=$PI_NODE
PI_COMPONENTS="containerd-pi kubelet-pi kube-proxy-pi"
# Not kubernetes.io/arch: the kubelet (an amd64 binary) sets that to its own architecture and
# puts it back within seconds when anything else is written. Select the Pi by this label.
PI_LABELS="torbed.io/hardware=rpi"
PI_TAINT_KEY=torbed.io/hardware
PI_TAINT_VALUE=rpi
# The host's FORWARD and nat rules for traffic between the nodes (cleaned as CNI-* chains).
NODES_CHAIN=CNI-TORBED-NODES
MASQ_CHAIN=CNI-TORBED-MASQ

ctr_pi() { ctr --address "$PI_CTRD_SOCK" --namespace k8s.io "$@"; }
in_pi() { nsenter --net="/run/netns/$PI_NETNS" "$@"; }

pi_present() { [ -e "/run/netns/$PI_NETNS" ] || [ -f "$PIDS/kubelet-pi.pid" ] || ip link show "$PI_HOST_IF" >/dev/null 2>&1; }

# Pod traffic leaves a node NATed only toward addresses outside the cluster's pod network,
# the bridge plugin's own ipMasq (which NATs everything outside the node's /24) being off.
# NS: "" for the host, else the namespace to run iptables in.
masquerade() {
  local ns=$1 ipt=(iptables -w -t nat)
  [ -z "$ns" ] || ipt=(nsenter --net="/run/netns/$ns" iptables -w -t nat)
  "${ipt[@]}" -N "$MASQ_CHAIN" 2>/dev/null || true
  "${ipt[@]}" -F "$MASQ_CHAIN"
  "${ipt[@]}" -A "$MASQ_CHAIN" -d "$CLUSTER_CIDR" -j RETURN
  "${ipt[@]}" -A "$MASQ_CHAIN" -d 224.0.0.0/4 -j RETURN
  "${ipt[@]}" -A "$MASQ_CHAIN" -j MASQUERADE
  "${ipt[@]}" -C POSTROUTING -s "$CLUSTER_CIDR" -j "$MASQ_CHAIN" 2>/dev/null \
    || "${ipt[@]}" -A POSTROUTING -s "$CLUSTER_CIDR" -j "$MASQ_CHAIN" \
    || die "cannot add the pod masquerade rule (iptables${ns:+ in $ns})"
}

# The bridge network of a node's pods: CNI_DIR/10-torbed.conflist for SUBNET.
cni_conflist() {
  local dir=$1 subnet=$2 ipam=$3
  mkdir -p "$dir"
  render cni.conflist CNI_NET="$CNI_NET" SUBNET="$subnet" IPAM_DIR="$ipam" >"$dir/10-torbed.conflist.tmp"
  mv "$dir/10-torbed.conflist.tmp" "$dir/10-torbed.conflist"
}

pi_configs() {
  local ip=$1
  mkdir -p "$PI_STATE/containerd/root" "$PI_STATE/cni/net.d" "$PI_STATE/pod-logs" "$PI_RUN/containerd" "$STATE/kubeconfigs"
  # The main containerd's configuration with the Pi's root, state, socket and CNI directories.
  sed -e "s#$STATE/containerd/#$PI_STATE/containerd/#g" -e "s#$RUN/containerd/#$PI_RUN/containerd/#g" \
    -e "s#$STATE/cni/net.d#$PI_STATE/cni/net.d#" "$CONF/containerd.toml" >"$CONF/containerd-pi.toml"
  grep -F "$PI_CTRD_SOCK" "$CONF/containerd-pi.toml" >/dev/null || die "could not derive $CONF/containerd-pi.toml"
  sed -e "s#$PKI/kubelet-serving#$PKI/kubelet-serving-pi#" -e "s#unix://$CTRD_SOCK#unix://$PI_CTRD_SOCK#" \
    "$CONF/kubelet.yaml" >"$CONF/kubelet-pi.yaml"
  render kubelet-pi.yaml PI_CGROUP="$PI_CGROUP" PI_STATE="$PI_STATE" PI_TAINT_KEY="$PI_TAINT_KEY" \
    PI_TAINT_VALUE="$PI_TAINT_VALUE" >>"$CONF/kubelet-pi.yaml"
  sed -e "s#hostnameOverride: .*#hostnameOverride: \"$PI_NODE\"#" \
    -e "s#$STATE/kubeconfigs/kube-proxy#$STATE/kubeconfigs/kube-proxy-pi#" \
    "$CONF/kube-proxy.yaml" >"$CONF/kube-proxy-pi.yaml"
  # The Pi reaches the API server at the host's address (its 127.0.0.1 is its own).
  kubeconfig "$STATE/kubeconfigs/kubelet-pi" kubelet-client-pi "https://$ip:$API_PORT"
  kubeconfig "$STATE/kubeconfigs/kube-proxy-pi" kube-proxy "https://$ip:$API_PORT"
}

pi_pki() {
  [ -f "$PKI/kubelet-serving-pi.crt" ] && [ -f "$PKI/kubelet-client-pi.crt" ] && return 0
  mkcert kubelet-client-pi "/O=system:nodes/CN=system:node:$PI_NODE"
  mkcert kubelet-serving-pi "/O=system:nodes/CN=system:node:$PI_NODE" "DNS:$PI_NODE,IP:$PI_IP"
}

pi_network() {
  ip netns add "$PI_NETNS" 2>/dev/null || die "network namespace $PI_NETNS exists (hack/cluster/cluster.sh remove-pi)"
  ip link add "$PI_HOST_IF" type veth peer name "$PI_IF" netns "$PI_NETNS" \
    || die "cannot create the veth pair $PI_HOST_IF/$PI_IF"
  ip addr add "$PI_HOST_IP/30" dev "$PI_HOST_IF"
  ip link set "$PI_HOST_IF" up
  in_pi ip link set lo up
  in_pi ip addr add "$PI_IP/30" dev "$PI_IF"
  in_pi ip link set "$PI_IF" up
  in_pi ip route add default via "$PI_HOST_IP"
  in_pi sysctl -qw net.ipv4.ip_forward=1
  in_pi sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null \
    || die "cannot set net.bridge.bridge-nf-call-iptables in $PI_NETNS (kernel without per-namespace br_netfilter)"
  # Docker's FORWARD policy is DROP: accept what crosses between the nodes.
  iptables -w -N "$NODES_CHAIN" 2>/dev/null || true
  iptables -w -F "$NODES_CHAIN"
  iptables -w -A "$NODES_CHAIN" -i "$PI_HOST_IF" -j ACCEPT
  iptables -w -A "$NODES_CHAIN" -o "$PI_HOST_IF" -j ACCEPT
  iptables -w -C FORWARD -j "$NODES_CHAIN" 2>/dev/null || iptables -w -I FORWARD -j "$NODES_CHAIN"
  masquerade "$PI_NETNS"
}

# The kubelet's cgroup root must exist in every v1 hierarchy (cpuset: with the parent's cpus
# and mems, or nothing could run in it).
pi_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -e "$h/cgroup.procs" ] || continue
    mkdir -p "$h$PI_CGROUP"
    if [ -e "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h$PI_CGROUP/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h$PI_CGROUP/cpuset.mems"
    fi
  done
}

pi_node_cidr() { kc get node "$PI_NODE" -o 'jsonpath={.spec.podCIDR}' 2>/dev/null | grep . ; }
pi_containerd_serving() { ctr_pi version; }

binfmt_arm64() {
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && return 0
  if ! command -v update-binfmts >/dev/null || [ ! -e /usr/bin/qemu-aarch64-static ]; then
    log "installing qemu-user-static binfmt-support (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends qemu-user-static binfmt-support \
      >>"$STATE/apt.log" 2>&1 || die "apt-get install qemu-user-static binfmt-support failed; see $STATE/apt.log"
  fi
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || die "binfmt_misc has no qemu-aarch64 entry: arm64 binaries cannot run"
}

cmd_add_pi() {
  need_root
  lock
  all_running && api_ready || die "the cluster is not running (hack/cluster/cluster.sh up first)"
  if pi_present; then
    if all_pi_running && node_ready "$PI_NODE"; then
      log "node $PI_NODE already runs"
      return
    fi
    remove_pi
  fi
  local t0 ip cidr
  t0=$(now)
  ip=$(node_ip)
  trap 'up_failed $?' EXIT
  binfmt_arm64
  log "adding node $PI_NODE ($PI_IP, namespace $PI_NETNS), tainted $PI_TAINT_KEY=$PI_TAINT_VALUE:NoSchedule"
  pi_pki
  pi_configs "$ip"
  pi_network
  pi_cgroups
  start containerd-pi nsenter --net="/run/netns/$PI_NETNS" containerd --config "$CONF/containerd-pi.toml"
  wait_for "containerd of $PI_NODE serving" "$LOGS/containerd-pi.log" containerd-pi pi_containerd_serving
  ctr_pi images import "$PAUSE_DIR/pause.tar" >>"$LOGS/images.log" 2>&1 || die "importing the pause image into $PI_NODE failed"
  ctr_pi images import "$TOOLBOX_DIR/toolbox.tar" >>"$LOGS/images.log" 2>&1 || die "importing the toolbox image into $PI_NODE failed"
  start kubelet-pi nsenter --net="/run/netns/$PI_NETNS" "$K8S_BIN/kubelet" \
    --config "$CONF/kubelet-pi.yaml" \
    --kubeconfig "$STATE/kubeconfigs/kubelet-pi" \
    --root-dir "$PI_STATE/kubelet" \
    --hostname-override "$PI_NODE" \
    --node-ip "$PI_IP" \
    --node-labels "$PI_LABELS"
  start kube-proxy-pi nsenter --net="/run/netns/$PI_NETNS" "$K8S_BIN/kube-proxy" --config "$CONF/kube-proxy-pi.yaml"
  wait_for "node $PI_NODE registered with a pod CIDR" "$LOGS/kubelet-pi.log" kubelet-pi pi_node_cidr
  cidr=$(pi_node_cidr)
  # The main node's pods reach the Pi's through it, and its own through cni0.
  ip route replace "$cidr" via "$PI_IP" dev "$PI_HOST_IF"
  cni_conflist "$PI_STATE/cni/net.d" "$cidr" "$PI_STATE/cni/ipam"
  wait_for "node $PI_NODE Ready" "$LOGS/kubelet-pi.log" kubelet-pi node_ready "$PI_NODE"
  pi_check
  trap - EXIT
  log "node $PI_NODE (pod CIDR $cidr) added in $(elapsed "$t0") s"
}

all_pi_running() {
  local c
  for c in $PI_COMPONENTS; do pid_of "$c" >/dev/null || return 1; done
}

# A pod on the Pi resolves a Service by name (CoreDNS runs on the main node: pod-to-pod
# routing across the nodes and the Pi's kube-proxy).
pi_check() {
  dns_check torbed-pi-check kubelet-pi "  nodeSelector: {kubernetes.io/hostname: $PI_NODE}
  tolerations: [{key: $PI_TAINT_KEY, operator: Equal, value: $PI_TAINT_VALUE, effect: NoSchedule}]" "on $PI_NODE"
}

# Everything add-pi made, in reverse; safe to run when only part of it exists.
remove_pi() {
  local pids p h
  if pid_of kubelet-pi >/dev/null && api_ready 2>/dev/null; then
    kc delete pods --all-namespaces --field-selector "spec.nodeName=$PI_NODE" --grace-period=1 --wait=false \
      >>"$LOGS/kubectl.log" 2>&1 || true
    local deadline=$(($(date +%s) + 30))
    while [ "$(date +%s)" -lt "$deadline" ]; do
      [ -z "$(kc get pods -A --field-selector "spec.nodeName=$PI_NODE" --no-headers 2>/dev/null)" ] \
        && [ -z "$(ctr_pi tasks ls -q 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop kubelet-pi kube-proxy-pi
  if pid_of containerd-pi >/dev/null; then
    for p in $(ctr_pi tasks ls -q 2>/dev/null); do ctr_pi tasks kill --signal SIGKILL "$p" >/dev/null 2>&1 || true; done
    for p in $(ctr_pi tasks ls -q 2>/dev/null); do ctr_pi tasks delete --force "$p" >/dev/null 2>&1 || true; done
    for p in $(ctr_pi containers ls -q 2>/dev/null); do ctr_pi containers delete "$p" >/dev/null 2>&1 || true; done
  fi
  STOP_WAIT=20 stop containerd-pi
  pids=$(pi_pod_pids | sort -u)
  if [ -n "$pids" ]; then
    for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.5
  fi
  unmount_under "$PI_STATE/kubelet" "$PI_RUN" "$PI_STATE/containerd"
  ip route show | awk -v dev="$PI_HOST_IF" '$0 ~ " dev " dev " " { print $1 }' | while read -r p; do
    ip route del "$p" 2>/dev/null || true
  done
  ip netns del "$PI_NETNS" 2>/dev/null || true   # its veth end, bridge and iptables go with it
  ip link del "$PI_HOST_IF" 2>/dev/null || true
  iptables -w -D FORWARD -j "$NODES_CHAIN" 2>/dev/null || true
  iptables -w -F "$NODES_CHAIN" 2>/dev/null || true
  iptables -w -X "$NODES_CHAIN" 2>/dev/null || true
  for h in /sys/fs/cgroup/*/"$PI_CGROUP"; do
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  if api_ready 2>/dev/null; then kc delete node "$PI_NODE" --ignore-not-found >>"$LOGS/kubectl.log" 2>&1 || true; fi
  if findmnt -rn -o TARGET | grep -E "^($PI_STATE|$PI_RUN)(/|\$)" >/dev/null; then
    die "mounts under $PI_STATE or $PI_RUN remain (findmnt); not deleting the Pi's state"
  fi
  rm -rf "$PI_RUN" "$PI_STATE/kubelet" "$PI_STATE/cni" "$PI_STATE/pod-logs"
  return 0
}

# Processes in the Pi's pods' cgroups and attached to its containerd (shims).
pi_pod_pids() {
  local f
  for f in /sys/fs/cgroup/pids/$PI_CGROUP /sys/fs/cgroup/memory/$PI_CGROUP; do
    [ -d "$f" ] && { find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null; break; }
  done
  grep -l -s -F -- "$PI_CTRD_SOCK" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 || true
}

cmd_remove_pi() {
  need_root
  lock
  local t0
  t0=$(now)
  pi_present || { log "no node $PI_NODE"; return 0; }
  remove_pi
  log "node $PI_NODE removed in $(elapsed "$t0") s"
}

# load-image --node pi: an image for the Pi's containerd. An -arm64 tag (make images-arm64) is
# stored under its plain tag too, the one the chart names: the Pi then runs the arm64 build
# of the same image a main-node pod runs in amd64 (a registry's manifest list does this for a
# real Pi; this containerd would pick the host's architecture from it).
load_image_pi() {
  local a plain t0
  t0=$(now)
  pid_of containerd-pi >/dev/null || die "node $PI_NODE is not running (hack/cluster/cluster.sh add-pi)"
  command -v docker >/dev/null || die "load-image: docker is not installed (hack/images/docker.sh)"
  timeout 15 docker info >/dev/null 2>&1 || die "load-image: the Docker daemon is not reachable (hack/images/docker.sh)"
  for a in "$@"; do
    docker image inspect "$a" >/dev/null 2>&1 || die "load-image: Docker has no image $a"
    docker save "$a" | ctr_pi images import --all-platforms - >>"$LOGS/images.log" 2>&1 \
      || die "load-image: docker save $a | ctr images import (node $PI_NODE) failed; see $LOGS/images.log"
    if [[ $a == *-arm64 ]]; then
      plain=${a%-arm64}
      ctr_pi images tag --force "docker.io/$a" "docker.io/$plain" >>"$LOGS/images.log" 2>&1 \
        || die "load-image: tagging $a as $plain on $PI_NODE failed; see $LOGS/images.log"
    fi
  done
  log "imported $* into $PI_NODE ($(elapsed "$t0") s)"
}
