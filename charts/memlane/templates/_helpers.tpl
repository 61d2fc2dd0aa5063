{{/*
Names and labels, the prometheus-community way. Every template here takes a chart context: `$` inside
this chart, `.Subcharts.memlane` from a chart that lists memlane as a dependency.
*/}}

{{- define "memlane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "memlane.fullname" -}}
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

{{- define "memlane.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "memlane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memlane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "memlane.labels" -}}
helm.sh/chart: {{ include "memlane.chart" . }}
{{ include "memlane.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memlane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "memlane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "memlane.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "memlane.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
The worker pods' labels. Their app.kubernetes.io/name differs from the serving pods' so that nothing made
for those (the standalone Deployment's selector, the Service, the PodDisruptionBudget, the NetworkPolicy)
selects a worker pod, which has no gRPC port.
*/}}
{{- define "memlane.workerName" -}}{{ include "memlane.fullname" . | trunc 56 | trimSuffix "-" }}-worker{{- end -}}

{{- define "memlane.workerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "memlane.name" . | trunc 56 | trimSuffix "-" }}-worker
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "memlane.workerLabels" -}}
helm.sh/chart: {{ include "memlane.chart" . }}
{{ include "memlane.workerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memlane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The job stream KEDA watches: keyspace.py's session_end_queue under config.keyPrefix. */}}
{{- define "memlane.jobStream" -}}
{{- printf "%s:queue:session-end" (.Values.config.keyPrefix | default "ml") -}}
{{- end -}}

{{/* Seconds a memlane container needs after SIGTERM: the drain (config.shutdownGraceSeconds) + closing. */}}
{{- define "memlane.drainSeconds" -}}
{{- $grace := .Values.config.shutdownGraceSeconds | default 5 -}}
{{- add (ceil (float64 $grace)) 10 -}}
{{- end -}}

{{/* Object names. */}}
{{- define "memlane.configName" -}}{{ include "memlane.fullname" . | trunc 56 | trimSuffix "-" }}-config{{- end -}}
{{- define "memlane.envSecretName" -}}{{ include "memlane.fullname" . | trunc 59 | trimSuffix "-" }}-env{{- end -}}
{{- define "memlane.dataClaimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "memlane.fullname" . | trunc 58 | trimSuffix "-")) -}}
{{- end -}}
{{- define "memlane.accessSecretName" -}}
{{- .Values.access.existingSecret | default (printf "%s-access" (include "memlane.fullname" . | trunc 56 | trimSuffix "-")) -}}
{{- end -}}
{{- define "memlane.channelPoliciesName" -}}
{{- .Values.channelPolicies.existingConfigMap | default (printf "%s-channels" (include "memlane.fullname" . | trunc 54 | trimSuffix "-")) -}}
{{- end -}}

{{/* The data directory inside the container (MEMLANE_DATA_DIR; the image's VOLUME). */}}
{{- define "memlane.dataDir" -}}/var/lib/memlane{{- end -}}

{{/*
One setting value as an environment string. Helm holds every number as a float64, which prints as
3e+06; whole numbers are printed as integers so memlane's int settings parse.
*/}}
{{- define "memlane.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- . | int64 | toString -}}
{{- else -}}
{{- . | toString -}}
{{- end -}}
{{- end -}}

{{/* The <fullname>-env Secret exists: a redis.url or any secretConfig. */}}
{{- define "memlane.hasEnvSecret" -}}
{{- if or .Values.redis.url .Values.secretConfig -}}true{{- end -}}
{{- end -}}

{{/* The ConfigMap's data: every MEMLANE_* setting this release sets, chart-derived ones first. */}}
{{- define "memlane.configData" -}}
{{- $listen := list -}}
{{- if .Values.socket.enabled -}}
{{- $listen = append $listen (printf "unix:%s/%s" (trimSuffix "/" .Values.socket.dir) .Values.socket.name) -}}
{{- end -}}
{{- $listen = append $listen (printf "%s:%d" .Values.bindAddress (int .Values.ports.grpc)) -}}
MEMLANE_LISTEN: {{ join "," $listen | quote }}
MEMLANE_ADMIN_LISTEN: {{ printf "%s:%d" .Values.bindAddress (int .Values.ports.admin) | quote }}
MEMLANE_DATA_DIR: {{ include "memlane.dataDir" . | quote }}
{{- if .Values.access.enabled }}
MEMLANE_AUTH_REQUIRED: "true"
MEMLANE_ACCESS_POLICY_FILE: {{ printf "%s/%s" (trimSuffix "/" .Values.access.mountPath) .Values.access.key | quote }}
{{- end }}
{{- if .Values.channelPolicies.enabled }}
MEMLANE_CHANNEL_POLICIES_FILE: {{ printf "%s/%s" (trimSuffix "/" .Values.channelPolicies.mountPath) .Values.channelPolicies.key | quote }}
{{- end }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
{{ printf "MEMLANE_%s" ($key | snakecase | upper) }}: {{ include "memlane.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Checks that fail the render with a message rather than deploy something that cannot work. */}}
{{- define "memlane.validate" -}}
{{- if not (has .Values.mode (list "sidecar" "standalone")) -}}
{{- fail (printf "mode must be sidecar or standalone, not %q" .Values.mode) -}}
{{- end -}}
{{- range $name := list "livenessProbe" "readinessProbe" "startupProbe" -}}
{{- $p := index $.Values $name -}}
{{- if and $p.enabled $p.probe.grpc -}}
{{- if ne (int $p.probe.grpc.port) (int $.Values.ports.grpc) -}}
{{- fail (printf "%s.probe.grpc.port (%v) must be ports.grpc (%v)" $name $p.probe.grpc.port $.Values.ports.grpc) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.access.enabled (not .Values.access.existingSecret) (not .Values.access.policy) -}}
{{- fail "access.enabled needs access.policy or access.existingSecret" -}}
{{- end -}}
{{- if and .Values.channelPolicies.enabled (not .Values.channelPolicies.existingConfigMap) (not .Values.channelPolicies.policies) -}}
{{- fail "channelPolicies.enabled needs channelPolicies.policies or channelPolicies.existingConfigMap" -}}
{{- end -}}
{{- range $key := list "listen" "adminListen" "dataDir" "redisUrl" "authRequired" "accessPolicyFile" "channelPoliciesFile" -}}
{{- if or (hasKey $.Values.config $key) (hasKey $.Values.secretConfig $key) -}}
{{- fail (printf "config.%s is set by the chart (see the comment above config in values.yaml)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.existingSecret -}}
{{- fail "set redis.url or redis.existingSecret, not both" -}}
{{- end -}}
{{- $sharedRedis := or .Values.redis.url .Values.redis.existingSecret -}}
{{- $drain := int (include "memlane.drainSeconds" .) -}}
{{- if .Values.workers.enabled -}}
{{- if not $sharedRedis -}}
{{- fail "workers.enabled needs a shared Redis (redis.url or redis.existingSecret): workers take the sidecars' jobs from it" -}}
{{- end -}}
{{- if and (ne (toString .Values.config.ltmEnabled) "false") (not .Values.config.ltmUri) -}}
{{- fail "workers.enabled needs config.ltmUri on shared storage (s3://...): workers write the long-term memory the sidecars read" -}}
{{- end -}}
{{- if not .Values.config.archiveUri -}}
{{- fail "workers.enabled needs config.archiveUri on shared storage (s3://...): workers write the archives the sidecars resume from" -}}
{{- end -}}
{{- if lt (int .Values.workers.terminationGracePeriodSeconds) $drain -}}
{{- fail (printf "workers.terminationGracePeriodSeconds (%v) must cover the drain: config.shutdownGraceSeconds + 10 = %d" .Values.workers.terminationGracePeriodSeconds $drain) -}}
{{- end -}}
{{- if .Values.workers.keda.enabled -}}
{{- if not (or .Values.workers.keda.address .Values.redis.url) -}}
{{- fail "workers.keda.address (host:port of the Redis) is needed with redis.existingSecret" -}}
{{- end -}}
{{- if gt (int .Values.workers.keda.minReplicaCount) (int .Values.workers.keda.maxReplicaCount) -}}
{{- fail "workers.keda.minReplicaCount must not exceed workers.keda.maxReplicaCount" -}}
{{- end -}}
{{- end -}}
{{- else if .Values.workers.keda.enabled -}}
{{- fail "workers.keda.enabled needs workers.enabled" -}}
{{- end -}}
{{- if eq .Values.mode "standalone" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $sharedRedis) -}}
{{- fail "replicaCount > 1 needs a shared Redis (redis.url or redis.existingSecret): an embedded Redis is per pod" -}}
{{- end -}}
{{- if .Values.autoscaling.enabled -}}
{{- if not $sharedRedis -}}
{{- fail "autoscaling.enabled needs a shared Redis (redis.url or redis.existingSecret): an embedded Redis is per pod" -}}
{{- end -}}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) -}}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" -}}
{{- end -}}
{{- if not (or .Values.autoscaling.targetCPUUtilizationPercentage .Values.autoscaling.targetMemoryUtilizationPercentage) -}}
{{- fail "autoscaling.enabled needs targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" -}}
{{- end -}}
{{- end -}}
{{- $stop := $drain -}}
{{- if .Values.preStop.enabled -}}
{{- $stop = add $stop (int .Values.preStop.sleepSeconds) -}}
{{- end -}}
{{- if lt (int .Values.terminationGracePeriodSeconds) (int $stop) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must cover preStop.sleepSeconds + config.shutdownGraceSeconds + 10 = %d" .Values.terminationGracePeriodSeconds (int $stop)) -}}
{{- end -}}
{{- if .Values.podMonitor.enabled -}}
{{- fail "podMonitor is for mode=sidecar; mode=standalone uses serviceMonitor" -}}
{{- end -}}
{{- else -}}
{{- range $name := list "serviceMonitor" "podDisruptionBudget" "networkPolicy" "autoscaling" -}}
{{- if (index $.Values $name).enabled -}}
{{- fail (printf "%s is for mode=standalone: in mode=sidecar your agent's chart owns the pod (use podMonitor for metrics)" $name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.persistence.enabled (not .Values.persistence.existingClaim) .Values.sidecar.dataVolume -}}
{{- fail "mode=sidecar: persistence.enabled needs persistence.existingClaim, or set sidecar.dataVolume false and give the pod a volume named memlane-data (e.g. a StatefulSet volumeClaimTemplate)" -}}
{{- end -}}
{{- if and .Values.podMonitor.enabled (not .Values.podMonitor.selector) -}}
{{- fail "podMonitor.selector must select your agent pods" -}}
{{- end -}}
{{- end -}}
{{- end -}}
