tinsecure_http = true
[identity]
kind = "oidc"
issuer = "https://idp.example.com"
client_id = "cli"
[[identity.trusted_issuers]]
name = "ci"
kind = "oidc"
issuer = "https://token.actions.example"
audiences = ["talos"]
[clusters.lab]
endpoints = ["10.5.0.2"]
ttl = "5m"
max_ttl = "1h"
clock_skew = "1m"
[clusters.lab.ca]
secrets_bundle = "/etc/talos/secrets.yaml"
[[clusters.lab.rules]]
users = ["alice"]
roles = ["os:admin"]
[rate_limits]
per_identity_per_minute = 0
