{{/*
The runner's pod spec. Args: (list $root $args $withClaim). Non-root, read-only root filesystem, no capabilities; /tmp is an emptyDir
(helm's and matplotlib's caches), the definition and scenarios a ConfigMap, the history a claim.
*/}}
{{- define "torbed.nightlyPod" -}}
{{- $root := index . 0 -}}{{- $args := index . 1 -}}{{- $claim := index . 2 -}}
{{- $fn := include "torbed.fullname" $root -}}
serviceAccountName: {{ $fn }}-nightly
automountServiceAccountToken: {{ $claim }}
{{- include "torbed.pullSecrets" $root }}
restartPolicy: Never
securityContext:
  runAsNonRoot: true
  runAsUser: 10000
  runAsGroup: 10000
  fsGroup: 10000
  seccompProfile: {type: RuntimeDefault}
containers:
  - name: runner
    image: {{ include "torbed.nightlyImage" $root }}
    imagePullPolicy: {{ $root.Values.images.pullPolicy }}
    args:
      {{- toYaml $args | nindent 6 }}
    env:
      - name: POD_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
    {{- with $root.Values.nightly.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
      - {name: definition, mountPath: /etc/torbed/nightly, readOnly: true}
      {{- if $claim }}
      - {name: history, mountPath: /var/lib/torbed}
      {{- end }}
volumes:
  - name: tmp
    emptyDir: {}
  - name: definition
    configMap:
      name: {{ $fn }}-nightly
  {{- if $claim }}
  - name: history
    persistentVolumeClaim:
      claimName: {{ $root.Values.nightly.storage.existingClaim | default (printf "%s-nightly" $fn) }}
  {{- end }}
{{- end -}}
