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

{{/*
The labels Kueue or the batch scheduler reads on the RayCluster (nothing by default):
- Kueue (kubernetes-sigs/kueue pkg/controller/constants/constants.go QueueLabel, WorkloadPriorityClassLabel);
- Volcano (KubeRay v1.7.0 batchscheduler/volcano/volcano_scheduler.go: QueueNameLabelKey into the PodGroup's queue,
  utils.RayPriorityClassName into its priorityClassName, createPodGroup);
- YuniKorn (batchscheduler/yunikorn/yunikorn_scheduler.go: RayApplicationIDLabelName, RayApplicationQueueLabelName
  copied to each pod as applicationId and queue, and utils.RayGangSchedulingEnabled, isGangSchedulingEnabled).
*/}}
{{- define "raytrain.schedulingLabels" -}}
{{- with .Values.kueue.queueName }}
kueue.x-k8s.io/queue-name: {{ . | quote }}
{{- end }}
{{- with .Values.kueue.priorityClass }}
kueue.x-k8s.io/priority-class: {{ . | quote }}
{{- end }}
{{- $b := .Values.batchScheduler }}
{{- if eq $b.name "volcano" }}
{{- with $b.queue }}
volcano.sh/queue-name: {{ . | quote }}
{{- end }}
{{- with $b.priorityClassName }}
ray.io/priority-class-name: {{ . | quote }}
{{- end }}
{{- else if eq $b.name "yunikorn" }}
{{- /* YuniKorn's application IDs are cluster-wide: the same release name in two namespaces must not share one */}}
yunikorn.apache.org/app-id: {{ printf "%s-%s" .Release.Namespace (include "raytrain.fullname" .) | trunc 63 | trimSuffix "-" | quote }}
{{- with $b.queue }}
yunikorn.apache.org/queue: {{ . | quote }}
{{- end }}
{{- if $b.gangScheduling }}
ray.io/gang-scheduling-enabled: "true"
{{- end }}
{{- end }}
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

{{/*
ServiceAccount of every Ray pod: serviceAccount.name, or with serviceAccount.create "<fullname>-ray"; "" leaves it to
KubeRay. At most 50 characters: with autoscaling on, KubeRay v1.7.0 sets the head pod's serviceAccountName to
utils.CheckName(name), which cuts longer names from the front (common/pod.go DefaultHeadPodTemplate).
*/}}
{{- define "raytrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-ray" (include "raytrain.fullname" . | trunc 46 | trimSuffix "-")) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "s3" or "gs" for objectStorage.url (validateValues refuses any other), "" when it is off. */}}
{{- define "raytrain.objectStorageScheme" -}}
{{- with .Values.objectStorage.url }}{{ regexFind "^[a-z0-9]+" . }}{{ end }}
{{- end }}

{{- define "raytrain.gcsCredentialsDir" -}}
/var/run/secrets/raytrain/gcs
{{- end }}

{{/*
Environment of every Ray container for objectStorage.url: only the cloud SDKs' standard variables (botocore for s3fs,
google-auth for gcsfs; training/raytrain/rundir/storage.py has no setting of its own). Credentials come from the Secret by
reference, never as values; with no Secret the SDK falls back to the pod's identity (IRSA, Workload Identity).
*/}}
{{- define "raytrain.objectStorageEnv" -}}
{{- $os := .Values.objectStorage }}
{{- $scheme := include "raytrain.objectStorageScheme" . }}
{{- if eq $scheme "s3" }}
{{- with $os.endpoint }}
- {name: AWS_ENDPOINT_URL, value: {{ . | quote }}}
{{- end }}
{{- with $os.region }}
- {name: AWS_DEFAULT_REGION, value: {{ . | quote }}}
{{- end }}
{{- with $os.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_ACCESS_KEY_ID}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_SECRET_ACCESS_KEY}}
- name: AWS_SESSION_TOKEN
  valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_SESSION_TOKEN, optional: true}}
{{- end }}
{{- else if and (eq $scheme "gs") $os.credentialsSecret }}
- {name: GOOGLE_APPLICATION_CREDENTIALS, value: {{ printf "%s/credentials.json" (include "raytrain.gcsCredentialsDir" .) | quote }}}
{{- end }}
{{- end }}

{{/*
Enabled worker groups as a list of dicts {name, key, values, gpus}; the one place that knows the three kinds of group.
Every group has the same shape: it is on unless `enabled: false` or `disabled: true`; gpus (default 0) sets its GPUs.
*/}}
{{- define "raytrain.workerGroups" -}}
{{- $all := list (list "worker" "worker" .Values.worker) (list "gpu" "gpuWorker" .Values.gpuWorker) }}
{{- range $name, $group := .Values.additionalWorkerGroups }}
{{- $all = append $all (list $name (printf "additionalWorkerGroups.%s" $name) $group) }}
{{- end }}
{{- $groups := list }}
{{- range $entry := $all }}
{{- $v := index $entry 2 }}
{{- if and (ne (toString (dig "enabled" true $v)) "false") (not (dig "disabled" false $v)) }}
{{- $groups = append $groups (dict "name" (index $entry 0) "key" (index $entry 1) "values" $v "gpus" (int (dig "gpus" 0 $v))) }}
{{- end }}
{{- end }}
{{- toJson (dict "groups" $groups) }}
{{- end }}

{{/* The head and the enabled worker groups, same shape as raytrain.workerGroups. */}}
{{- define "raytrain.rayGroups" -}}
{{- $head := dict "name" "head" "key" "head" "values" .Values.head "gpus" 0 }}
{{- toJson (dict "groups" (prepend (include "raytrain.workerGroups" . | fromJson).groups $head)) }}
{{- end }}

{{/* requests = limits (Guaranteed QoS, and Ray sees exactly what Kubernetes reserved). */}}
{{- define "raytrain.resources" -}}
{{- $r := dict "cpu" (toString .resources.cpu) "memory" (toString .resources.memory) -}}
{{- if gt (int .gpus) 0 }}{{ $_ := set $r "nvidia.com/gpu" (toString .gpus) }}{{ end -}}
{{- with index .resources "ephemeral-storage" }}{{ $_ := set $r "ephemeral-storage" (toString .) }}{{ end -}}
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
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  {{- with include "raytrain.serviceAccountName" $root }}
  # Every Ray pod, workers too: they upload checkpoints, and Ray runs any task on any node.
  serviceAccountName: {{ . }}
  {{- if not $.head }}
  # Workers use the account's cloud identity only (IRSA's and Pod Identity's tokens are projected by EKS's webhook,
  # Workload Identity answers on the metadata server), never its Kubernetes API token: with autoscaling on, KubeRay
  # binds its autoscaler Role (pods patch, rayclusters patch: rbac.go) to the head's account, which is this one.
  automountServiceAccountToken: false
  {{- end }}
  {{- end }}
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
  {{- if and .head $root.Values.sharedStorage.enabled $root.Values.sharedStorage.volumePermissions.enabled }}
  initContainers:
    {{- include "raytrain.volumePermissions" $root | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .container }}
      image: {{ include "raytrain.image" (dict "root" $root "gpu" (gt (int .gpus) 0)) }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      securityContext:
        {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      {{- $fd := $root.Values.failureDetection }}
      {{- $os := $root.Values.objectStorage }}
      {{- $gcsKey := and (eq (include "raytrain.objectStorageScheme" $root) "gs") $os.credentialsSecret }}
      {{- $osEnv := include "raytrain.objectStorageEnv" $root | trim }}
      {{- if or $v.env .head $osEnv }}
      env:
        {{- if .head }}
        # Read by the job supervisor on the head (Ray 2.60 dashboard/modules/job/job_supervisor.py): how long a
        # stopped job's driver (RayJob deleted, `ray job stop`) has after SIGTERM before SIGKILL; Ray's 3 s is
        # shorter than the checkpoint raytrain takes on SIGTERM.
        - {name: RAY_JOB_STOP_WAIT_TIME_S, value: {{ $root.Values.jobStopWaitSeconds | int | quote }}}
        {{- end }}
        {{- if and .head $fd.enabled }}
        # Read by the GCS on the head: how fast a lost node is declared dead (see values: failureDetection).
        - {name: RAY_health_check_period_ms, value: {{ $fd.healthCheckPeriodMs | int | quote }}}
        - {name: RAY_health_check_failure_threshold, value: {{ $fd.healthCheckFailureThreshold | int | quote }}}
        {{- end }}
        {{- with $osEnv }}
        # objectStorage: the bucket's endpoint, region and credentials, as the cloud SDKs read them.
        {{- . | nindent 8 }}
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
        # Ray 2.60's AUTOSCALER_METRIC_PORT and DASHBOARD_METRIC_PORT (the names KubeRay's PodMonitor scrapes).
        - {name: as-metrics, containerPort: 44217}
        - {name: dash-metrics, containerPort: 44227}
        {{- end }}
        - {name: metrics, containerPort: 8080}
      resources:
        {{- include "raytrain.resources" (dict "resources" $v.resources "gpus" .gpus) | nindent 8 }}
      {{- with $root.Values.preStopDrain }}{{ if .enabled }}
      # kubelet runs this before its SIGTERM to `ray start --block` (which Ray Train's workers never see): the
      # training on this pod checkpoints and moves or stops within the grace period (training/raytrain/worker/drain.py).
      lifecycle:
        preStop:
          exec:
            command: ["raytrain", "drain", "--wait", {{ sub (int $root.Values.terminationGracePeriodSeconds) (int .marginSeconds) | toString | quote }}]
      {{- end }}{{ end }}
      {{- if or $root.Values.shmSize $root.Values.sharedStorage.enabled $os.url }}
      volumeMounts:
        {{- if $root.Values.shmSize }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- if $root.Values.sharedStorage.enabled }}
        - name: shared
          mountPath: {{ $root.Values.sharedStorage.mountPath }}
        {{- end }}
        {{- if $os.url }}
        # The pod's own disk for a run in a bucket (training/raytrain/rundir/storage.py local_root: TMPDIR/raytrain-local):
        # datasets prepared per node, checkpoints staged before their upload, Ray's session files (/tmp/ray).
        - name: tmp
          mountPath: /tmp
        {{- end }}
        {{- if $gcsKey }}
        - name: gcs-credentials
          mountPath: {{ include "raytrain.gcsCredentialsDir" $root }}
          readOnly: true
        {{- end }}
      {{- end }}
  {{- if or $root.Values.shmSize $root.Values.sharedStorage.enabled $os.url }}
  volumes:
    {{- if $root.Values.shmSize }}
    # shmSize replaces the /dev/shm KubeRay adds when none is mounted (sized to the container's memory limit).
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $root.Values.shmSize }}
    {{- end }}
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
    {{- if $os.url }}
    # An exact mountPath match is all KubeRay v1.7.0 checks before adding its own emptyDirs (pod.go addEmptyDir):
    # its /dev/shm and, on an autoscaling head, its ray-logs at /tmp/ray (shared with the autoscaler sidecar, which
    # gets none of the env or mounts above) are still added; the runtime mounts /tmp/ray over this /tmp.
    - name: tmp
      emptyDir:
        sizeLimit: {{ $os.tmpSizeLimit }}
    {{- if $root.Values.historyServer.enabled }}
    # With the history server's collector KubeRay mounts a volume named ray-logs at /tmp/ray in the Ray container and
    # the collector, reusing one the pod already has (pod.go addEmptyDir): this one, so that Ray's session files and
    # spilled objects stay within the pod's disk bound instead of an unbounded emptyDir.
    - name: ray-logs
      emptyDir:
        sizeLimit: {{ $os.tmpSizeLimit }}
    {{- end }}
    {{- end }}
    {{- if $gcsKey }}
    - name: gcs-credentials
      secret:
        secretName: {{ $os.credentialsSecret }}
        items: [{key: credentials.json, path: credentials.json}]
        defaultMode: 288  # 0440: the Ray user reads it through fsGroup, nobody else
    {{- end }}
  {{- end }}
{{- end }}

{{/*
Init container of the head pod (sharedStorage.volumePermissions): gives the shared volume's root to the Ray user
once, for NFS exports owned by root (the in-tree NFS plugin ignores fsGroup). Root, but only the three
capabilities chown/chmod need, no privilege escalation, a read-only root filesystem. A root-squashing export
refuses root's chown: then it says which export settings avoid the whole step.
*/}}
{{- define "raytrain.volumePermissions" -}}
{{- $uid := int .Values.podSecurityContext.runAsUser }}
{{- $gid := int (default .Values.podSecurityContext.runAsGroup .Values.podSecurityContext.fsGroup) }}
{{- $path := .Values.sharedStorage.mountPath }}
- name: volume-permissions
  image: {{ include "raytrain.image" (dict "root" . "gpu" false) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/bin/sh", "-c"]
  args:
    - |
      owner="$(stat -c %u:%g {{ $path }})"
      if [ "$owner" = "{{ $uid }}:{{ $gid }}" ]; then echo "{{ $path }} is owned by {{ $uid }}:{{ $gid }}: nothing to do"; exit 0; fi
      if chown {{ $uid }}:{{ $gid }} {{ $path }} && chmod u+rwx,g+rwxs {{ $path }}; then
        echo "{{ $path }}: owner $owner -> {{ $uid }}:{{ $gid }}"; exit 0
      fi
      echo "cannot give {{ $path }} (owner $owner) to uid {{ $uid }}, gid {{ $gid }}: the NFS export squashes root. Export it with all_squash,anonuid={{ $uid }},anongid={{ $gid }}, or chown {{ $uid }}:{{ $gid }} the exported directory on the server, then set sharedStorage.volumePermissions.enabled=false" >&2
      exit 1
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["CHOWN", "FOWNER", "DAC_OVERRIDE"]
  resources:
    {{- include "raytrain.resources" (dict "resources" .Values.sharedStorage.volumePermissions.resources "gpus" 0) | nindent 4 }}
  volumeMounts:
    - name: shared
      mountPath: {{ $path }}
{{- end }}

{{/*
Groups placed on spot/preemptible nodes whose shutdown notice is shorter than terminationGracePeriodSeconds: there the
VM goes before the preStop drain's worst case, and a run can lose the steps since its last checkpoint. Known from the
labels each cloud puts on such nodes (in a group's nodeSelector, tolerations or required node affinity); the notice is
the VM's (GCE preemption: 30 s; Azure Scheduled Events eviction: 30 s; EC2 spot interruption: 120 s), which kubelet's
graceful node shutdown shares with system pods. As {"groups": [{key, label, provider, notice}]}.
*/}}
{{- define "raytrain.spotWindows" -}}
{{- $known := dict
  "cloud.google.com/gke-spot" (dict "provider" "GKE Spot VM" "notice" 30 "values" (list "true"))
  "cloud.google.com/gke-preemptible" (dict "provider" "GKE preemptible VM" "notice" 30 "values" (list "true"))
  "kubernetes.azure.com/scalesetpriority" (dict "provider" "AKS spot" "notice" 30 "values" (list "spot"))
  "eks.amazonaws.com/capacityType" (dict "provider" "EKS spot" "notice" 120 "values" (list "SPOT"))
  "karpenter.sh/capacity-type" (dict "provider" "Karpenter spot" "notice" 120 "values" (list "spot")) }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- $found := list }}
{{- range $g := (include "raytrain.rayGroups" . | fromJson).groups }}
{{- $v := $g.values }}
{{- $pairs := list }}
{{- range $k, $val := (default dict $v.nodeSelector) }}{{ $pairs = append $pairs (list $k (toString $val)) }}{{ end }}
{{- range $t := (default list $v.tolerations) }}{{ $pairs = append $pairs (list (toString (dig "key" "" $t)) (toString (dig "value" "" $t))) }}{{ end }}
{{- range $term := (dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list (default dict $v.affinity)) }}
{{- range $e := (default list $term.matchExpressions) }}{{ if eq (toString $e.operator) "In" }}{{ range $val := $e.values }}{{ $pairs = append $pairs (list (toString $e.key) (toString $val)) }}{{ end }}{{ end }}{{ end }}
{{- end }}
{{- $hit := "" }}
{{- range $p := $pairs }}
{{- $spot := get $known (index $p 0) }}
{{- if and $spot (not $hit) (or (eq (index $p 1) "") (has (index $p 1) $spot.values)) (lt (int $spot.notice) $grace) }}
{{- $hit = index $p 0 }}
{{- $found = append $found (dict "key" $g.key "label" $hit "provider" $spot.provider "notice" $spot.notice) }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson (dict "groups" $found) }}
{{- end }}

{{/*
Groups whose image imagePrepull pulls ahead (same shape as raytrain.workerGroups): the enabled worker groups not
in imagePrepull.skipGroups, and the head with imagePrepull.head; none unless imagePrepull.enabled.
*/}}
{{- define "raytrain.prepullGroups" -}}
{{- $p := .Values.imagePrepull }}
{{- $groups := list }}
{{- if $p.enabled }}
{{- range $g := (include "raytrain.rayGroups" . | fromJson).groups }}
{{- if eq $g.key "head" }}
{{- if $p.head }}{{ $groups = append $groups $g }}{{ end }}
{{- else if not (has $g.name (default list $p.skipGroups)) }}
{{- $groups = append $groups $g }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson (dict "groups" $groups) }}
{{- end }}
