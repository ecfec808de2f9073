{{- define "to.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "to.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "to.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "to.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "to.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules the operator needs wherever it manages TranscriptionDeployments and
TranscriptionGateways. */}}
{{- define "to.rules" -}}
- apiGroups: ["transcription.dev"]
  resources: ["transcriptiondeployments", "transcriptiongateways"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["transcription.dev"]
  resources: ["transcriptiondeployments/status", "transcriptiongateways/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# KEDA's ScaledObjects, for pools with autoscaling (harmless where KEDA is not installed).
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# prometheus-operator's PodMonitors, for resources whose spec.monitoring asks (harmless
# where prometheus-operator is not installed).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# The frontend's Role grants these; RBAC lets the operator grant only what it holds.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
{{- with .Values.rbac.secretNames }}
# Existence checks of the Secrets resources reference: only these names, no list, no watch.
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: {{ toJson . }}
  verbs: ["get"]
{{- end }}
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Status says why replicas are not ready: the operator's pods (watched by label) and the
# Warning Events about pods (watched by field). Read-only.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{- /* "true" when the operator reads every namespace: none named, or a pattern among them
(`team-*`, `!ci-*`: it must see every namespace to know which match). */ -}}
{{- define "to.clusterWide" -}}
{{- $wide := not .Values.watchNamespaces -}}
{{- range .Values.watchNamespaces -}}
{{- if regexMatch "^!|[*?\\[]" . -}}{{- $wide = true -}}{{- end -}}
{{- end -}}
{{- $wide -}}
{{- end -}}
