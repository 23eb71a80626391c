{{/* The chart's short name. */}}
{{- define "stoker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: names every object of the release. */}}
{{- define "stoker.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "stoker.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "stoker.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "stoker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stoker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "stoker.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: stoker
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "stoker.labels" -}}
{{ include "stoker.selectorLabels" . }}
{{ include "stoker.commonLabels" . }}
{{- end -}}

{{/* The snapshot agent's: a component of its own, so that the operator's selectors (Deployment, PDB,
metrics Service) never take the agent's pods, nor the DaemonSet the operator's. */}}
{{- define "stoker.snapshotAgentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "stoker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: snapshot-agent
{{- end -}}

{{- define "stoker.snapshotAgentLabels" -}}
{{ include "stoker.snapshotAgentSelectorLabels" . }}
{{ include "stoker.commonLabels" . }}
{{- end -}}

{{- define "stoker.snapshotAgentName" -}}
{{- printf "%s-snapshot-agent" (include "stoker.fullname" . | trunc 48 | trimSuffix "-") -}}
{{- end -}}

{{- define "stoker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stoker.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's ServiceAccount as an RBAC subject. */}}
{{- define "stoker.subject" -}}
- kind: ServiceAccount
  name: {{ include "stoker.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* The Secret holding the standby control key; the operator creates it in its own namespace. */}}
{{- define "stoker.controlKeySecret" -}}
{{- printf "%s-control-key" (include "stoker.fullname" .) -}}
{{- end -}}

{{/* The Lease the operator's replicas elect their leader on. */}}
{{- define "stoker.leaseName" -}}
{{- printf "%s-leader" (include "stoker.fullname" .) -}}
{{- end -}}

{{/* The ConfigMap the operator keeps the fleet's startup observations and refitted coefficients in. */}}
{{- define "stoker.coefficientsConfigMap" -}}
{{- printf "%s-startup-coefficients" (include "stoker.fullname" .) -}}
{{- end -}}

{{- define "stoker.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The snapshot agent's image: snapshot.image where set (an empty repository is the operator's), else
the operator's repository at its version's `-snapshot-agent` tag (the Dockerfile's snapshot-agent target). */}}
{{- define "stoker.snapshotAgentImage" -}}
{{- $agent := .Values.snapshot.image -}}
{{- $repository := default .Values.image.repository $agent.repository -}}
{{- if $agent.digest -}}
{{- printf "%s@%s" $repository $agent.digest -}}
{{- else -}}
{{- $version := default .Chart.AppVersion .Values.image.tag -}}
{{- printf "%s:%s" $repository (default (printf "%s-snapshot-agent" $version) $agent.tag) -}}
{{- end -}}
{{- end -}}

{{/*
What the operator does in a namespace it watches, verb by verb (see src/stoker/controller):
- VLLMServices: kopf lists and watches them; patch removes the finalizer and annotations an earlier
  operator version left (stoker keeps no state on the object); the status subresource takes the
  operator's status patches; `finalizers: update` lets children carry an owner reference with
  blockOwnerDeletion where the OwnerReferencesPermissionEnforcement admission plugin is on.
- Children are created when missing and written by server-side apply (patch) only after a read showed
  this object's owner reference (get): nothing of a user's is adopted. Deployments and Jobs are also
  watched; superseded seed Jobs stoker created are deleted. The Secret is never read: a JSON patch that
  tests its owner reference writes it.
- Pods are listed and watched (startup timings); their logs are read; Events are listed (pod scheduling
  and image-pull times) and created (the operator's own).
*/}}
{{- define "stoker.rules" -}}
- apiGroups: ["stoker.dev"]
  resources: ["vllmservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["stoker.dev"]
  resources: ["vllmservices/status"]
  verbs: ["get", "patch"]
- apiGroups: ["stoker.dev"]
  resources: ["vllmservices/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# runtime.nodesPerReplica above 1: the LeaderWorkerSet, read with a GET per reconcile (its CRD may be
# missing, so it is not watched); its pods are created by LWS's controller.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "create", "patch"]
# coldStart.nodeWarming: the warmer DaemonSet, deleted when warming is skipped or turned off.
- apiGroups: ["apps"]
  resources: ["daemonsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims", "services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# coldStart.peerWeights: the per-rank peer Services, their EndpointSlices (stoker's, listing the Ready
# serving pods) and the NetworkPolicies admitting the peer ports; deleted when peer weights are turned off.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# get: scale from zero checks that an endpoint picker's address is its pod's own IP.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list", "create", "patch"]
# spec.inferencePool: the InferencePool is read with a GET per reconcile, not watched (its CRD may be
# missing), and deleted when the spec drops it.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
# spec.inferencePool.scaleFromZero: the EPP Service's ready addresses (each checked against its pod), for
# its queue gauge, and a scale from 0 to 1 through the scale subresource, as an autoscaler.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
- apiGroups: ["stoker.dev"]
  resources: ["vllmservices/scale"]
  verbs: ["get", "update"]
{{- end -}}

{{/*
Where the metrics endpoint listens (it has no authentication): metrics.bindAddress if set; otherwise the
pod IP when the metrics Service (which a ServiceMonitor needs) sends scrapes there, else loopback.
*/}}
{{- define "stoker.metricsBindAddress" -}}
{{- if .Values.metrics.bindAddress -}}
{{- .Values.metrics.bindAddress -}}
{{- else if .Values.metrics.service.enabled -}}
podIP
{{- else -}}
127.0.0.1
{{- end -}}
{{- end }}

{{/*
One STOKER_*_BIND_ADDRESS variable: "podIP" becomes the pod's IP from the downward API.
*/}}
{{- define "stoker.bindAddressEnv" -}}
- name: {{ .name }}
{{- if eq .address "podIP" }}
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- else }}
  value: {{ .address | quote }}
{{- end }}
{{- end }}
