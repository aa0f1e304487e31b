{{- /*
Where a pod writes its results and the release's token it must present (Authorization:
Bearer): the results service refuses writes without it (401) or with another (403).
Args: the root context.
*/ -}}
{{- define "torbed.resultsEnv" -}}
- {name: TORBED_RESULTS_URL, value: "http://{{ include "torbed.fullname" . }}-results:8080"}
- name: TORBED_RESULTS_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "torbed.fullname" . }}-results-token, key: token}}
{{- end }}
