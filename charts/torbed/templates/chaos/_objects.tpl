{{/* Chaos Mesh objects for the scenario's faults (chaosMesh.enabled). */}}

{{/* The selector of a fault's target: a relay group by label, a node by its pod name.
Args: (list $root $target). */}}
{{- define "torbed.chaosSelector" -}}
{{- $root := index . 0 -}}{{- $target := index . 1 -}}
{{- $fn := include "torbed.fullname" $root -}}
namespaces: [{{ $root.Release.Namespace | quote }}]
{{- if hasKey $root.Values.network.relays $target }}
labelSelectors:
  app.kubernetes.io/instance: {{ $root.Release.Name | quote }}
  app.kubernetes.io/component: relay
  torbed.io/group: {{ $target | quote }}
{{- else }}
{{- $base := regexReplaceAll "[0-9]+$" $target "" }}
pods:
  {{ $root.Release.Namespace | quote }}: [{{ printf "%s-%s-%s" $fn $base (trimPrefix $base $target) | quote }}]
{{- end }}
{{- end -}}

{{/* One fault as a Chaos Mesh object, or nothing for kinds Chaos Mesh does not take here
(pause, link: see docs/faults.md). Args: (list $root $i $fault). No `duration` in the spec:
torbed creates the object at the fault's time and deletes it when the fault ends. */}}
{{- define "torbed.chaosObject" -}}
{{- $root := index . 0 -}}{{- $i := index . 1 -}}{{- $f := index . 2 -}}
{{- $fn := include "torbed.fullname" $root -}}
{{- if has $f.kind (list "kill" "restart" "cpu") }}
apiVersion: chaos-mesh.org/v1alpha1
kind: {{ ternary "StressChaos" "PodChaos" (eq $f.kind "cpu") }}
metadata:
  name: {{ $fn }}-fault-{{ $i }}
  namespace: {{ $root.Release.Namespace | quote }}
  labels:
    {{- include "torbed.labels" $root | nindent 4 }}
    torbed.io/fault: {{ $i | quote }}
  annotations:
    torbed.io/at: {{ $f.at | quote }}
spec:
  mode: all
  selector:
    {{- include "torbed.chaosSelector" (list $root $f.target) | nindent 4 }}
  {{- if eq $f.kind "kill" }}
  # The StatefulSet recreates the pod with the same keys: the relay comes back as itself.
  action: pod-kill
  {{- else if eq $f.kind "restart" }}
  # chaos-daemon kills the tor container; the kubelet starts it again.
  action: container-kill
  containerNames: [tor]
  {{- else }}
  # A stressor next to tor takes what the fault leaves it: (100 - cpu)% of one core.
  containerNames: [tor]
  stressors:
    cpu:
      workers: 1
      load: {{ max 1 (sub 100 (trimSuffix "%" (toString $f.cpu) | float64 | floor | int)) }}
  {{- end }}
{{- end }}
{{- end -}}
