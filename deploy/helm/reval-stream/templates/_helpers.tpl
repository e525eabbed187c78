{{/* Names and labels. */}}
{{- define "reval.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "reval.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role's pods: (dict "root" $ "role" "embed") */}}
{{- define "reval.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "reval.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "reval.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The consumer group a role's workers join (workers/service/incarnation.py:
batch_group); after `reval admin accept-topic` the groups carry a -gN suffix: set
roles.<role>.autoscaling.consumerGroup then. */}}
{{- define "reval.group" -}}
{{- $appId := default "reval" (index .root.Values.settings "REVAL_APP_ID") -}}
{{- $role := index .root.Values.roles .role -}}
{{- if $role.autoscaling.consumerGroup -}}
{{- $role.autoscaling.consumerGroup -}}
{{- else -}}
{{- printf "%s-%s-batch" $appId .role -}}
{{- end -}}
{{- end -}}

{{- define "reval.port" -}}
{{- get (dict "embed" 9101 "index" 9102 "score" 9103) . -}}
{{- end -}}

{{/* Refusals that a JSON schema cannot express, each one line naming the value and the fix. */}}
{{- define "reval.validate" -}}
{{- $owned := dict
  "REVAL_BROKER" "kafka.bootstrapServers" "REVAL_PARTITIONS" "kafka.partitions"
  "REVAL_REPLICATION" "kafka.replication" "REVAL_INPUT_RETENTION_MS" "kafka.inputRetentionMs"
  "REVAL_KAFKA_SECURITY_PROTOCOL" "kafka.securityProtocol" "REVAL_KAFKA_SASL_MECHANISM" "kafka.sasl.mechanism"
  "REVAL_KAFKA_SASL_USERNAME" "kafka.sasl.username" "REVAL_KAFKA_SSL_CAFILE" "kafka.tls.caSecret"
  "REVAL_REDIS_URL" "redis.url or redis.urlSecret" "REVAL_REDIS_CLUSTER" "redis.cluster"
  "REVAL_MODEL" "model.name" "REVAL_METRICS_PORT" "the role (9101-9103)" "REVAL_METRICS_HOST" "the chart (0.0.0.0)"
  "REVAL_DATA_DIR" "the chart (an emptyDir)" "REVAL_INDEX_DIR" "the chart (the thesaurus volume)" -}}
{{- $scopes := dict "settings" .Values.settings "roles.embed.settings" .Values.roles.embed.settings
  "roles.index.settings" .Values.roles.index.settings "roles.score.settings" .Values.roles.score.settings -}}
{{- range $scope := keys $scopes | sortAlpha -}}
{{- range $key, $_ := (index $scopes $scope | default dict) -}}
{{- if regexMatch "PASSWORD|SECRET|(^|_)TOKEN$" $key -}}
{{- fail (printf "%s.%s: a secret in values is refused; put it in a Kubernetes Secret and name that Secret in kafka.sasl.passwordSecret" $scope $key) -}}
{{- end -}}
{{- if hasKey $owned $key -}}
{{- fail (printf "%s.%s is set by the chart from %s: set that instead" $scope $key (index $owned $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if contains "@" .Values.redis.url -}}
{{- fail "redis.url holds credentials (user:password@): put the whole URL in a Kubernetes Secret and name it in redis.urlSecret" -}}
{{- end -}}
{{- $parts := int .Values.kafka.partitions -}}
{{- range $name := list "embed" "score" -}}
{{- $role := index $.Values.roles $name -}}
{{- if gt (int $role.replicas) $parts -}}
{{- fail (printf "roles.%s.replicas=%d exceeds kafka.partitions=%d: the extra workers would sit idle (a partition goes to one group member)" $name (int $role.replicas) $parts) -}}
{{- end -}}
{{- if and $role.autoscaling.enabled (gt (int $role.autoscaling.maxReplicas) $parts) -}}
{{- fail (printf "roles.%s.autoscaling.maxReplicas=%d exceeds kafka.partitions=%d: replicas beyond the partition count get no partition" $name (int $role.autoscaling.maxReplicas) $parts) -}}
{{- end -}}
{{- if and $role.autoscaling.enabled (gt (int $role.autoscaling.minReplicas) (int $role.autoscaling.maxReplicas)) -}}
{{- fail (printf "roles.%s.autoscaling.minReplicas=%d is above maxReplicas=%d" $name (int $role.autoscaling.minReplicas) (int $role.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- if and (hasPrefix "SASL" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.passwordSecret.name) -}}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.sasl.passwordSecret.name (an existing Secret; passwords are never values)" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- if and (eq (index .Values.settings "REVAL_THESAURUS_SOURCE" | default "redis") "dir") (ne .Values.roles.index.storage.accessMode "ReadWriteMany") -}}
{{- fail "settings.REVAL_THESAURUS_SOURCE=dir: scorers read the index job's volume, so roles.index.storage.accessMode must be ReadWriteMany" -}}
{{- end -}}
{{- end -}}

{{/* The environment of one role's container: (dict "root" $ "role" "embed") */}}
{{- define "reval.env" -}}
{{- $v := .root.Values -}}
{{- $role := index $v.roles .role -}}
{{- $env := dict
  "REVAL_BROKER" $v.kafka.bootstrapServers
  "REVAL_PARTITIONS" (toString $v.kafka.partitions)
  "REVAL_REPLICATION" (toString $v.kafka.replication)
  "REVAL_INPUT_RETENTION_MS" (toString (int64 $v.kafka.inputRetentionMs))
  "REVAL_KAFKA_SECURITY_PROTOCOL" $v.kafka.securityProtocol
  "REVAL_REDIS_CLUSTER" (toString $v.redis.cluster)
  "REVAL_MODEL" $v.model.name
  "REVAL_DATA_DIR" "/var/lib/reval/faust"
  "REVAL_INDEX_DIR" "/var/lib/reval/thesaurus"
  "REVAL_METRICS_HOST" "0.0.0.0"
  "REVAL_METRICS_PORT" (include "reval.port" .role)
-}}
{{- if hasPrefix "SASL" $v.kafka.securityProtocol -}}
{{- $_ := set $env "REVAL_KAFKA_SASL_MECHANISM" $v.kafka.sasl.mechanism -}}
{{- $_ := set $env "REVAL_KAFKA_SASL_USERNAME" $v.kafka.sasl.username -}}
{{- end -}}
{{- if $v.kafka.tls.caSecret -}}
{{- $_ := set $env "REVAL_KAFKA_SSL_CAFILE" "/etc/reval/kafka-ca/ca.crt" -}}
{{- end -}}
{{- if not $v.redis.urlSecret.name -}}
{{- $_ := set $env "REVAL_REDIS_URL" $v.redis.url -}}
{{- end -}}
{{- $env = merge (deepCopy ($role.settings | default dict)) (deepCopy $v.settings) $env -}}
{{- range $name := keys $env | sortAlpha }}
- name: {{ $name }}
  value: {{ index $env $name | toString | quote }}
{{- end }}
- name: HF_HUB_OFFLINE
  value: "1"
- name: XDG_CACHE_HOME
  value: /tmp/cache
{{- if $v.redis.urlSecret.name }}
- name: REVAL_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ $v.redis.urlSecret.name }}, key: {{ $v.redis.urlSecret.key }}}
{{- end }}
{{- if $v.kafka.sasl.passwordSecret.name }}
- name: REVAL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $v.kafka.sasl.passwordSecret.name }}, key: {{ $v.kafka.sasl.passwordSecret.key }}}
{{- end }}
{{- end -}}
