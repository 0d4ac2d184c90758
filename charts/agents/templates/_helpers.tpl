{{/*
Names and labels shared by every template, and the derived settings more than one template needs.
*/}}

{{- define "agents.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-agents, or the release name alone when it already contains the chart name. */}}
{{- define "agents.fullname" -}}
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

{{- define "agents.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agents.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agents.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "agents.labels" -}}
helm.sh/chart: {{ include "agents.chart" . }}
{{ include "agents.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: control-plane
app.kubernetes.io/part-of: joch
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agents.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agents.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agents.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The chart's own Secret: generated token file, secret key ring, inline store URL. */}}
{{- define "agents.secretName" -}}
{{- include "agents.fullname" . }}
{{- end }}

{{- define "agents.configMapName" -}}
{{- printf "%s-config" (include "agents.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when the chart generates the admin token file. */}}
{{- define "agents.generateTokens" -}}
{{- if and .Values.auth.tokens.generate (not .Values.auth.tokens.existingSecret) }}true{{ end }}
{{- end }}

{{/* "true" when the server reads a token file (generated or the user's). */}}
{{- define "agents.tokenFile" -}}
{{- if or .Values.auth.tokens.existingSecret (include "agents.generateTokens" .) }}true{{ end }}
{{- end }}

{{/* "true" when the store is a shared one (not the embedded SQLite). */}}
{{- define "agents.sharedStore" -}}
{{- if .Values.store.existingSecret.name }}true
{{- else if and .Values.store.url (not (hasPrefix "sqlite" .Values.store.url)) }}true
{{- end }}
{{- end }}

{{/* "true" when the store is the Kubernetes CRD store (custom resources, leases in the cluster). */}}
{{- define "agents.kubernetesStore" -}}
{{- if and (not .Values.store.existingSecret.name) (hasPrefix "kubernetes" .Values.store.url) }}true{{ end }}
{{- end }}

{{/* "true" when the server talks to the Kubernetes API, so its pod needs the service account token. */}}
{{- define "agents.needsKubeApi" -}}
{{- if or .Values.kubernetesRuntime.enabled (include "agents.kubernetesStore" .) }}true{{ end }}
{{- end }}

{{/* The namespace of the Kubernetes store's own Secret (kubernetes://?namespace=NS, default joch-system). */}}
{{- define "agents.storeNamespace" -}}
{{- $found := regexFind "[?&]namespace=[^&]+" .Values.store.url }}
{{- if $found }}{{ regexReplaceAll "^[?&]namespace=" $found "" }}{{ else }}joch-system{{ end }}
{{- end }}

{{- define "agents.runtimeNamespace" -}}
{{- default .Release.Namespace .Values.kubernetesRuntime.namespace }}
{{- end }}

{{/* The names clients use to reach the Service in the cluster, all accepted as Host. */}}
{{- define "agents.serviceHosts" -}}
{{- $svc := include "agents.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{- define "agents.apiUrl" -}}
{{- if .Values.server.apiUrl }}
{{- .Values.server.apiUrl }}
{{- else }}
{{- printf "http://%s.%s.svc:%v" (include "agents.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}
{{- end }}

{{/*
Refuse values that would install a server that cannot work. values.schema.json checks each value's
shape; these are the rules between values.
*/}}
{{- define "agents.validate" -}}
{{- if and (not (include "agents.tokenFile" .)) (not .Values.auth.oidc.issuerUrl) }}
{{- fail "auth: the server listens on the pod's address, so it must authenticate: set auth.tokens.generate=true, auth.tokens.existingSecret, or auth.oidc.issuerUrl with auth.oidc.clientId" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "agents.sharedStore" .)) }}
{{- fail "replicaCount: more than one replica needs a store they share: set store.existingSecret.name (or store.url) to a postgresql:// or kubernetes:// URL; the embedded SQLite serves one replica" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) .Values.persistence.enabled (not (has "ReadWriteMany" .Values.persistence.accessModes)) }}
{{- fail "persistence: several replicas cannot share a ReadWriteOnce claim: set persistence.accessModes to [ReadWriteMany] or replicaCount to 1" }}
{{- end }}
{{- end }}
