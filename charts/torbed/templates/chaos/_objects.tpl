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

{{/* One fault as a Chaos Mesh object, or nothing for kinds whose Chaos Mesh action would be a
different fault (docs/faults.md "One meaning per kind"). Args: (list $root $i $fault).
- kill: container-kill, SIGKILL from chaos-daemon, as the local backend's kill; torbed first
  marks the pod held (the tor container then waits instead of starting tor again).
- restart: none (Chaos Mesh has no SIGTERM action: pod-kill deletes the pod, container-kill
  is SIGKILL); torbed sends SIGTERM itself.
- cpu: none (a StressChaos competes for the CPU instead of capping it); torbed lowers the
  tor container's CPU limit in place.
- pause, link: none (see docs/faults.md).
No `duration` in the spec: torbed creates the object at the fault's time. */}}
{{- define "torbed.chaosObject" -}}
{{- $root := index . 0 -}}{{- $i := index . 1 -}}{{- $f := index . 2 -}}
{{- $fn := include "torbed.fullname" $root -}}
{{- if eq $f.kind "kill" }}
apiVersion: chaos-mesh.org/v1alpha1
kind: PodChaos
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
  # chaos-daemon sends SIGKILL to the tor container; the pod stays, held by torbed's mark.
  action: container-kill
  containerNames: [tor]
{{- end }}
{{- end -}}
