{{/* Every define is prefixed with "solar-operator." and names are cut at 63 characters. */}}

{{- define "solar-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "solar-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "solar-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "solar-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "solar-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* TensorBoard's pods (tensorboard.enabled): a name of their own, outside the operator's selectors. */}}
{{- define "solar-operator.tensorboardSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-tensorboard" (include "solar-operator.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "solar-operator.tensorboardLabels" -}}
helm.sh/chart: {{ include "solar-operator.chart" . }}
{{ include "solar-operator.tensorboardSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: solar
app.kubernetes.io/component: tensorboard
{{- end }}

{{- define "solar-operator.labels" -}}
helm.sh/chart: {{ include "solar-operator.chart" . }}
{{ include "solar-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: solar
{{- end }}

{{- define "solar-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "solar-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "solar-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The monitoring objects asked for whose API (monitoring.coreos.com/v1) the cluster does not serve. */}}
{{- define "solar-operator.monitoringSkipped" -}}
{{- if not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}
{{- range $key := list "podMonitor" "serviceMonitor" "trainerPodMonitor" "prometheusRule" }}
{{- if (index $.Values.monitoring $key).enabled }}
{{ printf "monitoring.%s.enabled" $key }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The job kind of runs without spec.backend; it must be one of the enabled backends.
*/}}
{{- define "solar-operator.defaultBackend" -}}
{{- if not (has .Values.defaultBackend .Values.backends) -}}
{{- fail (printf "defaultBackend %s is not in backends %v: enable it or choose one of them" .Values.defaultBackend .Values.backends) -}}
{{- end -}}
{{- .Values.defaultBackend -}}
{{- end -}}
