{{/* Chart name, overridable. */}}
{{- define "resumequal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-name[-chart-name], at most 63 characters. */}}
{{- define "resumequal.fullname" -}}
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

{{- define "resumequal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "resumequal.labels" -}}
helm.sh/chart: {{ include "resumequal.chart" . }}
{{ include "resumequal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels selecting the operator's pods. */}}
{{- define "resumequal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "resumequal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "resumequal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "resumequal.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] */}}
{{- define "resumequal.imageRef" -}}
{{- $ref := .repository }}
{{- if .tag }}{{ $ref = printf "%s:%s" $ref .tag }}{{ end }}
{{- if .digest }}{{ $ref = printf "%s@%s" $ref .digest }}{{ end }}
{{- $ref }}
{{- end }}

{{- define "resumequal.image" -}}
{{- include "resumequal.imageRef" (dict "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag) "digest" .Values.image.digest) }}
{{- end }}

{{/* The namespaces whose QualificationRuns are served (not used with allNamespaces). */}}
{{- define "resumequal.watchNamespaces" -}}
{{- $ns := .Values.watch.namespaces | default (list .Release.Namespace) | uniq }}
{{- toJson $ns }}
{{- end }}

{{/* Leader election is on when asked for, and must be when there are replicas to elect from. */}}
{{- define "resumequal.leaderElect" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail "leaderElection.enabled: must be true when replicas > 1 (only the leader may reconcile)" }}
{{- end }}
{{- if .Values.leaderElection.enabled }}true{{ end }}
{{- end }}

{{/* Security context shared by every container the chart runs. */}}
{{- define "resumequal.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "resumequal.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The operator's backend options (values backend, trainjob). */}}
{{- define "resumequal.backendArgs" -}}
{{- if and (eq .Values.backend "trainjob") (not .Values.trainjob.enabled) }}
{{- fail "backend: trainjob needs trainjob.enabled: true" }}
{{- end }}
{{- if and .Values.trainjob.enabled .Values.watch.allNamespaces (eq .Values.trainjob.runtime.kind "TrainingRuntime") }}
{{- fail "trainjob.runtime.kind: TrainingRuntime is one per watched namespace; with watch.allNamespaces use ClusterTrainingRuntime" }}
{{- end }}
{{- if not .Values.networkPolicy.enabled }}
- --no-network-policies
{{- end }}
- --default-backend={{ .Values.backend }}
{{- if .Values.trainjob.enabled }}
- --trainjob
- --trainjob-runtime={{ .Values.trainjob.runtime.name }}
- --trainjob-runtime-kind={{ .Values.trainjob.runtime.kind }}
{{- end }}
{{- end }}

{{/* What the operator does to the objects of the runs it serves, in one namespace or all:
exactly the requests it makes (tests/operator/test_rbac.py holds the two to each other). */}}
{{- define "resumequal.runRules" -}}
# Watched (list + watch), read, its finalizer added and removed (patch).
- apiGroups: ["resumequal.dev"]
  resources: ["qualificationruns"]
  verbs: ["get", "list", "watch", "patch"]
# The status is written whole, with the resourceVersion read (update).
- apiGroups: ["resumequal.dev"]
  resources: ["qualificationruns/status"]
  verbs: ["update"]
# Not a request: what the jobs and the Secret it creates need, since they are owned by the
# run with blockOwnerDeletion (the OwnerReferencesPermissionEnforcement admission plugin).
- apiGroups: ["resumequal.dev"]
  resources: ["qualificationruns/finalizers"]
  verbs: ["update"]
# The jobs it creates are watched (list + watch, by its managed-by label) and read from
# that cache, read (get) when just created. A resize (preemption.resize) lowers a leg's
# Worker replicas at the kill and raises them at the grow (a JSON merge patch).
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
{{- if .Values.trainjob.enabled }}
# The same for TrainJob legs (no patch: a TrainJob is never resized).
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Preemption is the deletion of one worker pod, read first to check it is the run's.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Each run's checkpoint key: created once, never read back (only the run's pods read it);
# owned by the run, so the garbage collector deletes it with the run.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- if .Values.networkPolicy.enabled }}
# Each leg's (and a zoom's) NetworkPolicy: created once, owned by the run, so the garbage
# collector deletes it with the run.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create"]
{{- end }}
{{- end }}
