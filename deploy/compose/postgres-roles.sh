#!/bin/sh
# The two database roles of talos-sso-server (docs/configuration.md,
# "Database roles"), created or brought up to date:
#
# - the owner, which runs `talos-sso-server migrate` and owns the schema;
# - the runtime role the server connects as, to which `migrate
#   --runtime-role` grants only SELECT and INSERT (and DELETE on deny_list, and
#   what the console's session tables need: docs/configuration.md, "Database roles").
#
# Passwords come from files, never from the command line; running this again
# sets them again (rotation). Run it as a superuser: the connection comes from
# the libpq environment (PGHOST, PGUSER, PGDATABASE), the superuser's password
# from the file PGPASSWORD_FILE names, if any.
set -eu

if [ -n "${PGPASSWORD_FILE:-}" ]; then
  PGPASSWORD=$(cat "$PGPASSWORD_FILE")
  export PGPASSWORD
fi

: "${TALOS_SSO_OWNER_ROLE:=talos_sso_owner}"
: "${TALOS_SSO_RUNTIME_ROLE:=talos_sso_app}"
: "${TALOS_SSO_OWNER_PASSWORD_FILE:=/run/secrets/db_owner_password}"
: "${TALOS_SSO_RUNTIME_PASSWORD_FILE:=/run/secrets/db_app_password}"

for file in "$TALOS_SSO_OWNER_PASSWORD_FILE" "$TALOS_SSO_RUNTIME_PASSWORD_FILE"; do
  if [ ! -s "$file" ]; then
    echo "postgres-roles: $file is missing or empty (deploy/compose/README.md says how to make it)" >&2
    exit 1
  fi
done

exec psql -X -q -v ON_ERROR_STOP=1 \
  -v owner="$TALOS_SSO_OWNER_ROLE" -v runtime="$TALOS_SSO_RUNTIME_ROLE" \
  -v owner_password_file="$TALOS_SSO_OWNER_PASSWORD_FILE" \
  -v runtime_password_file="$TALOS_SSO_RUNTIME_PASSWORD_FILE" <<'SQL'
\set owner_password `cat :'owner_password_file'`
\set runtime_password `cat :'runtime_password_file'`
SELECT format('CREATE ROLE %I', :'owner')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('CREATE ROLE %I', :'runtime')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'runtime') \gexec
ALTER ROLE :"owner" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'owner_password';
-- NOINHERIT: a membership added to it later gives it nothing unasked.
ALTER ROLE :"runtime" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD :'runtime_password';
-- The owner owns the database, and with it (Postgres 15 and later) the
-- right to create in its public schema; before 15 everyone had that right.
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'owner') \gexec
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SQL
