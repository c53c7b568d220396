{{/* Names, labels and the image reference shared by every template. */}}

{{- define "pathways.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pathways.fullname" -}}
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

{{- define "pathways.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "pathways.labels" -}}
helm.sh/chart: {{ include "pathways.chart" . }}
app.kubernetes.io/name: {{ include "pathways.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pathways
{{- end }}

{{/* Selector labels of one component: include with (dict "root" $ "component" "operator"). */}}
{{- define "pathways.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pathways.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pathways.componentLabels" -}}
{{ include "pathways.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The one image of every component. */}}
{{- define "pathways.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "pathways.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "pathways.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pathways.apiServiceAccount" -}}
{{- if .Values.api.serviceAccount.create }}
{{- default (printf "%s-api" (include "pathways.fullname" .)) .Values.api.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.api.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Writable scratch space for a read-only root filesystem: /tmp and the cache directory the image
points XDG_CACHE_HOME and JAX's compilation cache at.
*/}}
{{- define "pathways.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /var/cache/pathways
{{- end }}

{{- define "pathways.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
- name: cache
  emptyDir:
    sizeLimit: 2Gi
{{- end }}
