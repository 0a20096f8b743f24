c# talos-sso-server configuration for the local compose stack (docker-compose.yml).
# The Talos CA comes from a mounted secret; the database password from a file.
listen: "0.0.0.0:8443"
# Local stack only: plain HTTP on localhost. Production sets `tls`.
insecure_http: true
data_dir: /var/lib/talos-sso
database:
  url: "postgres://talos_sso@postgres:5432/talos_sso"
  password_file: /run/secrets/db_password
identity:
  kind: entra
  # The emulator's issuer (see the emulator service's --public-url).
  issuer: "http://localhost:8400/5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a/v2.0"
  client_id: "0c5a9f2e-1b3d-4c7e-8f60-2a4b6c8d0e1f"
  allowed_tenants: ["5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a"]
clusters:
  local:
    description: "Local compose stack"
    ca:
      cert_file: /run/secrets/talos_ca_crt
      key_file: /run/secrets/talos_ca_key
    endpoints: ["127.0.0.1"]
    ttl: 5m
    max_ttl: 15m
    rules:
      - { groups: ["3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a01"], roles: [os:admin] }
      - { groups: ["3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02"], roles: [os:operator] }
      - { app_roles: ["Talos.Reader"], roles: [os:reader] }
    default_roles: [os:operator, os:reader]
auditors: { groups: ["3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a03"] }
