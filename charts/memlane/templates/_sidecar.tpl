{{/*
The sidecar snippet. In an agent chart that lists memlane as a dependency (values under `memlane:`):

  spec:
    containers:
      - name: agent
        env:
          - name: MEMORY_SIDECAR
            value: {{ include "memlane.sidecar.target" .Subcharts.memlane | quote }}
        volumeMounts:
          {{- include "memlane.sidecar.socketVolumeMount" .Subcharts.memlane | nindent 10 }}
      {{- include "memlane.sidecar.container" .Subcharts.memlane | nindent 6 }}
    volumes:
      {{- include "memlane.sidecar.volumes" .Subcharts.memlane | nindent 6 }}

and on the pod template: checksum/memlane: {{ include "memlane.sidecar.checksum" .Subcharts.memlane }}.
The memlane release (the same one, as a subchart) renders the ConfigMap and Secrets these refer to.
*/}}

{{/* What the agent dials: the Unix socket when enabled, else loopback TCP. */}}
{{- define "memlane.sidecar.target" -}}
{{- if .Values.socket.enabled -}}
{{- printf "unix:%s/%s" (trimSuffix "/" .Values.socket.dir) .Values.socket.name -}}
{{- else -}}
{{- printf "127.0.0.1:%d" (int .Values.ports.grpc) -}}
{{- end -}}
{{- end -}}

{{/* A volumeMounts item for the agent container: the directory of memlane's Unix socket. */}}
{{- define "memlane.sidecar.socketVolumeMount" -}}
{{- if .Values.socket.enabled -}}
- name: memlane-socket
  mountPath: {{ .Values.socket.dir }}
{{- end }}
{{- end -}}

{{/* Changes when a setting read only at start changes (not the access policy: memlane reloads it). */}}
{{- define "memlane.sidecar.checksum" -}}
{{- $in := dict "config" (include "memlane.configData" .) "secret" .Values.secretConfig "redis" .Values.redis "channels" .Values.channelPolicies -}}
{{- toJson $in | sha256sum -}}
{{- end -}}

{{/* The memlane container, as one item of a pod's containers (or initContainers when nativeSidecar). */}}
{{- define "memlane.sidecar.container" -}}
{{- include "memlane.validate" . -}}
{{- include "memlane.sidecar.containerBody" . | trim -}}
{{- end -}}

{{- define "memlane.sidecar.containerBody" }}
- name: {{ .Values.sidecar.containerName }}
  image: {{ include "memlane.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
  ports:
    - name: memlane-grpc
      containerPort: {{ .Values.ports.grpc }}
      protocol: TCP
    - name: memlane-metrics
      containerPort: {{ .Values.ports.admin }}
      protocol: TCP
  envFrom:
    {{- include "memlane.envFrom" . | nindent 4 }}
  {{- if or .Values.redis.existingSecret .Values.extraEnv .Values.workers.enabled }}
  env:
    {{- include "memlane.redisUrlEnv" . | nindent 4 }}
    {{- if .Values.workers.enabled }}
    # A thin sidecar: the workers Deployment runs the background jobs.
    - name: MEMLANE_PIPELINE_ENABLED
      value: "false"
    - name: MEMLANE_WORKER_PROCESSES
      value: "0"
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- if .Values.preStop.enabled }}
  lifecycle:
    # Callers stop sending before SIGTERM starts the drain (values.yaml: preStop).
    preStop:
      exec:
        command: ["sleep", {{ .Values.preStop.sleepSeconds | int | toString | quote }}]
  {{- end }}
  {{- range $name := list "startupProbe" "livenessProbe" "readinessProbe" }}
  {{- $p := index $.Values $name }}
  {{- if $p.enabled }}
  {{ $name }}:
    {{- toYaml $p.probe | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: memlane-data
      mountPath: {{ include "memlane.dataDir" . }}
    - name: memlane-tmp
      mountPath: /tmp
    {{- if .Values.socket.enabled }}
    - name: memlane-socket
      mountPath: {{ .Values.socket.dir }}
    {{- end }}
    {{- if .Values.access.enabled }}
    - name: memlane-access
      mountPath: {{ .Values.access.mountPath }}
      readOnly: true
    {{- end }}
    {{- if .Values.channelPolicies.enabled }}
    - name: memlane-channels
      mountPath: {{ .Values.channelPolicies.mountPath }}
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* MEMLANE_REDIS_URL from redis.existingSecret, as an env item (nothing without one). */}}
{{- define "memlane.redisUrlEnv" -}}
{{- if .Values.redis.existingSecret -}}
- name: MEMLANE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.existingSecretKey }}
{{- end -}}
{{- end -}}

{{/* The envFrom items of every memlane container: the ConfigMap, the env Secret, extraEnvFrom. */}}
{{- define "memlane.envFrom" -}}
- configMapRef:
    name: {{ include "memlane.configName" . }}
{{- if include "memlane.hasEnvSecret" . }}
- secretRef:
    name: {{ include "memlane.envSecretName" . }}
{{- end }}
{{- with .Values.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The volumes the container mounts, as items of the pod's volumes (extraVolumes included). */}}
{{- define "memlane.sidecar.volumes" -}}
{{- include "memlane.sidecar.volumesBody" . | trim -}}
{{- end -}}

{{- define "memlane.sidecar.volumesBody" }}
{{- if or .Values.sidecar.dataVolume (eq .Values.mode "standalone") }}
- name: memlane-data
  {{- if .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "memlane.dataClaimName" . }}
  {{- else if .Values.dataSizeLimit }}
  emptyDir:
    sizeLimit: {{ .Values.dataSizeLimit }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
- name: memlane-tmp
  emptyDir: {}
{{- if .Values.socket.enabled }}
- name: memlane-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if .Values.access.enabled }}
- name: memlane-access
  secret:
    secretName: {{ include "memlane.accessSecretName" . }}
    defaultMode: 0444
{{- end }}
{{- if .Values.channelPolicies.enabled }}
- name: memlane-channels
  configMap:
    name: {{ include "memlane.channelPoliciesName" . }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
