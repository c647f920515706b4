{{/*
Names, labels and the pieces shared by the gateway Deployment and the sidecar
templates. Every helper takes the chart's root context (`.`), or the subchart's
context (`index .Subcharts "egress-proxy"`) when called from a parent chart.
*/}}

{{- define "egress-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "egress-proxy.fullname" -}}
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

{{- define "egress-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "egress-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "egress-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "egress-proxy.labels" -}}
helm.sh/chart: {{ include "egress-proxy.chart" . }}
{{ include "egress-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "egress-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "egress-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "egress-proxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "egress-proxy.specConfigMapName" -}}
{{- if include "egress-proxy.manyEnvironments" . }}
{{- default (printf "%s-environments" (include "egress-proxy.fullname" .)) .Values.existingEnvironmentsConfigMap }}
{{- else }}
{{- default (printf "%s-spec" (include "egress-proxy.fullname" .)) .Values.existingSpecConfigMap.name }}
{{- end }}
{{- end }}

{{/*
`environments` normalised: id -> {spec, secretName}. An entry is either a spec
itself (`network:` or `allowlist:` inside) or `{spec, secretName}`; `environmentSecrets`
(id -> Secret) gives or overrides nothing but fills a missing secretName, and lists
the Secrets of environments whose specs come from `existingEnvironmentsConfigMap`.
*/}}
{{- define "egress-proxy.environmentEntries" -}}
{{- $out := dict }}
{{- $secrets := .Values.environmentSecrets | default dict }}
{{- range $id, $e := .Values.environments }}
{{- $e = $e | default dict }}
{{- if or (hasKey $e "spec") (hasKey $e "secretName") }}
{{- $_ := set $out $id (dict "spec" ($e.spec | default dict) "secretName" ($e.secretName | default (get $secrets $id) | default "")) }}
{{- else }}
{{- $_ := set $out $id (dict "spec" $e "secretName" (get $secrets $id | default "")) }}
{{- end }}
{{- end }}
{{- range $id, $secret := $secrets }}
{{- if not (hasKey $out $id) }}
{{- $_ := set $out $id (dict "spec" dict "secretName" $secret) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Non-empty when the gateway serves many environments (`--spec-dir`). */}}
{{- define "egress-proxy.manyEnvironments" -}}
{{- if or .Values.environments .Values.existingEnvironmentsConfigMap .Values.environmentSecrets }}true{{ end }}
{{- end }}

{{/* Volume name of an environment's Secret: ids may be 63 characters, volume names too. */}}
{{- define "egress-proxy.environmentSecretVolume" -}}
{{- printf "env-%s" (sha256sum . | trunc 12) }}
{{- end }}

{{/*
One environment's spec as rendered into the ConfigMap: `network.proxyToken` set to
the `${file:}` of its Secret's `proxyToken` key unless the spec sets one. Call with
(dict "root" $ "id" ID "env" ENTRY).
*/}}
{{- define "egress-proxy.environmentSpec" -}}
{{- $spec := deepCopy (.env.spec | default dict) }}
{{- $network := $spec }}
{{- if hasKey $spec "network" }}
{{- $network = $spec.network }}
{{- end }}
{{- if and .env.secretName (not (hasKey $network "proxyToken")) }}
{{- $_ := set $network "proxyToken" (printf "${file:%s/%s/proxyToken}" .root.Values.environmentSecretsMountPath .id) }}
{{- end }}
{{- toYaml $spec }}
{{- end }}

{{- define "egress-proxy.specKey" -}}
{{- if .Values.existingSpecConfigMap.name }}{{ .Values.existingSpecConfigMap.key }}{{ else }}spec.yaml{{ end }}
{{- end }}

{{- define "egress-proxy.caSecretName" -}}
{{- if and (eq .Values.ca.source "secret") (not .Values.ca.secretName) }}
{{- fail "ca.secretName is required with ca.source=secret (a kubernetes.io/tls Secret with tls.crt and tls.key)" }}
{{- end }}
{{- default (printf "%s-ca" (include "egress-proxy.fullname" .)) .Values.ca.secretName }}
{{- end }}

{{- define "egress-proxy.caConfigMapName" -}}
{{- printf "%s-ca-cert" (include "egress-proxy.fullname" .) }}
{{- end }}

{{/* Paths inside the proxy containers. */}}
{{- define "egress-proxy.paths" -}}
spec: /etc/egress-proxy/spec
ca: /etc/egress-proxy/ca
upstreamCA: /etc/egress-proxy/upstream-ca
parentAuth: /etc/egress-proxy/parent-auth
confdir: /var/lib/egress-proxy
{{- end }}

{{/*
`egress-proxy run` arguments. The spec is read from the mounted ConfigMap
*directory* (never a subPath mount), so kubelet's symlink swap on a ConfigMap
update reaches the proxy, which reloads it without a restart.
Call with (dict "root" $ "mode" "regular"|"transparent").
*/}}
{{- define "egress-proxy.runArgs" -}}
{{- $root := .root }}
{{- $p := include "egress-proxy.paths" $root | fromYaml }}
{{- $v := $root.Values -}}
- run
{{- if include "egress-proxy.manyEnvironments" $root }}
- --spec-dir
- {{ $p.spec }}
{{- else }}
- --spec
- {{ printf "%s/%s" $p.spec (include "egress-proxy.specKey" $root) }}
{{- end }}
- --mode
- {{ .mode }}
- --listen
{{- if eq .mode "transparent" }}
{{- /* Redirected connections arrive on loopback; nothing outside the pod can reach it. */}}
- {{ printf "127.0.0.1:%d" (int $v.proxy.port) | quote }}
{{- else }}
- {{ printf "0.0.0.0:%d" (int $v.proxy.port) | quote }}
{{- end }}
{{- if $v.dns.enabled }}
{{- /* DNS from the same spec (issue 11): sidecar on loopback (the redirect sends all port-53 traffic there), gateway on the pod IP behind the Service's port 53. */}}
- --dns-listen
- {{ printf "%s:%d" (ternary "127.0.0.1" "0.0.0.0" (eq .mode "transparent")) (int $v.dns.port) | quote }}
{{- end }}
- --metrics-listen
- {{ printf "0.0.0.0:%d" (int $v.proxy.metricsPort) | quote }}
- --confdir
- {{ $p.confdir }}
- --log-format
- {{ $v.proxy.logFormat }}
{{- if $v.proxy.reportOnly }}
- --report-only
{{- end }}
{{- if $v.proxy.upstreamCA.secretName }}
- --upstream-ca
- {{ printf "%s/%s" $p.upstreamCA $v.proxy.upstreamCA.key }}
{{- end }}
{{- with $v.proxy.upstreamProxy }}
{{- if .url }}
- --upstream-proxy
- {{ .url | quote }}
{{- if .authSecretName }}
- --upstream-proxy-auth
- {{ printf "${file:%s/%s}" $p.parentAuth .authKey | quote }}
{{- end }}
{{- else if .authSecretName }}
{{- fail "proxy.upstreamProxy.authSecretName needs proxy.upstreamProxy.url" }}
{{- end }}
{{- end }}
{{- range $name, $value := $v.proxy.set }}
- --set
- {{ printf "%s=%v" $name $value | quote }}
{{- end }}
{{- range $v.proxy.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Copies the CA from its Secret into the writable confdir the way mitmproxy wants
it: key and certificate in one file (mitmproxy-ca.pem), certificate alone in
mitmproxy-ca-cert.pem. mitmproxy also writes its dhparam file there.
*/}}
{{- define "egress-proxy.prepareCAContainer" -}}
{{- $root := .root }}
{{- $p := include "egress-proxy.paths" $root | fromYaml -}}
- name: prepare-ca
  image: {{ include "egress-proxy.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["/bin/sh", "-ec"]
  args:
    - >-
      umask 077;
      cat {{ $p.ca }}/tls.key {{ $p.ca }}/tls.crt > {{ $p.confdir }}/mitmproxy-ca.pem;
      cp {{ $p.ca }}/tls.crt {{ $p.confdir }}/mitmproxy-ca-cert.pem
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  resources:
    {{- toYaml $root.Values.sidecar.initResources | nindent 4 }}
  volumeMounts:
    - name: ca
      mountPath: {{ $p.ca }}
      readOnly: true
    - name: confdir
      mountPath: {{ $p.confdir }}
{{- end }}

{{/* Volume mounts of the proxy container. */}}
{{- define "egress-proxy.proxyVolumeMounts" -}}
{{- $p := include "egress-proxy.paths" . | fromYaml -}}
- name: spec
  mountPath: {{ $p.spec }}
  readOnly: true
- name: confdir
  mountPath: {{ $p.confdir }}
- name: tmp
  mountPath: /tmp
{{- if .Values.proxy.upstreamCA.secretName }}
- name: upstream-ca
  mountPath: {{ $p.upstreamCA }}
  readOnly: true
{{- end }}
{{- if and .Values.proxy.upstreamProxy.url .Values.proxy.upstreamProxy.authSecretName }}
- name: parent-auth
  mountPath: {{ $p.parentAuth }}
  readOnly: true
{{- end }}
{{- range .Values.transformSecrets }}
- name: {{ printf "secret-%s" .name | trunc 63 | trimSuffix "-" }}
  mountPath: {{ printf "%s/%s" $.Values.transformSecretsMountPath .name }}
  readOnly: true
{{- end }}
{{- range $id, $env := include "egress-proxy.environmentEntries" $ | fromYaml }}
{{- if $env.secretName }}
- name: {{ include "egress-proxy.environmentSecretVolume" $id }}
  mountPath: {{ printf "%s/%s" $.Values.environmentSecretsMountPath $id }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod volumes for the proxy (spec, CA, confdir, transform secrets). Call with
(dict "root" $ "secretMode" N): 0440 where the pod's fsGroup is the proxy's group
(gateway), 0444 where the pod is the user's (sidecar; only the proxy containers
mount these volumes, so the sandbox container still cannot read them).
*/}}
{{- define "egress-proxy.volumes" -}}
{{- $mode := .secretMode }}
{{- with .root -}}
- name: spec
  configMap:
    name: {{ include "egress-proxy.specConfigMapName" . }}
- name: ca
  secret:
    secretName: {{ include "egress-proxy.caSecretName" . }}
    defaultMode: {{ $mode }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
- name: confdir
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.proxy.upstreamCA.secretName }}
- name: upstream-ca
  secret:
    secretName: {{ .Values.proxy.upstreamCA.secretName }}
    defaultMode: 0444
{{- end }}
{{- if and .Values.proxy.upstreamProxy.url .Values.proxy.upstreamProxy.authSecretName }}
- name: parent-auth
  secret:
    secretName: {{ .Values.proxy.upstreamProxy.authSecretName }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ .Values.proxy.upstreamProxy.authKey }}
        path: {{ .Values.proxy.upstreamProxy.authKey }}
{{- end }}
{{- range .Values.transformSecrets }}
- name: {{ printf "secret-%s" .name | trunc 63 | trimSuffix "-" }}
  secret:
    secretName: {{ .name }}
    defaultMode: {{ $mode }}
{{- end }}
{{- range $id, $env := include "egress-proxy.environmentEntries" . | fromYaml }}
{{- if $env.secretName }}
- name: {{ include "egress-proxy.environmentSecretVolume" $id }}
  secret:
    secretName: {{ $env.secretName }}
    defaultMode: {{ $mode }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The proxy container. Call with (dict "root" $ "mode" ... "securityContext" ...
["restartPolicy" "Always"]).
*/}}
{{- define "egress-proxy.proxyContainer" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
- name: egress-proxy
  image: {{ include "egress-proxy.image" $root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- with .restartPolicy }}
  # A native sidecar: started before the sandbox, stopped after it.
  restartPolicy: {{ . }}
  {{- end }}
  args:
    {{- include "egress-proxy.runArgs" (dict "root" $root "mode" .mode) | nindent 4 }}
  {{- with $v.proxy.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- if eq .mode "regular" }}
    - name: proxy
      containerPort: {{ $v.proxy.port }}
      protocol: TCP
    {{- if $v.dns.enabled }}
    - name: dns-udp
      containerPort: {{ $v.dns.port }}
      protocol: UDP
    - name: dns-tcp
      containerPort: {{ $v.dns.port }}
      protocol: TCP
    {{- end }}
    {{- end }}
    - name: metrics
      containerPort: {{ $v.proxy.metricsPort }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 1
    failureThreshold: 60
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 5
    failureThreshold: 2
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  volumeMounts:
    {{- include "egress-proxy.proxyVolumeMounts" $root | nindent 4 }}
{{- end }}

{{- define "egress-proxy.scrapeAnnotations" -}}
{{- if .Values.metrics.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.proxy.metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* `environments`: gateway only, valid ids, and secrets only by reference. */}}
{{- define "egress-proxy.checkEnvironments" -}}
{{- if include "egress-proxy.manyEnvironments" . }}
{{- if ne .Values.pattern "gateway" }}
{{- fail "environments / existingEnvironmentsConfigMap: only with pattern: gateway (a sidecar serves the one environment of its pod; use `environment`)" }}
{{- end }}
{{- range $id, $env := include "egress-proxy.environmentEntries" $ | fromYaml }}
{{- if not (regexMatch "^[a-z0-9][a-z0-9._-]{0,62}$" $id) }}
{{- fail (printf "environments.%s: not a valid environment id ([a-z0-9][a-z0-9._-]{0,62})" $id) }}
{{- end }}
{{- if and $.Values.existingEnvironmentsConfigMap $env.spec }}
{{- fail (printf "environments.%s.spec: the specs come from existingEnvironmentsConfigMap; give only secretName here" $id) }}
{{- end }}
{{- if and (not $.Values.existingEnvironmentsConfigMap) (not $env.spec) }}
{{- fail (printf "environments.%s.spec: missing (an environment spec with network.allowlist)" $id) }}
{{- end }}
{{- $network := $env.spec | default dict }}
{{- if hasKey $network "network" }}{{ $network = $network.network | default dict }}{{ end }}
{{- if and (hasKey $network "proxyToken") (not (regexMatch "^\\$\\{(file|env):[^}]+\\}$" (toString $network.proxyToken))) }}
{{- fail (printf "environments.%s.spec.network.proxyToken: must be a ${file:/path} or ${env:NAME} reference; tokens never go into values or the ConfigMap" $id) }}
{{- end }}
{{- if and (not $env.secretName) (not (hasKey $network "proxyToken")) (not $.Values.existingEnvironmentsConfigMap) }}
{{- fail (printf "environments.%s: no secretName and no network.proxyToken: the environment would refuse every client" $id) }}
{{- end }}
{{- range $i, $entry := $network.allowlist | default list }}
{{- range $header, $value := $entry.transform | default dict }}
{{- if not (regexMatch "\\$\\{(file|env):" (toString $value)) }}
{{- fail (printf "environments.%s.spec.allowlist[%d].transform.%s: must reference a secret with ${file:/path} (a key of the environment's Secret) or ${env:NAME}; secrets never go into values or the ConfigMap" $id $i $header) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Fails rendering when a transform value would put a secret into the ConfigMap. */}}
{{- define "egress-proxy.checkEnvironment" -}}
{{- if and (hasKey .Values.environment "network") (hasKey .Values.environment "allowlist") }}
{{- fail "environment: has both `network` and a top-level `allowlist`; give the whole environment (network: ...) or its network part (allowlist: ...), not both" }}
{{- end }}
{{- $network := .Values.environment }}
{{- $where := "environment" }}
{{- if hasKey .Values.environment "network" }}
{{- $network = .Values.environment.network | default dict }}
{{- $where = "environment.network" }}
{{- end }}
{{- range $i, $entry := $network.allowlist | default list }}
{{- range $header, $value := $entry.transform | default dict }}
{{- if not (regexMatch "\\$\\{(file|env):" (toString $value)) }}
{{- fail (printf "%s.allowlist[%d].transform.%s: must reference a secret with ${file:/path} (a mounted transformSecrets key) or ${env:NAME}; secrets never go into values or the ConfigMap" $where $i $header) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
`ca.source: generate`: the CA as base64 `crt` and `key`. Helm generates it once:
`lookup` returns the Secret of a previous install/upgrade, which is reused, so
every replica and every upgrade keeps the one CA the sandboxes trust. The result
is memoised in the render (the Secret and the published ConfigMap must carry the
same certificate). `helm template` and `--dry-run` cannot look up and print a
fresh CA each time: use `ca.source: secret` or `certManager` with GitOps tools
that render offline.
*/}}
{{- define "egress-proxy.generatedCA" -}}
{{- if not (hasKey .Values.ca "_generated") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "egress-proxy.caSecretName" .) }}
{{- if and $existing $existing.data (index $existing.data "tls.key") }}
{{- $_ := set .Values.ca "_generated" (dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key")) }}
{{- else }}
{{- $ca := genCA .Values.ca.generate.commonName (int .Values.ca.generate.validityDays) }}
{{- $_ := set .Values.ca "_generated" (dict "crt" ($ca.Cert | b64enc) "key" ($ca.Key | b64enc)) }}
{{- end }}
{{- end }}
{{- toYaml .Values.ca._generated }}
{{- end }}
