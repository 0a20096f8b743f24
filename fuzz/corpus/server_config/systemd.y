y# /etc/talos-sso/config.yaml for the systemd unit (docs/configuration.md).
listen: "0.0.0.0:8443"
tls:
  cert_file: /run/credentials/talos-sso-server.service/tls.crt
  key_file: /run/credentials/talos-sso-server.service/tls.key
# No `database`: the embedded SQLite store in the unit's StateDirectory.
data_dir: /var/lib/talos-sso
identity:
  kind: entra
  issuer: "https://login.microsoftonline.com/<tenant-id>/v2.0"
  client_id: "<public client id of the talos-sso app registration>"
  allowed_tenants: ["<tenant-id>"]
clusters:
  homelab:
    description: "Homelab"
    ca:
      cert_file: /run/credentials/talos-sso-server.service/talos-ca.crt
      key_file: /run/credentials/talos-sso-server.service/talos-ca.key
    endpoints: ["192.0.2.10"]
    rules:
      - { users: ["<you@example.com>"], roles: [os:admin] }
