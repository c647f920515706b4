{{/*
The sidecar / transparent pattern: the proxy beside a sandbox container in one
pod. Include these in your own pod spec (from a parent chart, pass the subchart
context: `index .Subcharts "egress-proxy"`):

  initContainers:
    {{- include "egress-proxy.sidecar.initContainers" $egress | nindent 4 }}
  containers:
    - name: sandbox            # must NOT run as sidecar.proxyUid
      ...
    {{- include "egress-proxy.sidecar.containers" $egress | nindent 4 }}
  volumes:
    {{- include "egress-proxy.sidecar.volumes" $egress | nindent 4 }}

Init containers, in order:
  1. prepare-ca: copies the CA from its Secret into the proxy's confdir.
  2. redirect-rules: `egress-proxy redirect-rules --apply` loads nftables rules
     into the pod's network namespace that send every TCP connection of the pod
     to the proxy port, except the proxy's own (by UID), send all DNS (UDP and
     TCP port 53, any address) to the proxy's DNS listener (`dns.enabled`; or,
     with it off, allow DNS to `sidecar.dnsServers` only), and drop other traffic. nft needs CAP_NET_ADMIN *effective*,
     which Kubernetes grants only to root (it sets no ambient capabilities), so
     this one container runs as UID 0 with every capability dropped but
     NET_ADMIN, no privilege escalation and a read-only root filesystem. It
     exits before the sandbox starts; the sandbox gets no capability.
  3. egress-proxy (native sidecar, `sidecar.native: true`): `egress-proxy run
     --mode transparent` as `sidecar.proxyUid`; it must be ready (startupProbe)
     before the sandbox container starts.
*/}}

{{- define "egress-proxy.sidecar.dnsServers" -}}
{{- $dns := .Values.sidecar.dnsServers }}
{{- if not $dns }}
{{- $svc := lookup "v1" "Service" "kube-system" "kube-dns" }}
{{- if and $svc $svc.spec $svc.spec.clusterIP }}
{{- $dns = list $svc.spec.clusterIP }}
{{- end }}
{{- end }}
{{- if not $dns }}
{{- fail "sidecar.dnsServers is required: the cluster DNS Service IP(s) the sandbox may query (kubectl -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}'); it is looked up only on a live install" }}
{{- end }}
{{- toYaml $dns }}
{{- end }}

{{/* `egress-proxy redirect-rules` arguments (without --apply): also what tests compare with the CLI. */}}
{{- define "egress-proxy.sidecar.redirectArgs" -}}
- redirect-rules
- --proxy-port
- {{ .Values.proxy.port | quote }}
- --proxy-uid
- {{ .Values.sidecar.proxyUid | quote }}
{{- with .Values.sidecar.proxyMark }}
- --proxy-mark
- {{ . | quote }}
{{- end }}
{{- if .Values.dns.enabled }}
- --dns-port
- {{ .Values.dns.port | quote }}
{{- else }}
{{- range include "egress-proxy.sidecar.dnsServers" . | fromYamlArray }}
- --dns
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "egress-proxy.sidecar.securityContext" -}}
{{- $uid := int .Values.sidecar.proxyUid }}
{{- toYaml (merge (dict "runAsUser" $uid "runAsGroup" $uid "runAsNonRoot" true) (deepCopy .Values.securityContext)) }}
{{- end }}

{{- define "egress-proxy.sidecar.initContainers" -}}
{{- $sc := include "egress-proxy.sidecar.securityContext" . | fromYaml }}
{{- include "egress-proxy.prepareCAContainer" (dict "root" . "securityContext" $sc) }}
- name: redirect-rules
  image: {{ include "egress-proxy.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    {{- include "egress-proxy.sidecar.redirectArgs" . | nindent 4 }}
    - --apply
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["NET_ADMIN"]
    seccompProfile:
      type: RuntimeDefault
  resources:
    {{- toYaml .Values.sidecar.initResources | nindent 4 }}
{{- if .Values.sidecar.native }}
{{ include "egress-proxy.proxyContainer" (dict "root" . "mode" "transparent" "securityContext" $sc "restartPolicy" "Always") }}
{{- end }}
{{- end }}

{{- define "egress-proxy.sidecar.containers" -}}
{{- if not .Values.sidecar.native -}}
{{- $sc := include "egress-proxy.sidecar.securityContext" . | fromYaml }}
{{- include "egress-proxy.proxyContainer" (dict "root" . "mode" "transparent" "securityContext" $sc) }}
{{- end }}
{{- end }}

{{- define "egress-proxy.sidecar.volumes" -}}
{{- include "egress-proxy.volumes" (dict "root" . "secretMode" "0444") }}
{{- end }}

{{/* The CA certificate for the sandbox container to trust (mount at e.g. /etc/egress-proxy/ca-cert). */}}
{{- define "egress-proxy.sidecar.caCertVolume" -}}
- name: egress-proxy-ca-cert
  configMap:
    name: {{ include "egress-proxy.caConfigMapName" . }}
{{- end }}
