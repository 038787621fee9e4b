{{/*
Names. The RayCluster is named after the release (or fullnameOverride) so that a RayJob's
clusterSelector `ray.io/cluster: <release>` finds it; KubeRay caps RayCluster names at 53 characters.
*/}}
{{- define "raytrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "raytrain.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 53 | trimSuffix "-" }}
{{- end }}

{{- define "raytrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The one set of app.kubernetes.io labels every object carries. */}}
{{- define "raytrain.labels" -}}
helm.sh/chart: {{ include "raytrain.chart" . }}
{{ include "raytrain.selectorLabels" . }}
app.kubernetes.io/version: {{ include "raytrain.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: raytrain
{{- end }}

{{- define "raytrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raytrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Image tag: "<appVersion>-ray<rayVersion>" unless image.tag is set, so rayVersion is written once. */}}
{{- define "raytrain.imageTag" -}}
{{- default (printf "%s-ray%s" .Chart.AppVersion .Values.rayVersion) .Values.image.tag }}
{{- end }}

{{/* Usage: include "raytrain.image" (dict "root" $ "gpu" true) */}}
{{- define "raytrain.image" -}}
{{- $tag := include "raytrain.imageTag" .root }}
{{- if .gpu }}{{ $tag = printf "%s%s" $tag .root.Values.image.gpuTagSuffix }}{{ end }}
{{- printf "%s:%s" .root.Values.image.repository $tag }}
{{- end }}

{{/* Name of the shared PVC: the user's existing claim or the one this chart creates. */}}
{{- define "raytrain.sharedClaimName" -}}
{{- default (printf "%s-shared" (include "raytrain.fullname" .)) .Values.sharedStorage.existingClaim }}
{{- end }}

{{/* Enabled worker groups as a list of dicts {name, values, gpus}; the one place that knows the three kinds of group. */}}
{{- define "raytrain.workerGroups" -}}
{{- $groups := list }}
{{- if .Values.worker.enabled }}
{{- $groups = append $groups (dict "name" "worker" "key" "worker" "values" .Values.worker "gpus" 0) }}
{{- end }}
{{- if .Values.gpuWorker.enabled }}
{{- $groups = append $groups (dict "name" "gpu" "key" "gpuWorker" "values" .Values.gpuWorker "gpus" (int .Values.gpuWorker.gpus)) }}
{{- end }}
{{- range $name, $group := .Values.additionalWorkerGroups }}
{{- if not $group.disabled }}
{{- $groups = append $groups (dict "name" $name "key" (printf "additionalWorkerGroups.%s" $name) "values" $group "gpus" (int (default 0 $group.gpus))) }}
{{- end }}
{{- end }}
{{- toJson (dict "groups" $groups) }}
{{- end }}

{{/*
validateValues: fail early, with the value to change and how, on what the schema cannot express.
*/}}
{{- define "raytrain.validateValues" -}}
{{- $errors := list }}
{{- $fullname := include "raytrain.fullname" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) }}
{{- $errors = append $errors (printf "RayCluster name %q is not a DNS-1035 label (KubeRay requires one): pick a release name (or fullnameOverride) that starts with a letter and has only a-z, 0-9 and '-'" $fullname) }}
{{- end }}
{{- $s := .Values.sharedStorage }}
{{- if $s.enabled }}
{{- $sources := 0 }}
{{- if $s.existingClaim }}{{ $sources = add1 $sources }}{{ end }}
{{- if or $s.nfs.server $s.nfs.path }}{{ $sources = add1 $sources }}{{ end }}
{{- if $s.hostPath }}{{ $sources = add1 $sources }}{{ end }}
{{- if gt $sources 1 }}
{{- $errors = append $errors "sharedStorage: set only one of existingClaim, nfs.server/nfs.path and hostPath" }}
{{- end }}
{{- if and $s.nfs.server (not $s.nfs.path) }}
{{- $errors = append $errors "sharedStorage.nfs.server is set but sharedStorage.nfs.path is empty: set the exported path, e.g. --set sharedStorage.nfs.path=/exports/raytrain" }}
{{- end }}
{{- if and $s.nfs.path (not $s.nfs.server) }}
{{- $errors = append $errors "sharedStorage.nfs.path is set but neither sharedStorage.nfs.server nor sharedStorage.existingClaim is: set the NFS server, e.g. --set sharedStorage.nfs.server=10.0.0.2" }}
{{- end }}
{{- end }}
{{- $tag := include "raytrain.imageTag" . }}
{{- $imageRay := regexFind "ray[0-9]+[.][0-9]+[.][0-9]+" $tag | trimPrefix "ray" }}
{{- if and $imageRay (ne $imageRay (toString .Values.rayVersion)) }}
{{- $errors = append $errors (printf "image.tag %q carries Ray %s but rayVersion is %s: make them agree (leave image.tag empty to derive it from rayVersion)" $tag $imageRay (toString .Values.rayVersion)) }}
{{- end }}
{{- if and .Values.auth.enabled (not (semverCompare ">=2.52.0-0" (toString .Values.rayVersion))) }}
{{- $errors = append $errors (printf "auth.enabled needs Ray >= 2.52.0 but rayVersion is %s: raise rayVersion or set auth.enabled=false" (toString .Values.rayVersion)) }}
{{- end }}
{{- $groups := (include "raytrain.workerGroups" . | fromJson).groups }}
{{- if not $groups }}
{{- $errors = append $errors "no worker group is enabled: set worker.enabled=true, gpuWorker.enabled=true or add an additionalWorkerGroups entry" }}
{{- end }}
{{- range $name := list "worker" "gpu" }}
{{- if hasKey $.Values.additionalWorkerGroups $name }}
{{- $errors = append $errors (printf "additionalWorkerGroups.%s: the name %q belongs to a built-in group: rename the entry" $name $name) }}
{{- end }}
{{- end }}
{{- range $g := $groups }}
{{- $v := $g.values }}
{{- if not (and (le (int $v.minReplicas) (int $v.replicas)) (le (int $v.replicas) (int $v.maxReplicas))) }}
{{- $errors = append $errors (printf "%s: need minReplicas <= replicas <= maxReplicas, got %v <= %v <= %v" $g.key $v.minReplicas $v.replicas $v.maxReplicas) }}
{{- end }}
{{- if not (regexMatch "^[1-9][0-9]*$" (toString $v.resources.cpu)) }}
{{- $errors = append $errors (printf "%s.resources.cpu is %v: use a whole number of CPUs so that Ray's num-cpus equals the limit" $g.key $v.resources.cpu) }}
{{- end }}
{{- range $param := list "num-cpus" "num-gpus" }}
{{- if hasKey (default dict $v.rayStartParams) $param }}
{{- $errors = append $errors (printf "%s.rayStartParams.%s is set: remove it, the chart derives it from %s.resources/gpus so Ray and Kubernetes agree" $g.key $param $g.key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $errors }}
{{- fail (printf "\n\nraytrain-cluster: invalid values:\n  - %s\n" (join "\n  - " $errors)) }}
{{- end }}
{{- end }}

{{/* requests = limits (Guaranteed QoS, and Ray sees exactly what Kubernetes reserved). */}}
{{- define "raytrain.resources" -}}
{{- $r := dict "cpu" (toString .resources.cpu) "memory" (toString .resources.memory) -}}
{{- if gt (int .gpus) 0 }}{{ $_ := set $r "nvidia.com/gpu" (toString .gpus) }}{{ end -}}
requests:
  {{- toYaml $r | nindent 2 }}
limits:
  {{- toYaml $r | nindent 2 }}
{{- end }}

{{/*
Pod template of a Ray group.
Usage: include "raytrain.podTemplate" (dict "root" $ "group" <values> "component" "head"|"worker-<name>" "container" "ray-head"|"ray-worker" "gpus" N "head" bool)
*/}}
{{- define "raytrain.podTemplate" -}}
{{- $root := .root }}
{{- $v := .group -}}
metadata:
  labels:
    {{- include "raytrain.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
  {{- with $v.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with $root.Values.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .container }}
      image: {{ include "raytrain.image" (dict "root" $root "gpu" (gt (int .gpus) 0)) }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      securityContext:
        {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      {{- $fd := $root.Values.failureDetection }}
      {{- if or $v.env (and .head $fd.enabled) }}
      env:
        {{- if and .head $fd.enabled }}
        # Read by the GCS on the head: how fast a lost node is declared dead (see values: failureDetection).
        - {name: RAY_health_check_period_ms, value: {{ $fd.healthCheckPeriodMs | int | quote }}}
        - {name: RAY_health_check_failure_threshold, value: {{ $fd.healthCheckFailureThreshold | int | quote }}}
        {{- end }}
        {{- with $v.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      ports:
        {{- if .head }}
        - {name: gcs-server, containerPort: 6379}
        - {name: dashboard, containerPort: 8265}
        - {name: client, containerPort: 10001}
        {{- end }}
        - {name: metrics, containerPort: 8080}
      resources:
        {{- include "raytrain.resources" (dict "resources" $v.resources "gpus" .gpus) | nindent 8 }}
      volumeMounts:
        - name: dshm
          mountPath: /dev/shm
        {{- if $root.Values.sharedStorage.enabled }}
        - name: shared
          mountPath: {{ $root.Values.sharedStorage.mountPath }}
        {{- end }}
  volumes:
    # Ray's object store and torch DataLoader workers need more shared memory than the 64Mi default.
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $root.Values.shmSize }}
    {{- if $root.Values.sharedStorage.enabled }}
    - name: shared
      {{- if $root.Values.sharedStorage.hostPath }}
      hostPath:
        path: {{ $root.Values.sharedStorage.hostPath }}
        type: DirectoryOrCreate
      {{- else }}
      persistentVolumeClaim:
        claimName: {{ include "raytrain.sharedClaimName" $root }}
      {{- end }}
    {{- end }}
{{- end }}
