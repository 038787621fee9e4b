{{/*
validateValues: fail early, naming the value to change and how, on what values.schema.json cannot express.
One named check per rule below; each prints its messages, one a line (nothing when the values are fine).
Two kinds: values that are wrong, and values only the installer can choose (no default works on every cluster:
where the image was pushed, where the shared volume comes from). `raytrain validate` tells the second kind by
the heading "values to choose" when it checks the chart's own values files.
*/}}
{{- define "raytrain.validateValues" -}}
{{- $checks := list "clusterName" "storageSources" "nfsServerAndPath" "imageRayVersion" "authRayVersion" "someWorkerGroup" "builtinGroupNames" "replicaBounds" "wholeCpus" "derivedRayStartParams" "shmFitsObjectStore" "scraperAdmitted" "preStopDrainMargin" "operatorPeer" "jobStopWait" "kueueOrBatchScheduler" "kueueAutoscaling" "kueuePodSets" "kueuePriorityNeedsQueue" "batchSchedulerValues" "objectStorageUrl" "objectStorageSettings" "objectStorageIdentity" "serviceAccountName" "imagePrepullGroups" "imagePrepullPullPolicy" "imagePrepullGpuPlacement" "historyServer" }}
{{- $choices := list "imageRepository" "storageSource" }}
{{- $messages := list }}
{{- range $check := $checks }}
{{- range $line := splitList "\n" (include (printf "raytrain.validateValues.%s" $check) $) }}
{{- if trim $line }}{{ $messages = append $messages (trim $line) }}{{ end }}
{{- end }}
{{- end }}
{{- $toChoose := list }}
{{- range $check := $choices }}
{{- range $line := splitList "\n" (include (printf "raytrain.validateValues.%s" $check) $) }}
{{- if trim $line }}{{ $toChoose = append $toChoose (trim $line) }}{{ end }}
{{- end }}
{{- end }}
{{- $text := "" }}
{{- if $messages }}
{{- $text = printf "\n\nraytrain-cluster: invalid values:\n  - %s\n" (join "\n  - " $messages) }}
{{- end }}
{{- if $toChoose }}
{{- $text = printf "%s\n\nraytrain-cluster: values to choose (no default works on every cluster):\n  - %s\n" $text (join "\n  - " $toChoose) }}
{{- end }}
{{- if $text }}
{{- fail $text }}
{{- end }}
{{- end }}

{{/* Nothing publishes a raytrain image: the installer names the one they pushed (values-kind.yaml: the local build). */}}
{{- define "raytrain.validateValues.imageRepository" -}}
{{- if not .Values.image.repository }}
image.repository is empty, and no registry publishes a raytrain image: push the one you build (IMAGE=registry.example.com/you/raytrain scripts/build-image --push) and --set image.repository=registry.example.com/you/raytrain (kind: -f values-kind.yaml names the local build that scripts/build-image --kind-load loads)
{{- end }}
{{- end }}

{{/*
No source: the chart would claim a ReadWriteMany volume of the cluster's default StorageClass, and the defaults of
the managed clouds are ReadWriteOnce only (EKS gp2/gp3, GKE standard-rwo, AKS managed-csi): the claim and every Ray
pod would stay Pending without a word. An explicit storageClass is the installer's statement that it is RWX-capable.
*/}}
{{- define "raytrain.validateValues.storageSource" -}}
{{- $s := .Values.sharedStorage }}
{{- if and $s.enabled (not $s.existingClaim) (not $s.nfs.server) (not $s.nfs.path) (not $s.hostPath) (not $s.storageClass) }}
{{- if .Values.objectStorage.url }}
sharedStorage is enabled with no source, and objectStorage.url keeps the runs in a bucket, which needs no shared volume: --set sharedStorage.enabled=false (or give sharedStorage a source to mount beside the bucket: sharedStorage.nfs, existingClaim or a ReadWriteMany storageClass)
{{- else }}
sharedStorage has no source, and the default StorageClass of EKS (gp2/gp3), GKE (standard-rwo) and AKS (managed-csi) cannot be mounted ReadWriteMany: the claim and every Ray pod would stay Pending. Choose one: an NFS export (--set sharedStorage.nfs.server=10.0.0.5,sharedStorage.nfs.path=/exports/raytrain; EFS, Filestore and Azure Files NFS are NFS), a ReadWriteMany PVC of yours (--set sharedStorage.existingClaim=NAME), a ReadWriteMany-capable StorageClass (--set sharedStorage.storageClass=CLASS: EKS efs-sc with the EFS CSI driver, GKE standard-rwx with Filestore, AKS an NFS-protocol Azure Files class of yours (protocol: nfs; never the SMB azurefile-csi: SMB has no hard links, which the run's lease needs)), or runs in an S3 or GCS bucket instead (--set objectStorage.url=s3://BUCKET/PREFIX,sharedStorage.enabled=false; README: Object storage)
{{- end }}
{{- end }}
{{- end }}

{{/* KubeRay requires the RayCluster name to be a DNS-1035 label. */}}
{{- define "raytrain.validateValues.clusterName" -}}
{{- $fullname := include "raytrain.fullname" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) }}
RayCluster name {{ $fullname | quote }} is not a DNS-1035 label (KubeRay requires one): pick a release name (or fullnameOverride) that starts with a letter and has only a-z, 0-9 and '-'
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.storageSources" -}}
{{- $s := .Values.sharedStorage }}
{{- if $s.enabled }}
{{- $sources := 0 }}
{{- if $s.existingClaim }}{{ $sources = add1 $sources }}{{ end }}
{{- if or $s.nfs.server $s.nfs.path }}{{ $sources = add1 $sources }}{{ end }}
{{- if $s.hostPath }}{{ $sources = add1 $sources }}{{ end }}
{{- if gt $sources 1 }}
sharedStorage: set only one of existingClaim, nfs.server/nfs.path and hostPath
{{- end }}
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.nfsServerAndPath" -}}
{{- $s := .Values.sharedStorage }}
{{- if $s.enabled }}
{{- if and $s.nfs.server (not $s.nfs.path) }}
sharedStorage.nfs.server is set but sharedStorage.nfs.path is empty: set the exported path, e.g. --set sharedStorage.nfs.path=/exports/raytrain
{{- end }}
{{- if and $s.nfs.path (not $s.nfs.server) }}
sharedStorage.nfs.path is set but neither sharedStorage.nfs.server nor sharedStorage.existingClaim is: set the NFS server, e.g. --set sharedStorage.nfs.server=10.0.0.2
{{- end }}
{{- end }}
{{- end }}

{{/* rayVersion is written once: an explicit image tag must carry the same Ray. The same rule as raytrain validate's
check_image_version (tests/chart/test_chart.py holds them together): raytrain's "<version>-ray2.60.0[-gpu]", or
rayproject/ray[-ml|-llm]:2.60.0[-...] (a team's own image named ray carries no Ray version in its tag). */}}
{{- define "raytrain.validateValues.imageRayVersion" -}}
{{- $tag := include "raytrain.imageTag" . }}
{{- $imageRay := regexFind "(^|-)ray[0-9]+[.][0-9]+[.][0-9]+" $tag | trimPrefix "-" | trimPrefix "ray" }}
{{- if and (not $imageRay) (regexMatch "(^|/)(rayproject|anyscale)/ray(-ml|-llm)?$" .Values.image.repository) }}
{{- $imageRay = regexFind "^[0-9]+[.][0-9]+[.][0-9]+" $tag }}
{{- end }}
{{- if and $imageRay (ne $imageRay (toString .Values.rayVersion)) }}
image.tag {{ $tag | quote }} carries Ray {{ $imageRay }} but rayVersion is {{ .Values.rayVersion }}: make them agree (leave image.tag empty to derive it from rayVersion)
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.authRayVersion" -}}
{{- if and .Values.auth.enabled (not (semverCompare ">=2.52.0-0" (toString .Values.rayVersion))) }}
auth.enabled needs Ray >= 2.52.0 but rayVersion is {{ .Values.rayVersion }}: raise rayVersion or set auth.enabled=false
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.someWorkerGroup" -}}
{{- if not (include "raytrain.workerGroups" . | fromJson).groups }}
no worker group is enabled: set worker.enabled=true, gpuWorker.enabled=true or add an additionalWorkerGroups entry
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.builtinGroupNames" -}}
{{- range $name := list "worker" "gpu" }}
{{- if hasKey $.Values.additionalWorkerGroups $name }}
additionalWorkerGroups.{{ $name }}: the name {{ $name | quote }} belongs to a built-in group: rename the entry
{{ end }}
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.replicaBounds" -}}
{{- range $g := (include "raytrain.workerGroups" . | fromJson).groups }}
{{- $v := $g.values }}
{{- if not (and (le (int $v.minReplicas) (int $v.replicas)) (le (int $v.replicas) (int $v.maxReplicas))) }}
{{ $g.key }}: need minReplicas <= replicas <= maxReplicas, got {{ $v.minReplicas }} <= {{ $v.replicas }} <= {{ $v.maxReplicas }}
{{ end }}
{{- end }}
{{- end }}

{{/* The schema checks the shape; this names the group when values came through --set as another type. */}}
{{- define "raytrain.validateValues.wholeCpus" -}}
{{- range $g := (include "raytrain.workerGroups" . | fromJson).groups }}
{{- if not (regexMatch "^[1-9][0-9]*$" (toString $g.values.resources.cpu)) }}
{{ $g.key }}.resources.cpu is {{ $g.values.resources.cpu }}: use a whole number of CPUs so that Ray's num-cpus equals the limit
{{ end }}
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.derivedRayStartParams" -}}
{{- range $g := (include "raytrain.workerGroups" . | fromJson).groups }}
{{- range $param := list "num-cpus" "num-gpus" }}
{{- if hasKey (default dict $g.values.rayStartParams) $param }}
{{ $g.key }}.rayStartParams.{{ $param }} is set: remove it, the chart derives it from {{ $g.key }}.resources/gpus so Ray and Kubernetes agree
{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A shmSize of our own replaces the /dev/shm KubeRay would size to the memory limit (pod.go addEmptyDir), so it must
hold the object store Ray 2.60 creates there: 30% of the node's memory, at most 200 GB, or rayStartParams
object-store-memory (ray/_private/utils.py resolve_object_store_memory). Smaller, Ray puts the store in /tmp
("This will harm performance").
*/}}
{{- define "raytrain.validateValues.shmFitsObjectStore" -}}
{{- with .Values.shmSize }}
{{- $shm := include "raytrain.bytes" . | float64 }}
{{- range $g := (include "raytrain.rayGroups" $ | fromJson).groups }}
{{- $store := include "raytrain.objectStoreBytes" $g.values | float64 }}
{{- if lt $shm $store }}
shmSize {{ $.Values.shmSize }} is below the object store Ray creates in /dev/shm on {{ $g.key }} ({{ include "raytrain.humanBytes" $store }}: 30% of its memory {{ $g.values.resources.memory }}, or its object-store-memory): raise shmSize to at least {{ include "raytrain.humanBytes" $store }}, or leave shmSize empty so that KubeRay sizes /dev/shm to each group's memory limit
{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A PodMonitor's scraper must get through the NetworkPolicy to port 8080. */}}
{{- define "raytrain.validateValues.scraperAdmitted" -}}
{{- $m := .Values.metrics }}
{{- if and $m.podMonitor.enabled .Values.networkPolicy.enabled (not $m.prometheus.namespace) (not $m.allowFrom) }}
metrics.podMonitor.enabled with networkPolicy.enabled needs the scraper admitted to port 8080: set metrics.prometheus.namespace (and metrics.prometheus.podLabels) to your Prometheus, or list it in metrics.allowFrom
{{- end }}
{{- end }}

{{/* Kubernetes quantity -> bytes (a float), for comparisons; the schema has checked the syntax. */}}
{{/* The preStop hook waits terminationGracePeriodSeconds - marginSeconds: it needs a second at least. */}}
{{- define "raytrain.validateValues.preStopDrainMargin" -}}
{{- if and .Values.preStopDrain.enabled (le (int .Values.terminationGracePeriodSeconds) (int .Values.preStopDrain.marginSeconds)) }}
preStopDrain.marginSeconds ({{ .Values.preStopDrain.marginSeconds }}) must be below terminationGracePeriodSeconds ({{ .Values.terminationGracePeriodSeconds }}): the hook waits the difference. Raise terminationGracePeriodSeconds or lower the margin (or set preStopDrain.enabled=false)
{{- end }}
{{- end }}

{{- define "raytrain.bytes" -}}
{{- $q := toString . }}
{{- $number := regexFind "^[0-9]+([.][0-9]+)?" $q }}
{{- $unit := trimPrefix $number $q }}
{{- $units := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 }}
{{- printf "%.0f" (mulf (float64 $number) (get $units $unit)) }}
{{- end }}

{{- define "raytrain.humanBytes" -}}
{{- printf "%.0fMi" (ceil (divf (float64 .) 1048576.0)) }}
{{- end }}

{{/* Bytes Ray 2.60 gives the object store of a group (its values): rayStartParams object-store-memory, else 30% of memory capped at 200 GB. */}}
{{- define "raytrain.objectStoreBytes" -}}
{{- $explicit := dig "object-store-memory" "" (default dict .rayStartParams) }}
{{- if $explicit }}
{{- printf "%.0f" (float64 $explicit) }}
{{- else }}
{{- printf "%.0f" (minf (mulf 0.3 (include "raytrain.bytes" .resources.memory | float64)) 200e9) }}
{{- end }}
{{- end }}

{{/* An operator peer with neither a namespace nor pod labels would admit every pod of the cluster to the dashboard. */}}
{{- define "raytrain.validateValues.operatorPeer" -}}
{{- $np := .Values.networkPolicy }}
{{- if and $np.enabled (not $np.operatorNamespace) (not $np.operatorPodLabels) }}
networkPolicy.operatorPodLabels is empty and networkPolicy.operatorNamespace too: that admits every pod of every namespace to the dashboard. Set operatorPodLabels to the KubeRay operator's pod labels (its chart: app.kubernetes.io/name: kuberay-operator)
{{- end }}
{{- end }}

{{/* raytrain's driver takes up to RAYTRAIN_STOP_GRACE_S (20 s) to checkpoint and end after SIGTERM: a shorter wait
SIGKILLs it mid-checkpoint, and its lease is then only taken over after its TTL. */}}
{{- define "raytrain.validateValues.jobStopWait" -}}
{{- if le (int .Values.jobStopWaitSeconds) 20 }}
jobStopWaitSeconds ({{ .Values.jobStopWaitSeconds }}) must be above 20: a stopped run takes up to 20 s (RAYTRAIN_STOP_GRACE_S) to checkpoint and end after SIGTERM before Ray's SIGKILL. Raise it (default 30)
{{- end }}
{{- end }}

{{/* Two queues would each admit the cluster on their own terms: Kueue by suspending it, the batch scheduler by its pods. */}}
{{- define "raytrain.validateValues.kueueOrBatchScheduler" -}}
{{- if and .Values.kueue.queueName .Values.batchScheduler.name }}
kueue.queueName and batchScheduler.name are both set: Kueue queues and admits the whole RayCluster, and {{ .Values.batchScheduler.name }} would queue its pods again against its own queues; use one: --set batchScheduler.name="" (Kueue), or --set kueue.queueName="" ({{ .Values.batchScheduler.name }})
{{- end }}
{{- end }}

{{/* kubernetes-sigs/kueue pkg/controller/jobs/raycluster/raycluster_webhook.go validateCreate (lines 145-157): a
Kueue-managed RayCluster may autoscale only as an elastic job (annotation kueue.x-k8s.io/elastic-job, feature gate
ElasticJobsViaWorkloadSlices: beta, on by default since Kueue v0.18), which the chart does not make. */}}
{{- define "raytrain.validateValues.kueueAutoscaling" -}}
{{- if and .Values.kueue.queueName .Values.autoscaling.enabled }}
kueue.queueName is set with autoscaling.enabled=true: Kueue refuses autoscaling on a RayCluster it manages (it admits a fixed size, the replicas of every group); --set autoscaling.enabled=false and size the groups with replicas
{{- end }}
{{- end }}

{{/* raycluster_webhook.go validateCreate (lines 159-162): a Kueue workload holds at most 18 pod sets
(jobframework/constants.go MaxPodSets, Kueue v0.19 and later; v0.18: 10, earlier: 8), the head's and one per worker
group. */}}
{{- define "raytrain.validateValues.kueuePodSets" -}}
{{- if .Values.kueue.queueName }}
{{- $count := len (include "raytrain.workerGroups" . | fromJson).groups }}
{{- if gt (add1 $count) 18 }}
kueue.queueName is set with {{ $count }} worker groups: a Kueue workload holds at most 18 pod sets, the head's and one per worker group; disable worker groups down to 17
{{- end }}
{{- if hasKey .Values.additionalWorkerGroups "head" }}
additionalWorkerGroups.head: Kueue reserves the name "head" for the head group's pod set (raycluster_webhook.go validateCreate); rename the entry
{{- end }}
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.kueuePriorityNeedsQueue" -}}
{{- if and .Values.kueue.priorityClass (not .Values.kueue.queueName) }}
kueue.priorityClass is set without kueue.queueName: only a queued workload has a Kueue priority; --set kueue.queueName=<your LocalQueue>
{{- end }}
{{- end }}

{{/* KubeRay v1.7.0 batchscheduler/: only Volcano reads ray.io/priority-class-name; a queue needs a scheduler to read it. */}}
{{- define "raytrain.validateValues.batchSchedulerValues" -}}
{{- $b := .Values.batchScheduler }}
{{- if and $b.queue (not $b.name) }}
batchScheduler.queue is set without batchScheduler.name: no scheduler reads it; --set batchScheduler.name=volcano (or yunikorn), the one the KubeRay operator was started with
{{- end }}
{{- if and $b.priorityClassName (ne $b.name "volcano") }}
batchScheduler.priorityClassName is read by Volcano only (KubeRay's ray.io/priority-class-name label), not by {{ default "the default scheduler" $b.name }}; remove it, or --set batchScheduler.name=volcano
{{- end }}
{{- end }}

{{/*
objectStorage.url in the shape training/raytrain/rundir/storage.py url_problem accepts (tests/chart/test_chart.py holds the two
to the same table): s3:// or gs://, a bucket name the store accepts, a prefix without empty, '.' or '..' parts.
*/}}
{{- define "raytrain.validateValues.objectStorageUrl" -}}
{{- with .Values.objectStorage.url }}
{{- $scheme := regexFind "^[A-Za-z][A-Za-z0-9+.-]*:" . | trimSuffix ":" | lower }}
{{- /* the names the store refuses at CreateBucket (storage.py bucket_problem) */}}
{{- $bucket := regexReplaceAll "^[a-z0-9]+://([^/]*).*$" . "${1}" }}
{{- $bucketRefused := "" }}
{{- if contains ".." $bucket }}{{ $bucketRefused = "the bucket name has two periods in a row" }}
{{- else if regexMatch "^[0-9]{1,3}([.][0-9]{1,3}){3}$" $bucket }}{{ $bucketRefused = "the bucket name is written as an IP address" }}
{{- else if and (hasPrefix "s3://" .) (or (regexMatch "^(xn--|sthree-|amzn-s3-demo-)" $bucket) (regexMatch "(--ol-s3|[.]mrap|--table-s3)$" $bucket)) }}{{ $bucketRefused = "S3 keeps bucket names with that prefix or suffix for itself" }}
{{- else if and (hasPrefix "gs://" .) (regexMatch "[^.]{64}" $bucket) }}{{ $bucketRefused = "a dot-separated part of the bucket name is longer than 63 characters" }}
{{- else if and (hasPrefix "gs://" .) (or (hasPrefix "goog" $bucket) (contains "google" $bucket)) }}{{ $bucketRefused = "GCS keeps bucket names beginning with 'goog' or holding 'google' for Google" }}
{{- end }}
{{- if has $scheme (list "az" "abfs" "abfss" "wasb" "wasbs" "azure") }}
objectStorage.url {{ . | quote }}: Azure Blob Storage has no S3 API, and raytrain reaches only s3:// and gs:// buckets. On AKS keep the runs on the shared volume (--set objectStorage.url="",sharedStorage.storageClass=<an NFS-protocol Azure Files class>), or put an S3-compatible gateway in front of the storage account and --set objectStorage.url=s3://BUCKET/PREFIX,objectStorage.endpoint=http://GATEWAY:PORT
{{- else if not (regexMatch "^(s3|gs)://" .) }}
objectStorage.url {{ . | quote }} is not an s3:// or gs:// URL: --set objectStorage.url=s3://BUCKET/PREFIX (or gs://BUCKET/PREFIX; lower case, two slashes), e.g. s3://my-bucket/runs
{{- else if not (regexMatch "^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]|gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/|$)" .) }}
objectStorage.url {{ . | quote }}: the bucket name must be 3-63 characters of a-z, 0-9, '.' and '-' (on gs:// also '_', and up to 222 with dots) that start and end with a letter or digit: --set objectStorage.url=s3://BUCKET/PREFIX, e.g. s3://my-bucket/runs
{{- else if $bucketRefused }}
objectStorage.url {{ . | quote }}: {{ $bucketRefused }}, so no bucket has that name: --set objectStorage.url=s3://BUCKET/PREFIX with your bucket's name, e.g. s3://my-bucket/runs
{{- else if or (contains "//" (regexReplaceAll "^[a-z0-9]+://" . "")) (regexMatch "/[.]{1,2}(/|$)" .) (regexMatch "[[:cntrl:]]" .) }}
objectStorage.url {{ . | quote }}: its prefix has an empty, '.', '..' or control-character part, which an object store keeps as a literal key: write every part out, --set objectStorage.url=s3://BUCKET/PREFIX, e.g. s3://my-bucket/runs
{{- end }}
{{- end }}
{{- end }}

{{/* The settings beside objectStorage.url: each has a use only with it, endpoint and region only with s3://. */}}
{{- define "raytrain.validateValues.objectStorageSettings" -}}
{{- $os := .Values.objectStorage }}
{{- $scheme := include "raytrain.objectStorageScheme" . }}
{{- range $key := list "endpoint" "region" "credentialsSecret" }}
{{- if and (get $os $key) (not $os.url) }}
objectStorage.{{ $key }} is set but objectStorage.url is empty, so nothing uses it: --set objectStorage.url=s3://BUCKET/PREFIX (the bucket your RayJobs pass as --storage), or remove objectStorage.{{ $key }}
{{ end }}
{{- end }}
{{- if eq $scheme "gs" }}
{{- range $key := list "endpoint" "region" }}
{{- if get $os $key }}
objectStorage.{{ $key }} is read only for s3:// (as {{ ternary "AWS_ENDPOINT_URL" "AWS_DEFAULT_REGION" (eq $key "endpoint") }}) and objectStorage.url is gs://: remove it (gcsfs finds a GCS bucket itself)
{{ end }}
{{- end }}
{{- end }}
{{- with $os.endpoint }}
{{- if not (regexMatch "^https?://[^/[:space:]]+(/[^[:space:]]*)?$" .) }}
objectStorage.endpoint {{ . | quote }} is not an http:// or https:// URL: write it as AWS_ENDPOINT_URL is read, scheme and host[:port], e.g. --set objectStorage.endpoint=http://minio.minio.svc:9000
{{- end }}
{{- end }}
{{- end }}

{{/* A key in a Secret and a pod identity for the same bucket: the SDK takes the Secret's and the identity is never
used (botocore's credential chain reads AWS_ACCESS_KEY_ID before the IRSA web identity token; google-auth reads
GOOGLE_APPLICATION_CREDENTIALS before the metadata server); annotations only a created ServiceAccount carries. */}}
{{- define "raytrain.validateValues.objectStorageIdentity" -}}
{{- $os := .Values.objectStorage }}
{{- $sa := .Values.serviceAccount }}
{{- $annotations := default dict $sa.annotations }}
{{- $scheme := include "raytrain.objectStorageScheme" . }}
{{- $identity := ternary "eks.amazonaws.com/role-arn" "iam.gke.io/gcp-service-account" (eq $scheme "s3") }}
{{- if and $os.credentialsSecret $sa.create (hasKey $annotations $identity) }}
objectStorage.credentialsSecret and serviceAccount.annotations {{ $identity }} are both set: the SDK uses the Secret's key and the pod identity never: keep one, --set objectStorage.credentialsSecret="" (the identity) or remove the annotation (the Secret)
{{- end }}
{{- if and $annotations (not $sa.create) }}
serviceAccount.annotations are set but serviceAccount.create is false, so no ServiceAccount carries them: --set serviceAccount.create=true (the chart creates it), or annotate your own ServiceAccount and --set serviceAccount.name=NAME
{{- end }}
{{- end }}

{{- define "raytrain.validateValues.serviceAccountName" -}}
{{- with include "raytrain.serviceAccountName" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9.]*[a-z0-9])?$" .) }}
serviceAccount.name {{ . | quote }} is not a ServiceAccount name KubeRay keeps: start with a letter, then only a-z, 0-9, '-' and '.'
{{- else if gt (len .) 50 }}
serviceAccount.name {{ . | quote }} has {{ len . }} characters: with autoscaling on, KubeRay v1.7.0 cuts a head ServiceAccount name over 50 from its front (utils.CheckName) and the head would run under another one; pick a name of at most 50
{{- end }}
{{- end }}
{{- end }}

{{/* imagePrepull: what it skips must be a group it would prepull, and something must be left to prepull; a head
DaemonSet and an additionalWorkerGroups entry named "head" would both be <release>-prepull-head. */}}
{{- define "raytrain.validateValues.imagePrepullGroups" -}}
{{- $p := .Values.imagePrepull }}
{{- if $p.enabled }}
{{- $names := list }}
{{- range $g := (include "raytrain.workerGroups" . | fromJson).groups }}{{ $names = append $names $g.name }}{{ end }}
{{- range $name := (default list $p.skipGroups) }}
{{- if not (has $name $names) }}
imagePrepull.skipGroups names {{ $name | quote }}, which is no enabled worker group (enabled: {{ join ", " $names }}): remove it from the list (the head is prepulled only with imagePrepull.head=true)
{{ end }}
{{- end }}
{{- if not (include "raytrain.prepullGroups" . | fromJson).groups }}
imagePrepull.enabled is true but imagePrepull.skipGroups skips every enabled worker group and imagePrepull.head is false: nothing is prepulled; --set imagePrepull.enabled=false, or take a group out of imagePrepull.skipGroups
{{ end }}
{{- if and $p.head (hasKey .Values.additionalWorkerGroups "head") (not (has "head" (default list $p.skipGroups))) }}
imagePrepull.head and additionalWorkerGroups.head would both be prepulled by a DaemonSet named {{ include "raytrain.fullname" . }}-prepull-head: rename the entry, or --set imagePrepull.head=false
{{ end }}
{{- end }}
{{- end }}

{{/* Never: kubelet never pulls, so a holder pod on a node without the image fails with ErrImageNeverPull. */}}
{{- define "raytrain.validateValues.imagePrepullPullPolicy" -}}
{{- if and .Values.imagePrepull.enabled (eq (toString .Values.image.pullPolicy) "Never") }}
imagePrepull.enabled with image.pullPolicy=Never: kubelet never pulls the image, so there is nothing to prepull (the holder pods fail with ErrImageNeverPull where the image is missing); --set image.pullPolicy=IfNotPresent, or --set imagePrepull.enabled=false
{{- end }}
{{- end }}

{{/*
A GPU group's pods land on GPU nodes by their nvidia.com/gpu limit alone unless a nodeSelector or required node
affinity says more; its DaemonSet requests no GPU, so it would run (and pull the -gpu image, the largest) on every
node the group's tolerations admit, CPU nodes included.
*/}}
{{- define "raytrain.validateValues.imagePrepullGpuPlacement" -}}
{{- range $g := (include "raytrain.prepullGroups" . | fromJson).groups }}
{{- $v := $g.values }}
{{- $required := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list (default dict $v.affinity) }}
{{- if and (gt (int $g.gpus) 0) (not $v.nodeSelector) (not $required) }}
imagePrepull: {{ $g.key }} has no nodeSelector or required node affinity (its pods reach GPU nodes by their nvidia.com/gpu limit alone), so its DaemonSet, which requests no GPU, would pull the -gpu image onto every node its tolerations admit, CPU nodes included: set {{ $g.key }}.nodeSelector to your GPU nodes' label (GKE: cloud.google.com/gke-accelerator: <accelerator>; NVIDIA GPU Feature Discovery: nvidia.com/gpu.present: "true"), or --set imagePrepull.skipGroups={ {{- $g.name -}} }
{{ end }}
{{- end }}
{{- end }}

{{/* historyServer: what KubeRay v1.7.0 refuses in collectorOptions (utils/validation.go validateCollectorOptions,
held together with the validator's check_collector_options by tests/chart), and a backend the collector does not
know, which KubeRay lets through and the collector exits on at its start (historyserver/pkg/collector/registry.go). */}}
{{- define "raytrain.validateValues.historyServer" -}}
{{- $h := .Values.historyServer }}
{{- if $h.enabled }}
{{- if not $h.collector.image }}
historyServer.enabled needs historyServer.collector.image, the collector KubeRay publishes with its release: e.g. --set historyServer.collector.image=quay.io/kuberay/collector:v1.7.0
{{- end }}
{{- $env := dict }}
{{- range $h.collector.env }}{{ $_ := set $env .name . }}{{ end }}
{{- range $name := list "POD_IP" "FQ_RAY_IP" "RAY_CLUSTER_NAME" "RAY_CLUSTER_NAMESPACE" "RAY_ROLE" "OWNER_KIND" "OWNER_NAME" "EVENTS_PORT" }}
{{- if hasKey $env $name }}
historyServer.collector.env sets {{ $name }}, which KubeRay sets on the collector itself and refuses from you: remove it
{{- end }}
{{- end }}
{{- $has := dict }}
{{- range $name, $var := $env }}{{ if or $var.value $var.valueFrom }}{{ $_ := set $has $name true }}{{ end }}{{ end }}
{{- $backend := upper (toString (((get $env "STORAGE_BACKEND") | default dict).value | default "")) }}
{{- $needs := list }}
{{- if not $backend }}
historyServer.collector.env has no STORAGE_BACKEND with a literal value (KubeRay reads no valueFrom for it): add {name: STORAGE_BACKEND, value: S3} (or GCS, AZUREBLOB, ALIYUNOSS) and what that backend needs
{{- else if eq $backend "S3" }}{{ $needs = list "S3_REGION" "S3_BUCKET" }}
{{- else if eq $backend "GCS" }}{{ $needs = list "GCS_BUCKET" }}
{{- else if eq $backend "ALIYUNOSS" }}{{ $needs = list "OSS_BUCKET" "OSS_ENDPOINT" "OSS_REGION" }}
{{- else if eq $backend "AZUREBLOB" }}
{{- $mode := lower (trim (toString (((get $env "AZURE_STORAGE_AUTH_MODE") | default dict).value | default ""))) }}
{{- if eq $mode "connection_string" }}{{ $needs = list "AZURE_STORAGE_CONNECTION_STRING" }}
{{- else if or (eq $mode "workload_identity") (eq $mode "default") }}{{ $needs = list "AZURE_STORAGE_ACCOUNT_URL" }}
{{- else if not (or (hasKey $has "AZURE_STORAGE_CONNECTION_STRING") (hasKey $has "AZURE_STORAGE_ACCOUNT_URL")) }}
historyServer.collector.env: STORAGE_BACKEND AZUREBLOB needs AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL: add one of them
{{- end }}
{{- else }}
historyServer.collector.env: STORAGE_BACKEND {{ $backend | quote }} is none the collector knows (it exits at its start): use S3, GCS, AZUREBLOB or ALIYUNOSS
{{- end }}
{{- range $name := $needs }}
{{- if not (hasKey $has $name) }}
historyServer.collector.env: STORAGE_BACKEND {{ $backend }} needs {{ $name }}{{ if eq $name "S3_BUCKET" }} (without it the collector writes to a bucket named ray-historyserver, a global name anyone may own){{ end }}: add it (a value, or valueFrom a Secret)
{{- end }}
{{- end }}
{{- /* The collector finds Ray's session in /tmp/ray and the dashboard on 8265 (historyserver/pkg/utils); elsewhere it
exits after a minute, its pod stays NotReady, and a clusterSelector RayJob waits for a ready cluster forever. */}}
{{- range $g := (include "raytrain.rayGroups" . | fromJson).groups }}
{{- $params := default dict $g.values.rayStartParams }}
{{- if hasKey $params "temp-dir" }}
{{ $g.key }}.rayStartParams.temp-dir moves Ray's session out of /tmp/ray, where KubeRay's history server collector looks for it: remove it, or set historyServer.enabled=false
{{- end }}
{{- range $g.values.env }}{{ if has .name (list "TMPDIR" "RAY_TMPDIR") }}
{{ $g.key }}.env sets {{ .name }}, which moves Ray's session out of /tmp/ray, where KubeRay's history server collector looks for it: remove it, or set historyServer.enabled=false
{{- end }}{{ end }}
{{- end }}
{{- if hasKey (default dict .Values.head.rayStartParams) "dashboard-port" }}
head.rayStartParams.dashboard-port moves the dashboard off 8265, where KubeRay's history server collector asks it for its node: remove it, or set historyServer.enabled=false
{{- end }}
{{- end }}
{{- end }}
