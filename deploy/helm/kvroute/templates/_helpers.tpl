{{/* The objects' name: the release's, unless it already says kvroute. */}}
{{- define "kvroute.fullname" -}}
{{- if contains "kvroute" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kvroute" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: app.kubernetes.io/name is "kvroute", the job the alert KvrouteDown reads. */}}
{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "kvroute.labels" -}}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvroute.serviceAccountName" -}}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kvroute.keysSecret" -}}
{{- default (printf "%s-keys" (include "kvroute.fullname" .)) .Values.existingKeysSecret -}}
{{- end -}}

{{/* The security context every container runs with (the "restricted" Pod Security Standard). */}}
{{- define "kvroute.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}
