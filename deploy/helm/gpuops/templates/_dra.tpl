{{/* DRA values that contradict each other fail the render, saying which to turn off. */}}
{{- define "gpuops.checkDra" -}}
{{- if and .Values.dra.enabled (not .Values.dra.nodeSelector) .Values.devicePlugin.enabled -}}
{{- fail "dra.enabled serves every node's GPUs through DRA, and the device plugin (devicePlugin.enabled) would advertise the same GPUs again: set devicePlugin.enabled=false, or set dra.nodeSelector to the node pools that use DRA (the others keep the device plugin)" -}}
{{- end -}}
{{- if and .Values.dra.nodeSelector (not .Values.dra.enabled) -}}
{{- fail "dra.nodeSelector names the DRA node pools but dra.enabled is false: set dra.enabled=true, or clear dra.nodeSelector" -}}
{{- end -}}
{{- if and .Values.dra.enabled .Values.dra.nodeSelector ((.Values.affinity | default dict).nodeAffinity | default dict).requiredDuringSchedulingIgnoredDuringExecution -}}
{{- fail "dra.nodeSelector keeps the device plugin's DaemonSet off the DRA pools with affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution, which affinity already sets: choose the nodes with nodeSelector instead" -}}
{{- end -}}
{{- end -}}
