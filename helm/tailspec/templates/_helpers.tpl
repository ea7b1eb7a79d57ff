{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "tailspec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart> unless the release name already contains the chart name. RayJob names feed the
generated RayCluster/Service names, so keep it short (40 characters).
*/}}
{{- define "tailspec.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tailspec.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels selecting this release's pods (the PodMonitors use them with ray.io/node-type). */}}
{{- define "tailspec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailspec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tailspec.labels" -}}
helm.sh/chart: {{ include "tailspec.chart" . }}
{{ include "tailspec.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tailspec
{{- end }}

{{- define "tailspec.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- end }}

{{- define "tailspec.configMapName" -}}
{{- printf "%s-config" (include "tailspec.fullname" .) }}
{{- end }}

{{- define "tailspec.runDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.job.runsDir) (include "tailspec.fullname" .) }}
{{- end }}

{{/* The job's command line: the main job on the mounted run config, joining the RayJob's cluster. */}}
{{- define "tailspec.entrypoint" -}}
{{- $args := list "python" "-m" .Values.job.module "train" "--config" "/etc/tailspec/config.yaml" "--run-dir" (include "tailspec.runDir" .) "ray.address=auto" }}
{{- if not (kindIs "invalid" .Values.job.steps) }}
{{- $args = append $args (printf "trainer.steps=%d" (int .Values.job.steps)) }}
{{- end }}
{{- range .Values.job.extraArgs }}
{{- $args = append $args (squote (toString .)) }}
{{- end }}
{{- join " " $args }}
{{- end }}

{{/* Environment of every Ray container. */}}
{{- define "tailspec.env" -}}
{{- range $k, $v := .Values.env }}
- name: {{ $k }}
  value: {{ toString $v | quote }}
{{- end }}
{{- end }}
