{{- define "fsdp-operator.name" -}}fsdp-operator{{- end -}}
{{- define "fsdp-operator.fullname" -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}-fsdp-operator{{- end -}}
{{- /* Every value reaches YAML quoted or through toYaml: a value can never add a key (e.g. hostNetwork). */}}
{{- define "fsdp-operator.labels" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end -}}
{{- define "fsdp-operator.selector" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
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

{{/* The environment variables the chart sets itself: extraEnv may not set them again (the last duplicate wins). */}}
{{- define "fsdp-operator.ownedEnv" -}}FSDP_OPERATOR_NAMESPACE,FSDP_OPERATOR_POD_LABELS,FSDP_JOB_NETWORK_POLICY,FSDP_RAY_TOKEN_AUTH,FSDP_NODE_NOTICES{{- end -}}

{{/* A Kubernetes quantity as a plain number (cpu in cores, memory in bytes), to compare requests and limits. */}}
{{- define "fsdp-operator.quantity" -}}
{{- $text := toString . -}}
{{- $number := regexFind "^[0-9]*\\.?[0-9]+" $text -}}
{{- $suffix := trimPrefix $number $text -}}
{{- $scale := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf (float64 $number) (get $scale $suffix) -}}
{{- end -}}

{{/* Values that contradict each other or would override what the chart owns: refused, with the value's name. */}}
{{- define "fsdp-operator.validate" -}}
{{- if and .Values.watchAllNamespaces .Values.watchNamespaces }}
{{- fail "watchNamespaces is set but watchAllNamespaces is true (the operator would watch every namespace): set watchAllNamespaces=false to watch only the listed ones" }}
{{- end }}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.livenessPort)) }}
{{- fail (printf "metrics.port and livenessPort are both %d: give the metrics their own port" (int .Values.livenessPort)) }}
{{- end }}
{{- $owned := splitList "," (include "fsdp-operator.ownedEnv" .) }}
{{- $seen := dict }}
{{- range .Values.extraEnv }}
{{- if has .name $owned }}
{{- fail (printf "extraEnv sets %s, which the chart sets itself (from its own values): remove it from extraEnv" .name) }}
{{- end }}
{{- if hasKey $seen .name }}
{{- fail (printf "extraEnv sets %s twice (the last would silently win): keep one" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- range $key, $_ := (include "fsdp-operator.selector" . | fromYaml) }}
{{- if hasKey ($.Values.podLabels | default dict) $key }}
{{- fail (printf "podLabels sets %s, a label the chart selects its pods by: remove it from podLabels" $key) }}
{{- end }}
{{- end }}
{{- range $key, $_ := (include "fsdp-operator.labels" . | fromYaml) }}
{{- if hasKey ($.Values.metrics.serviceMonitor.labels | default dict) $key }}
{{- fail (printf "metrics.serviceMonitor.labels sets %s, a label the chart sets itself: remove it" $key) }}
{{- end }}
{{- end }}
{{- $resources := .Values.resources | default dict }}
{{- $requests := $resources.requests | default dict }}
{{- $limits := $resources.limits | default dict }}
{{- range $name, $request := $requests }}
{{- if hasKey $limits $name }}
{{- if gt (float64 (include "fsdp-operator.quantity" $request)) (float64 (include "fsdp-operator.quantity" (get $limits $name))) }}
{{- fail (printf "resources.requests.%s (%v) is above resources.limits.%s (%v): a request may not exceed its limit" $name $request $name (get $limits $name)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
