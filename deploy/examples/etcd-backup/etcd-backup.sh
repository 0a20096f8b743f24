#!/bin/sh
# An etcd snapshot of cluster prod, taken as the pod's service account:
# talos-sso turns the projected service-account token into a short Talos
# certificate for os:etcd:backup (the workload rule `etcd-backup`), and
# talosctl streams the snapshot with it. Nothing long-lived is stored: the
# kubelet rotates the token, the certificate lives minutes.
set -eu

: "${TALOS_SSO_SERVER:?the talos-sso server, e.g. https://talos-sso.example.com}"
: "${TALOS_NODE:?the control plane node to take the snapshot from}"
token_file="${TALOS_SSO_TOKEN_FILE:-/var/run/secrets/talos-sso/token}"
backup_dir="${BACKUP_DIR:-/backup}"
# The talosconfig login writes: the pod's own, gone with it.
export TALOSCONFIG="${TALOSCONFIG:-$HOME/.talos/config}"

talos-sso login --token-file "$token_file" --cluster prod
talosctl --nodes "$TALOS_NODE" etcd snapshot "$backup_dir/etcd.snapshot"

# A dated copy, so that a bad run never leaves no good snapshot behind.
stamp=$(date -u +%Y%m%dT%H%M%SZ)
test -s "$backup_dir/etcd.snapshot"
cp "$backup_dir/etcd.snapshot" "$backup_dir/etcd-$stamp.snapshot"
echo "etcd snapshot saved: $backup_dir/etcd-$stamp.snapshot"
