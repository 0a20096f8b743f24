c# talos-sso-server configuration (docs/configuration.md). Secrets are files
# mounted from Kubernetes Secrets; replace the <...> values in an overlay.
listen: "0.0.0.0:8443"
tls:
  cert_file: /etc/talos-sso/tls/tls.crt
  key_file: /etc/talos-sso/tls/tls.key
database:
  url: "postgres://talos_sso@postgres.talos-sso.svc:5432/talos_sso"
  password_file: /etc/talos-sso/database/password
identity:
  kind: entra
  issuer: "https://login.microsoftonline.com/<tenant-id>/v2.0"
  client_id: "<public client id of the talos-sso app registration>"
  allowed_tenants: ["<tenant-id>"]
clusters:
  prod:
    description: "Production"
    ca:
      cert_file: /etc/talos-sso/ca/tls.crt
      key_file: /etc/talos-sso/ca/tls.key
    endpoints: ["cp-01.example.internal", "cp-02.example.internal", "cp-03.example.internal"]
    ttl: 5m
    max_ttl: 15m
    rules:
      - { groups: ["<platform-admins object id>"], roles: [os:admin] }
      - { groups: ["<on-call object id>"], roles: [os:operator] }
      - { app_roles: ["Talos.Reader"], roles: [os:reader] }
    default_roles: [os:operator, os:reader]
auditors: { groups: ["<security team object id>"] }
admins: { groups: ["<platform-admins object id>"] }
