{{/*
Names. Every object is "<fullname>-<component>". A relay group's StatefulSet is
"<fullname>-<group>" and its pods carry a controller-revision-hash label
"<statefulset>-<10-character hash>", which must fit a 63-character label value; so the
StatefulSet name must stay within 52 characters. Group names have at most 12 characters
(scenario schema), so the fullname is truncated to 30 characters, which also leaves room
for the longest fixed suffix ("-keygen-cleanup") and the authority Services ("-auth-N").
*/}}
{{- define "torbed.fullname" -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- end -}}

{{- define "torbed.selectorLabels" -}}
app.kubernetes.io/name: torbed
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "torbed.labels" -}}
{{ include "torbed.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
torbed.io/scenario: {{ .Values.name | quote }}
torbed.io/variant: {{ include "torbed.variant" . | quote }}
torbed.io/repetition: {{ .Values.repetition | quote }}
{{- end -}}

{{/* The variant this release deploys: .Values.variant, else the scenario's baseline. */}}
{{- define "torbed.variant" -}}
{{- if .Values.variant -}}{{ .Values.variant }}
{{- else if .Values.baseline -}}{{ .Values.baseline }}
{{- else -}}{{ first .Values.variants }}
{{- end -}}
{{- end -}}

{{/* The variant of a relay group: its own override, else the release's. */}}
{{- define "torbed.groupVariant" -}}
{{- $root := index . 0 -}}{{- $group := index . 1 -}}
{{- $g := index $root.Values.network.relays $group -}}
{{- if $g.variant }}{{ $g.variant }}{{ else }}{{ include "torbed.variant" $root }}{{ end -}}
{{- end -}}

{{/* Variant family: "ewma-66" -> "ewma" (as torbed.variants does). */}}
{{- define "torbed.family" -}}
{{- $parts := splitList "-" . -}}{{ first $parts }}
{{- end -}}

{{/* A variant's torrc fragment, resolved from files/variants.yaml: "<family>-<number>" sets the first
parameter, "<family>-<preset>" the preset's parameters (torbed.variants). Args: (list $root $variant). */}}
{{- define "torbed.variantTorrc" -}}
{{- $root := index . 0 -}}{{- $variant := index . 1 -}}
{{- $families := (($root.Files.Get "files/variants.yaml") | fromYaml).families -}}
{{- $family := include "torbed.family" $variant -}}
{{- $arg := trimPrefix (printf "%s-" $family) $variant -}}
{{- if eq $arg $variant }}{{ $arg = "" }}{{ end -}}
{{- $f := index $families $family -}}
{{- $torrc := $f.torrc -}}
{{- $preset := dict -}}
{{- if and $arg $f.presets }}{{ $preset = index $f.presets $arg | default dict }}{{ end -}}
{{- range $i, $p := $f.parameters -}}
{{- $value := $p.default -}}
{{- if hasKey $preset $p.name }}{{ $value = index $preset $p.name }}
{{- else if and (eq $i 0) $arg (not $preset) }}{{ $value = $arg }}{{ end -}}
{{- $torrc = replace (printf "{%s}" $p.name) (toString $value) $torrc -}}
{{- end -}}
# Variant {{ $variant }}: {{ $f.description }}
# Paper: {{ $f.paper }}
{{ $torrc }}
{{- end -}}

{{/* Image references. */}}
{{- define "torbed.tag" -}}{{ .Values.images.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "torbed.registryPrefix" -}}{{ with .Values.images.registry }}{{ trimSuffix "/" . }}/{{ end }}{{- end -}}
{{/* imagePullSecrets of every pod (images.pullSecrets: names of Secrets of type
kubernetes.io/dockerconfigjson in the release's namespace); nothing when empty. */}}
{{- define "torbed.pullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* An image's tag: images.tags.<key> when set (torbed run --backend k8s sets each image's
content tag there), else the default. Args: (list $root key default). */}}
{{- define "torbed.tagOf" -}}
{{- $root := index . 0 -}}{{- $tags := $root.Values.images.tags | default dict -}}
{{- index $tags (index . 1) | default (index . 2) -}}
{{- end -}}
{{- define "torbed.image.client" -}}{{ include "torbed.registryPrefix" . }}{{ .Values.images.client }}:{{ include "torbed.tagOf" (list . "client" (include "torbed.tag" .)) }}{{- end -}}
{{- define "torbed.image.dirauth" -}}{{ include "torbed.registryPrefix" . }}{{ .Values.images.dirauth }}:{{ include "torbed.tagOf" (list . "dirauth" (include "torbed.tag" .)) }}{{- end -}}
{{- define "torbed.image.relay" -}}
{{- $root := index . 0 -}}{{- $variant := index . 1 -}}{{- $family := include "torbed.family" $variant -}}
{{ include "torbed.registryPrefix" $root }}{{ $root.Values.images.relay }}:{{ include "torbed.tagOf" (list $root (printf "relay-%s" $family) (printf "%s-%s" $family (include "torbed.tag" $root))) }}
{{- end -}}

{{/* Duration string ("90s", "5m", "500ms") -> seconds, as a decimal string. */}}
{{- define "torbed.seconds" -}}
{{- $m := regexFind "^[0-9]+(\\.[0-9]+)?" (toString .) -}}
{{- $unit := trim (trimPrefix $m (toString .)) -}}
{{- $factor := dict "us" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- mulf (float64 $m) (index $factor $unit) -}}
{{- end -}}

{{/* "true" when the scenario has background load (`load:`, even `load: {}`: all defaults). */}}
{{- define "torbed.load" -}}{{ if kindIs "map" .Values.load }}true{{ end }}{{- end -}}
{{- define "torbed.loadWorkers" -}}{{ .Values.load.workers | default 1 }}{{- end -}}
{{- define "torbed.image.locust" -}}{{ include "torbed.registryPrefix" . }}{{ .Values.images.locust }}:{{ include "torbed.tagOf" (list . "locust" (include "torbed.tag" .)) }}{{- end -}}

{{/* Names of the authority nodes and their Services. */}}
{{- define "torbed.authorityCount" -}}{{ .Values.network.authorities | default 3 }}{{- end -}}

{{/* Pod-level security shared by every pod: non-root, the tor user of the images. */}}
{{- define "torbed.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10000
runAsGroup: 10000
fsGroup: 10000
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security: read-only root, no privilege escalation, no capabilities. */}}
{{- define "torbed.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Placement of a group (scenario `placement`). */}}
{{- define "torbed.placement" -}}
{{- $root := index . 0 -}}{{- $group := index . 1 -}}
{{- $p := index ($root.Values.placement | default dict) $group | default dict -}}
{{- with $p.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $p.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $p.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The link shaper and egress guard, a native sidecar (an init container that keeps running): it installs the
htb tree before tor starts (its startup probe gates the next containers) and then keeps the
per-destination filters in step with the peers' pod addresses, which exist only once the
peers run and change when a pod is recreated. It also drops egress outside
isolation.allowedCIDRs at the pod's interface, so the testbed stays closed even where the CNI
ignores NetworkPolicy; hence it runs in every pod. Only this container has NET_ADMIN, and it
runs as root because Kubernetes grants no ambient capabilities to non-root users.
Args: (list $root $group) or (list $root $group "indexed"): an indexed Job's pods (clients) carry
their index in an annotation, not in their name, so the sidecar is given it as TORBED_INDEX and
names its gate records after the same node as the pod's driver (web0, not web-<suffix>).
*/}}
{{- define "torbed.shaper" -}}
{{- $root := index . 0 -}}{{- $group := index . 1 -}}
{{- $indexed := and (gt (len .) 2) (eq (index . 2) "indexed") -}}
- name: shaper
  image: {{ include "torbed.image.client" $root }}
  imagePullPolicy: {{ $root.Values.images.pullPolicy }}
  restartPolicy: Always
  command: ["/opt/torbed/bin/python", "-m", "torbed.pods.shaper"]
  args: ["--scenario", "/etc/torbed/scenario/scenario.json", "--group", {{ $group | quote }},
         "--release", {{ include "torbed.fullname" $root | quote }},
         "--namespace", {{ $root.Release.Namespace | quote }},
         "--cluster-domain", {{ $root.Values.clusterDomain | quote }},
         "--ready-file", "/run/torbed/shaper/ready"
         {{- range $root.Values.isolation.allowedCIDRs }}, "--allow", {{ . | quote }}{{ end }}]
  env:
    {{- include "torbed.env" $root | nindent 4 }}
    {{- include "torbed.resultsEnv" $root | nindent 4 }}
    {{- if $indexed }}
    - name: TORBED_INDEX
      valueFrom: {fieldRef: {fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    {{- end }}
  securityContext:
    runAsNonRoot: false
    runAsUser: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["NET_ADMIN"]
  startupProbe:
    exec:
      command: ["cat", "/run/torbed/shaper/ready"]
    periodSeconds: 1
    failureThreshold: 120
  resources:
    {{- toYaml $root.Values.resources.sidecar | nindent 4 }}
  volumeMounts:
    - {name: scenario, mountPath: /etc/torbed/scenario, readOnly: true}
    - {name: shaper-run, mountPath: /run/torbed/shaper}
{{- end -}}

{{- define "torbed.scenarioJson" -}}
{{- /* The scenario's own keys (generated from the scenario model): chart keys never leak in. */ -}}
{{- $scenarioKeys := ((.Files.Get "files/scenario-keys.yaml") | fromYaml).keys -}}
{{- $s := dict -}}
{{- range $k, $v := .Values -}}
{{- if has $k $scenarioKeys }}{{- $_ := set $s $k $v -}}{{- end -}}
{{- end -}}
{{- toJson $s -}}
{{- end -}}

{{/* Environment every torbed container gets. */}}
{{- define "torbed.env" -}}
- name: TORBED_RELEASE
  value: {{ include "torbed.fullname" . | quote }}
- name: TORBED_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: TORBED_CLUSTER_DOMAIN
  value: {{ .Values.clusterDomain | quote }}
- name: TORBED_VARIANT
  value: {{ include "torbed.variant" . | quote }}
- name: TORBED_REPETITION
  value: {{ .Values.repetition | quote }}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: HOST_IP
  valueFrom: {fieldRef: {fieldPath: status.hostIP}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
{{- end -}}

{{/* Rate string ("4mbit", "1MB/s") -> bits per second, an integer (as torbed.units). */}}
{{- define "torbed.bits" -}}
{{- $m := regexFind "^[0-9]+(\\.[0-9]+)?" (toString .) -}}
{{- $unit := trim (trimPrefix $m (toString .)) -}}
{{- $factor := dict "bit" 1.0 "kbit" 1000.0 "mbit" 1000000.0 "gbit" 1000000000.0 "B/s" 8.0 "KB/s" 8000.0 "MB/s" 8000000.0 "GB/s" 8000000000.0 "KiB/s" 8192.0 "MiB/s" 8388608.0 "GiB/s" 8589934592.0 -}}
{{- mulf (float64 $m) (index $factor $unit) | int64 -}}
{{- end -}}

{{/* Volumes every tor pod mounts. Args: (list $root $withKeys). */}}
{{- define "torbed.torVolumes" -}}
{{- $root := index . 0 -}}{{- $withKeys := index . 1 -}}
- name: torrc
  configMap: {name: {{ include "torbed.fullname" $root }}-torrc}
- name: identities
  configMap: {name: {{ include "torbed.fullname" $root }}-identities}
{{- if $withKeys }}
- name: keys
  secret: {secretName: {{ include "torbed.fullname" $root }}-keys, defaultMode: 0400}
{{- end }}
- name: scenario
  configMap: {name: {{ include "torbed.fullname" $root }}-scenario}
- name: data
  emptyDir: {}
- name: run
  emptyDir: {}
- name: tmp
  emptyDir: {}
- name: shaper-run
  emptyDir: {medium: Memory}
{{- end -}}

{{/* The tor container of an authority or relay. Args: (list $root $role $group $image $fragments). */}}
{{- define "torbed.torContainer" -}}
{{- $root := index . 0 -}}{{- $role := index . 1 -}}{{- $group := index . 2 -}}{{- $image := index . 3 -}}{{- $fragments := index . 4 -}}
- name: tor
  image: {{ $image }}
  imagePullPolicy: {{ $root.Values.images.pullPolicy }}
  {{- if and (eq $role "relay") (or (include "torbed.hasFault" (list $root "kill" $group)) (include "torbed.hasFault" (list $root "restart" $group))) }}
  {{- /* A kill keeps the relay down and a restart keeps it down for its duration, as on the
  local backend: torbed marks the pod held (/run/torbed/fault-hold, an emptyDir that outlives
  the container) before the signal, and the container the kubelet starts again waits while
  the mark is there. */}}
  command: ["/bin/bash", "-c", "trap 'exit 0' TERM; while [ -e /run/torbed/fault-hold ]; do sleep 0.2 & wait $!; done; exec /usr/local/bin/torbed-node"]
  {{- else }}
  command: ["/usr/local/bin/torbed-node"]
  {{- end }}
  env:
    {{- include "torbed.env" $root | nindent 4 }}
    - {name: TORBED_ROLE, value: {{ $role | quote }}}
    - {name: TORBED_GROUP, value: {{ $group | quote }}}
    - {name: TORBED_FRAGMENTS, value: {{ join " " $fragments | quote }}}
  ports:
    - {name: orport, containerPort: 5000, protocol: TCP}
    {{- if eq $role "authority" }}
    - {name: dirport, containerPort: 7000, protocol: TCP}
    {{- end }}
    {{- if eq $role "relay" }}
    - {name: metrics, containerPort: 9035, protocol: TCP}
    {{- end }}
  readinessProbe:
    tcpSocket: {port: {{ if eq $role "authority" }}dirport{{ else }}orport{{ end }}}
    periodSeconds: 2
  securityContext:
    {{- include "torbed.containerSecurity" $root | nindent 4 }}
  resources:
    {{- $res := deepCopy (index $root.Values.resources $role) }}
    {{- if and (eq $role "relay") (include "torbed.hasFault" (list $root "cpu" $group)) }}
    {{- /* A cpu fault lowers this limit in place (the pod's resize subresource): the
    container needs one to start with (one core, as the fault's percent is of one core),
    and keeps the pod's QoS class while it changes. With Chaos Mesh too: a cpu fault is
    a cap on every backend, never a competing stressor. */}}
    {{- $limits := $res.limits | default dict }}
    {{- if not (hasKey $limits "cpu") }}
    {{- $_ := set $limits "cpu" "1" }}
    {{- $req := $res.requests | default dict }}
    {{- if not (hasKey $req "cpu") }}{{ $_ := set $req "cpu" "10m" }}{{ end }}
    {{- $_ := set $res "limits" $limits }}{{ $_ := set $res "requests" $req }}
    {{- end }}
    {{- end }}
    {{- toYaml $res | nindent 4 }}
  volumeMounts:
    - {name: torrc, mountPath: /etc/torbed/torrc, readOnly: true}
    - {name: identities, mountPath: /etc/torbed/identities, readOnly: true}
    - {name: keys, mountPath: /etc/torbed/keys, readOnly: true}
    - {name: data, mountPath: /var/lib/torbed}
    - {name: run, mountPath: /run/torbed}
    - {name: tmp, mountPath: /tmp}
{{- end -}}

{{/* The release's own replay traces (replayTraces), mounted at /etc/torbed/traces: a volume,
or nothing when there are none (pods then use the traces shipped in the client image). */}}
{{- define "torbed.tracesVolume" -}}
{{- $rt := .Values.replayTraces | default dict -}}
{{- if $rt.configMap }}
- name: traces
  configMap: {name: {{ $rt.configMap }}}
{{- else if $rt.inline }}
- name: traces
  configMap: {name: {{ include "torbed.fullname" . }}-traces}
{{- end }}
{{- end -}}
{{- define "torbed.tracesMount" -}}
{{- $rt := .Values.replayTraces | default dict -}}
{{- if or $rt.configMap $rt.inline }}
- {name: traces, mountPath: /etc/torbed/traces, readOnly: true}
{{- end }}
{{- end -}}

{{/* Nightly mode (nightly.enabled): only templates/nightly/ render; no network.
Every template starts with this check, so it also puts the default scenario in place first. */}}
{{- define "torbed.nightlyMode" -}}
{{- include "torbed.defaultScenario" . -}}
{{- if and .Values.nightly .Values.nightly.enabled }}true{{ end -}}
{{- end -}}

{{/* Values that name no scenario (no `network`: `helm install torbed charts/torbed`) get the
quickstart (files/default-scenario.yaml, a generated copy of scenarios/quickstart.yaml); keys
the values do give (--set measure.duration=30s, variant=ewma-66) override its fields (but a
zero value such as seed=0 counts as unset: sprig's merge). The
schema refuses a partial scenario (servers or clients without network). Idempotent: after the
first call `network` is set. Prints nothing. */}}
{{- define "torbed.defaultScenario" -}}
{{- if and (not .Values.network) (not (and .Values.nightly .Values.nightly.enabled)) -}}
{{- $_ := merge .Values (.Files.Get "files/default-scenario.yaml" | fromYaml) -}}
{{- end -}}
{{- end -}}

{{/* Labels of the nightly runner's objects (no scenario or variant: it runs many). */}}
{{- define "torbed.nightlyLabels" -}}
app.kubernetes.io/name: torbed
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: nightly
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* The nightly runner's image reference. */}}
{{- define "torbed.nightlyImage" -}}
{{- $reg := .Values.images.registry -}}
{{- $tag := .Values.images.tag | default .Chart.AppVersion -}}
{{- if $reg }}{{ printf "%s/%s:%s" (trimSuffix "/" $reg) .Values.nightly.image $tag }}{{ else }}{{ printf "%s:%s" .Values.nightly.image $tag }}{{ end -}}
{{- end -}}

{{/*
Target labels of every scrape of the release's pods, the same as the local backend's
Prometheus gives its targets (docs/observability.md), so the dashboards' queries work on
either: job, release (the Helm release), variant (a relay group's own, else the release's),
group, node (<group><index>, as the local backend names nodes), role (the pod's component),
rep, pod. The in-chart Prometheus sets the same labels statically (prometheus/configmap.yaml);
tests/chart/test_prometheus_config.py runs these rules in a real Prometheus and compares.
Relabel rules in the Prometheus Operator's spelling (`relabelings`). Args: (list $root job).
*/}}
{{- define "torbed.relabelings" -}}
{{- $root := index . 0 -}}{{- $job := index . 1 -}}
- {targetLabel: job, replacement: {{ $job | quote }}}
- {targetLabel: release, replacement: {{ $root.Release.Name | quote }}}
- {targetLabel: variant, replacement: {{ include "torbed.variant" $root | quote }}}
- {sourceLabels: [__meta_kubernetes_pod_label_torbed_io_variant], regex: "(.+)", targetLabel: variant}
- {targetLabel: rep, replacement: {{ $root.Values.repetition | quote }}}
- {sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], targetLabel: role}
- {sourceLabels: [__meta_kubernetes_pod_label_torbed_io_group], regex: "(.+)", targetLabel: group}
- {sourceLabels: [__meta_kubernetes_pod_name], targetLabel: pod}
# StatefulSet pods end in -<ordinal>; Indexed Job pods carry their index in an annotation.
- {sourceLabels: [__meta_kubernetes_pod_label_torbed_io_group, __meta_kubernetes_pod_name], regex: "(.+);.*-([0-9]+)", targetLabel: node, replacement: "${1}${2}"}
- {sourceLabels: [__meta_kubernetes_pod_label_torbed_io_group, __meta_kubernetes_pod_annotation_batch_kubernetes_io_job_completion_index], regex: "(.+);([0-9]+)", targetLabel: node, replacement: "${1}${2}"}
- {sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], regex: results, targetLabel: node, replacement: results}
{{- end -}}

{{- define "torbed.image.prometheus" -}}{{ include "torbed.registryPrefix" . }}{{ .Values.images.prometheus }}:{{ include "torbed.tagOf" (list . "prometheus" (include "torbed.tag" .)) }}{{- end -}}

{{/* "true" when the scenario has a fault of this kind on this relay group (its name, or one of
its nodes: <group><index>); any group when the group is "". Args: (list $root $kind $group). */}}
{{- define "torbed.hasFault" -}}
{{- $root := index . 0 -}}{{- $kind := index . 1 -}}{{- $group := index . 2 -}}
{{- $found := false -}}
{{- range $root.Values.faults | default list -}}
{{- if eq .kind $kind -}}
{{- $t := .target | default "" -}}
{{- if or (eq $group "") (eq $t $group) (and (not (hasKey $root.Values.network.relays $t)) (hasPrefix $group $t) (regexMatch "^[0-9]+$" (trimPrefix $group $t))) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $found }}true{{ end -}}
{{- end -}}

{{/* Extra labels of every pod of the release (podLabels). */}}
{{- define "torbed.podLabels" -}}
{{- with .Values.podLabels }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* Annotations of every pod of the release: a node autoscaler must not evict a pod mid-run
(a relay gone changes the network being measured): cluster-autoscaler's safe-to-evict and
Karpenter's do-not-disrupt; then podAnnotations (e.g. sidecar.istio.io/inject: "false"). */}}
{{- define "torbed.podAnnotations" -}}
cluster-autoscaler.kubernetes.io/safe-to-evict: "false"
karpenter.sh/do-not-disrupt: "true"
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end -}}
{{- end -}}
