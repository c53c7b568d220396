{{/* Names, labels and the image reference shared by every template. */}}

{{- define "pathways.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* At most 46 characters: the longest suffix of a Service's name, "-operator-metrics", then
keeps it within the 63 of a DNS label. */}}
{{- define "pathways.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" }}
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

{{/* The one image of every component, unquoted (an island's spec takes it as a value): quote
it where it is written into YAML. values.schema.json checks the repository and tag. */}}
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

{{/*
TLS: the Secret holding tls.crt, tls.key and ca.crt (given, or written by the cert-manager
Certificate), mounted read-only where the operator mounts it in island and program pods; the
PATHWAYS_TLS_* variables name its files (see docs/security.md).
*/}}
{{- define "pathways.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "pathways.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{- define "pathways.tlsCheck" -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) (not .Values.tls.certManager.issuerRef.name) }}
{{- fail "tls.enabled: set tls.secretName (an existing kubernetes.io/tls Secret) or tls.certManager.issuerRef.name (cert-manager writes the Secret)" }}
{{- end }}
{{- end }}

{{- define "pathways.tlsEnv" -}}
- name: PATHWAYS_TLS_CERT
  value: /var/run/pathways/tls/tls.crt
- name: PATHWAYS_TLS_KEY
  value: /var/run/pathways/tls/tls.key
- name: PATHWAYS_TLS_CA
  value: /var/run/pathways/tls/ca.crt
{{- end }}

{{- define "pathways.tlsMount" -}}
- name: pathways-tls
  mountPath: /var/run/pathways/tls
  readOnly: true
{{- end }}

{{- define "pathways.tlsVolume" -}}
- name: pathways-tls
  secret:
    secretName: {{ include "pathways.tlsSecretName" . | quote }}
    defaultMode: 0440
{{- end }}

{{/* Selector of the pods of one island component (the labels the operator sets). */}}
{{- define "pathways.islandPods" -}}
app.kubernetes.io/managed-by: pathways-operator
pathways.dev/component: {{ .component }}
{{- with .island }}
pathways.dev/island: {{ . }}
{{- end }}
{{- end }}

{{/* Egress rules of island pods (NetworkPolicies). */}}
{{- define "pathways.dnsEgress" -}}
# DNS, to any resolver (kube-dns, or NodeLocal DNSCache on a link-local address).
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end }}
{{- define "pathways.islandEgress" -}}
{{- include "pathways.dnsEgress" . }}
# Island pods of this namespace (schedulers to executors, executors to executors).
- to:
    - podSelector:
        matchLabels:
          app.kubernetes.io/managed-by: pathways-operator
        matchExpressions:
          - {key: pathways.dev/component, operator: In, values: [scheduler, executor]}
{{- with .Values.networkPolicy.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Program pods, in the namespaces networkPolicy.programNamespaceSelector admits. */}}
{{- define "pathways.programPeer" -}}
- podSelector:
    matchLabels:
      pathways.dev/component: program
  namespaceSelector:
    {{- toYaml .Values.networkPolicy.programNamespaceSelector | nindent 4 }}
{{- end }}

{{/* The IFRT proxy's pods: a client of the islands, like program pods (with proxy.enabled). */}}
{{- define "pathways.proxyPeer" -}}
- podSelector:
    matchLabels:
      {{- include "pathways.selectorLabels" (dict "root" . "component" "proxy") | nindent 6 }}
{{- end }}

{{/* "true" when islands take sessions with signed credentials only (needs control tokens). */}}
{{- define "pathways.sessionCredentials" -}}
{{- if and (dig "controlTokens" true .Values.operator) (dig "sessionCredentials" true .Values.operator) -}}
true
{{- end }}
{{- end }}

{{- define "pathways.sessionKeySecretName" -}}
{{- printf "%s-session-key" (include "pathways.fullname" .) }}
{{- end }}
