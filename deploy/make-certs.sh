#!/bin/sh
# Make the TLS files of a tunefleet fleet with openssl: a private CA, the daemon's certificate for the
# names agents and clients dial, optional client certificates (for the daemon's --tls-client-ca) and,
# with --tokens, the agent and client token files. See deploy/README.md and docs/security.md.
#
#   deploy/make-certs.sh -o deploy/secrets --tokens daemon tuner.example.internal 10.0.0.5
#
# Writes into DIR: ca.crt (give it to agents and clients: --tls-ca), ca.key (keep it safe and off the
# fleet; it is reused by later runs to issue more certificates), daemon.crt and daemon.key (the daemon's
# --tls-cert and --tls-key), NAME.crt and NAME.key per --client NAME, agent-token and client-token.
# Keys and tokens are written with mode 0600, certificates 0644. Existing tokens are kept.
set -eu

usage() {
    cat <<'EOF'
usage: make-certs.sh [-o DIR] [--days N] [--client NAME]... [--tokens] NAME_OR_IP...

  NAME_OR_IP   DNS names and IP addresses agents and clients use to reach the daemon (the
               certificate's subjectAltName); localhost, 127.0.0.1 and ::1 are always added, for
               health checks and clients on the daemon's own host
  -o DIR       where to write the files (default: tunefleet-certs)
  --days N     validity of the daemon and client certificates (default 825; the CA: 3650)
  --client NAME  also issue a client certificate NAME.crt/NAME.key (repeatable)
  --tokens     also write agent-token and client-token (random, 64 hex digits) unless present
EOF
}

fail() {
    echo "make-certs.sh: $*" >&2
    exit 2
}

out=tunefleet-certs
days=825
clients=""
tokens=no
while [ $# -gt 0 ]; do
    case $1 in
        -o|--out|--days|--client)
            [ $# -ge 2 ] || fail "$1 needs a value"
            case $1 in
                -o|--out) out=$2 ;;
                --days) days=$2 ;;
                --client)
                    # the name becomes a file name and a certificate subject: keep it plain
                    printf '%s' "$2" | grep -Eq '^[A-Za-z0-9][A-Za-z0-9._-]*$' || fail "bad client name '$2'"
                    clients="$clients $2" ;;
            esac
            shift 2 ;;
        --tokens) tokens=yes; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) usage >&2; fail "unknown option $1" ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { usage >&2; fail "give the daemon's DNS names or IP addresses"; }
printf '%s' "$days" | grep -Eq '^[1-9][0-9]*$' || fail "--days needs a positive number, not '$days'"
command -v openssl >/dev/null 2>&1 || fail "openssl is not installed"

umask 077
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# subjectAltName entries: an argument with a ':' or only digits and dots is an IP address.
sans=""
dns=0
ip=0
for name in "$@" localhost 127.0.0.1 ::1; do
    if printf '%s' "$name" | grep -Eq '^[0-9.]+$|:'; then
        ip=$((ip + 1)); sans="${sans}IP.$ip = $name
"
    else
        printf '%s' "$name" | grep -Eq '^[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?$' || fail "bad DNS name '$name'"
        dns=$((dns + 1)); sans="${sans}DNS.$dns = $name
"
    fi
done

# Our own configuration, so the result does not depend on the system's openssl.cnf.
cat > "$work/openssl.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = @sans
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[sans]
$sans
EOF

new_key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

# issue SUBJECT_CN EXTENSIONS NAME: NAME.key and NAME.crt signed by the CA
issue() {
    new_key "$out/$3.key"
    openssl req -config "$work/openssl.cnf" -new -key "$out/$3.key" -subj "/CN=$1" -out "$work/$3.csr"
    openssl x509 -req -in "$work/$3.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
        -extfile "$work/openssl.cnf" -extensions "$2" -out "$out/$3.crt" 2>/dev/null
    chmod 0644 "$out/$3.crt"
    echo "wrote $out/$3.crt and $out/$3.key"
}

if [ -f "$out/ca.key" ] && [ -f "$out/ca.crt" ]; then
    echo "using the existing CA $out/ca.crt"
else
    new_key "$out/ca.key"
    openssl req -config "$work/openssl.cnf" -x509 -new -key "$out/ca.key" -subj "/CN=tunefleet CA" \
        -days 3650 -sha256 -extensions ca_ext -out "$out/ca.crt"
    chmod 0644 "$out/ca.crt"
    echo "wrote $out/ca.crt and $out/ca.key (keep ca.key off the fleet)"
fi

issue "$1" server_ext daemon
for client in $clients; do
    issue "$client" client_ext "$client"
done

if [ "$tokens" = yes ]; then
    for token in agent-token client-token; do
        if [ -f "$out/$token" ]; then
            echo "kept the existing $out/$token"
        else
            openssl rand -hex 32 > "$out/$token"
            echo "wrote $out/$token"
        fi
    done
fi
