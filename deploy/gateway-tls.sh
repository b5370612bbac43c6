#!/usr/bin/env bash
# The certificate of the gateway's ingress: the Secret fleet-system/fleet-gateway-tls (type
# kubernetes.io/tls, with ca.crt: the certificate clients must trust), made once and then kept.
# install.sh runs this when its overlay's Ingress names that Secret (overlays/k3s does).
#
# Usage:  FLEET_GATEWAY_HOST=llm.example.com deploy/gateway-tls.sh
#
#   FLEET_GATEWAY_HOST  the name or IP address clients reach the gateway by; the certificate is
#                       for it, localhost and 127.0.0.1 (default: localhost)
#   FLEET_TLS_ISSUER    auto (default): cert-manager when its CRDs are installed, else openssl;
#                       cert-manager: a self-signed ClusterIssuer (fleet-selfsigned) and a
#                       Certificate, which cert-manager also renews; openssl: a self-signed
#                       P-256 certificate valid 397 days, made here
#   KUBECTL             the kubectl command (default: kubectl)
#
# Self-signed either way: clients must be given ca.crt (curl --cacert, SSL_CERT_FILE), or you
# replace the Secret with a certificate they already trust; an existing Secret is never touched.
# The private key goes from openssl to the Secret through a private temporary directory (0700,
# removed on exit), never through argv or the terminal.
set -euo pipefail

host="${FLEET_GATEWAY_HOST:-localhost}"
issuer="${FLEET_TLS_ISSUER:-auto}"
secret=fleet-gateway-tls
read -r -a kubectl <<<"${KUBECTL:-kubectl}"

say() { echo "gateway-tls: $*" >&2; }
k() { "${kubectl[@]}" "$@"; }

if [[ ! $host =~ ^[A-Za-z0-9.:-]+$ ]]; then
  say "FLEET_GATEWAY_HOST=$host is not a host name or IP address"
  exit 1
fi
if k -n fleet-system get secret "$secret" >/dev/null 2>&1; then
  say "keeping fleet-system/$secret"
  exit 0
fi
has_cert_manager() { k get crd certificates.cert-manager.io >/dev/null 2>&1; }
if [[ $issuer == auto ]]; then
  if has_cert_manager; then issuer=cert-manager; else issuer=openssl; fi
fi
is_ip() { [[ $1 =~ ^[0-9.]+$ || $1 == *:* ]]; }
names=("$host")
for extra in localhost 127.0.0.1; do [[ $extra == "$host" ]] || names+=("$extra"); done

with_openssl() {
  local san="" name
  for name in "${names[@]}"; do
    if is_ip "$name"; then san+="${san:+,}IP:$name"; else san+="${san:+,}DNS:$name"; fi
  done
  dir="$(mktemp -d)"
  trap 'rm -rf "${dir:-}"' EXIT  # global: the trap runs after this function returns
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 397 \
    -subj "/CN=$host" -addext "subjectAltName=$san" -addext "extendedKeyUsage=serverAuth" \
    -keyout "$dir/tls.key" -out "$dir/tls.crt"
  k -n fleet-system create secret generic "$secret" --type=kubernetes.io/tls \
    --from-file=tls.crt="$dir/tls.crt" --from-file=tls.key="$dir/tls.key" \
    --from-file=ca.crt="$dir/tls.crt" >/dev/null
}

with_cert_manager() {
  local name dns="" ips=""
  if ! has_cert_manager; then
    say "FLEET_TLS_ISSUER=cert-manager, but cert-manager is not installed (no certificates.cert-manager.io CRD)"
    exit 1
  fi
  for name in "${names[@]}"; do
    if is_ip "$name"; then ips+="\"$name\", "; else dns+="\"$name\", "; fi
  done
  k apply -f - >/dev/null <<YAML
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: fleet-selfsigned}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: fleet-gateway, namespace: fleet-system}
spec:
  secretName: $secret
  commonName: "$host"
  dnsNames: [${dns%, }]
  ipAddresses: [${ips%, }]
  duration: 9528h
  privateKey: {algorithm: ECDSA, size: 256}
  usages: [server auth, digital signature, key encipherment]
  issuerRef: {name: fleet-selfsigned, kind: ClusterIssuer}
YAML
  k -n fleet-system wait certificate/fleet-gateway --for=condition=Ready --timeout=120s >/dev/null
}

case $issuer in
  openssl) with_openssl ;;
  cert-manager) with_cert_manager ;;
  *) say "FLEET_TLS_ISSUER=$issuer: use auto, cert-manager or openssl"; exit 1 ;;
esac
say "fleet-system/$secret: a self-signed certificate ($issuer) for ${names[*]}"
