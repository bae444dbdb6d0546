{{- define "fsdp-operator.name" -}}fsdp-operator{{- end -}}
{{- define "fsdp-operator.fullname" -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}-fsdp-operator{{- end -}}
{{- define "fsdp-operator.labels" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "fsdp-operator.selector" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "fsdp-operator.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "fsdp-operator.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "fsdp-operator.image" -}}
{{- $repository := required "image.repository is required: build Dockerfile.operator, push it to a registry your nodes can pull from, and pass --set image.repository=REGISTRY/fsdp-operator" .Values.image.repository -}}
{{ $repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* The namespaces a namespaced operator watches: watchNamespaces, or the release's own. */}}
{{- define "fsdp-operator.namespaces" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end -}}

{{- define "fsdp-operator.peering" -}}{{ if gt (int .Values.replicas) 1 }}{{ include "fsdp-operator.fullname" . }}{{ end }}{{- end -}}

{{/* Values that contradict each other: refused, rather than silently granting more than was asked for. */}}
{{- define "fsdp-operator.validate" -}}
{{- if and .Values.watchAllNamespaces .Values.watchNamespaces }}
{{- fail "watchNamespaces is set but watchAllNamespaces is true (the operator would watch every namespace): set watchAllNamespaces=false to watch only the listed ones" }}
{{- end }}
{{- end -}}
