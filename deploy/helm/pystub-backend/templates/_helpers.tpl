{{/* Names and labels shared by every object of the release. */}}
{{- define "pystub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pystub.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pystub.labels" -}}
{{ include "pystub.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* PromQL: in-flight requests of this release: pystub_inflight_requests is queued plus executing, per model version. */}}
{{- define "pystub.inflightQuery" -}}
sum(pystub_inflight_requests{namespace="{{ .Release.Namespace }}",pod=~"{{ include "pystub.fullname" . }}-.*"})
{{- end -}}

{{- define "pystub.isLocalRepository" -}}
{{- if not (regexMatch "^(s3|gs|as)://" .Values.modelRepository) -}}true{{- end -}}
{{- end -}}
