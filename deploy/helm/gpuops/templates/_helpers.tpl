{{/* Chart name (nameOverride). */}}
{{- define "gpuops.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the objects: fullnameOverride, else the release name if it contains the chart
name, else <release>-<name>. */}}
{{- define "gpuops.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels (never change after the first install). */}}
{{- define "gpuops.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuops.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "gpuops.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuops.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuops
{{- end -}}

{{/* The agent's ServiceAccount name. */}}
{{- define "gpuops.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpuops.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Values that contradict each other fail the render, naming both. */}}
{{- define "gpuops.checkValues" -}}
{{- if and .Values.devicePlugin.configs .Values.devicePlugin.configMapName -}}
{{- fail "devicePlugin.configs and devicePlugin.configMapName are both set: give the configs inline or name an existing ConfigMap, not both" -}}
{{- end -}}
{{- if and .Values.mig.config .Values.mig.configMapName -}}
{{- fail "mig.config and mig.configMapName are both set: give the config inline or name an existing ConfigMap, not both" -}}
{{- end -}}
{{- if and .Values.devicePlugin.defaultConfig (not (or .Values.devicePlugin.configs .Values.devicePlugin.configMapName)) -}}
{{- fail "devicePlugin.defaultConfig needs devicePlugin.configs or devicePlugin.configMapName: it names one of their configs" -}}
{{- end -}}
{{- end -}}

{{/* The extender's full name. */}}
{{- define "gpuops.extenderName" -}}
{{- printf "%s-scheduler-extender" (include "gpuops.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The second kube-scheduler's full name. */}}
{{- define "gpuops.schedulerName" -}}
{{- printf "%s-scheduler" (include "gpuops.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
