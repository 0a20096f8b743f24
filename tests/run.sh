#!/usr/bin/env bash
# The whole test suite, with everything it needs, on Debian 12:
#
#   tests/run.sh [ARGS]        what the tests need, then cargo test --workspace --locked ARGS
#   tests/run.sh --setup-only  what the tests need, and stop
#
# 1. The programs the tests run, from Debian packages: installed with apt-get
#    when run as root; otherwise listed, with the apt-get line to run.
# 2. The npm packages of the real identity provider (tests/oidc-provider) and
#    of the console's browser tests (tests/console): `npm ci`, only when
#    package-lock.json changed since the last install.
# 3. grpcio in a venv under the target folder, when it is missing.
# 4. Postgres at $DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres):
#    started with pg_ctlcluster when it is installed but stopped; a missing
#    Postgres is a failure with a clear message, never skipped tests.
#
# When everything is there it only checks, in well under a second.
# .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_only=false
if [ "${1:-}" = "--setup-only" ]; then
  setup_only=true
  shift
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is not on PATH: install Rust (https://rustup.rs), then run $0 again." >&2
  exit 1
fi

# What the tests run, and the Debian packages that bring it: "PROGRAM PACKAGE...".
# A PROGRAM with a slash is a path, any other is looked up on PATH.
requirements=(
  # A second opinion on every certificate the server signs.
  "openssl openssl"
  # A CA key inside a PKCS#11 token: SoftHSM 2, and OpenSC's pkcs11-tool.
  "softhsm2-util softhsm2"
  "pkcs11-tool opensc"
  # Go's standard library, which Talos runs, as apid and talosctl (tests/go).
  "go golang-go"
  # Python venvs: the CI tools, and grpcio for the third gRPC client.
  "python3 python3-venv"
  # The CLI's saved logins in a real Secret Service: GNOME Keyring on a
  # private D-Bus session bus, read back with secret-tool.
  "gnome-keyring-daemon gnome-keyring"
  "secret-tool libsecret-tools"
  "dbus-daemon dbus-daemon"
  "dbus-send dbus-bin"
  # promtool checks the metrics and the alert rules; a real Prometheus
  # scrapes a running server.
  "promtool prometheus"
  "prometheus prometheus"
  # The real identity provider (oidc-provider) and the console's browser
  # tests run on Node.js.
  "node nodejs"
  "npm npm"
  # The console's browser tests: Debian's Chromium, never a downloaded one.
  "${CHROMIUM:-/usr/bin/chromium} chromium chromium-driver"
  # The check below that Postgres answers.
  "pg_isready postgresql-client"
  "psql postgresql-client"
  # The fault-injection tests run a Postgres cluster of their own.
  "/usr/lib/postgresql/15/bin/pg_ctl postgresql-15"
)

present() {
  case "$1" in
    */*) [ -x "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

missing_programs=()
missing_packages=()
for requirement in "${requirements[@]}"; do
  read -r program packages <<<"$requirement"
  if ! present "$program"; then
    missing_programs+=("$program")
    for package in $packages; do
      case " ${missing_packages[*]-} " in
        *" $package "*) ;;
        *) missing_packages+=("$package") ;;
      esac
    done
  fi
done

# `python3 -m venv` needs ensurepip, which Debian ships apart from python3.
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  case " ${missing_packages[*]-} " in
    *" python3-venv "*) ;;
    *) missing_packages+=("python3-venv") ;;
  esac
fi

if [ "${#missing_packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tools: missing ${missing_programs[*]}: apt-get install ${missing_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Waits for another apt-get or dpkg rather than failing at once.
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing_packages[@]}" >/dev/null
    for program in "${missing_programs[@]}"; do
      if ! present "$program"; then
        echo "tools: $program is still missing after apt-get install" >&2
        exit 1
      fi
    done
  else
    {
      echo "The tests need programs this machine lacks: ${missing_programs[*]}."
      echo "Install them (Debian 12 package names), then run $0 again:"
      echo "  sudo apt-get install -y ${missing_packages[*]}"
    } >&2
    exit 1
  fi
fi

node_major=$(node --version | sed -E 's/^v([0-9]+).*/\1/')
if [ "$node_major" -lt 18 ]; then
  echo "Node.js $(node --version) is too old: oidc-provider needs 18 or later." >&2
  exit 1
fi
echo "tools: all ${#requirements[@]} present (node $(node --version), $("${CHROMIUM:-/usr/bin/chromium}" --version 2>/dev/null | sed -n 1p))"

# npm ci only when node_modules is missing or package-lock.json changed
# since it last ran.
for folder in tests/oidc-provider tests/console; do
  lock_sum=$(sha256sum "$folder/package-lock.json" | cut -d' ' -f1)
  if [ "$(cat "$folder/node_modules/.installed-lock.sha256" 2>/dev/null)" != "$lock_sum" ]; then
    echo "npm: npm ci in $folder"
    npm ci --prefix "$folder" --no-audit --no-fund --loglevel=error
    echo "$lock_sum" >"$folder/node_modules/.installed-lock.sha256"
  fi
done

# Python libraries from PyPI the tests drive, in a venv in the target
# folder the tests run from, made only when it cannot import them: grpcio
# (gRPC's C core) for the third gRPC client (tests/grpc/grpcio_client.py),
# and PyJWT for workload tokens signed by a JWT implementation of its own
# (tests/workload/mint.py).
grpcio_venv="${CARGO_TARGET_DIR:-target}/grpcio-venv"
if ! "$grpcio_venv/bin/python" -c 'import grpc, jwt, cryptography' >/dev/null 2>&1; then
  echo "python test libraries: installing into $grpcio_venv"
  rm -rf "$grpcio_venv"
  python3 -m venv "$grpcio_venv"
  "$grpcio_venv/bin/pip" install -q --disable-pip-version-check grpcio==1.85.4 \
    'PyJWT[crypto]==2.10.1' cryptography==51.0.1
fi

# The audit store tests run against a real Postgres: each test makes its own
# database.
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export DATABASE_URL
db_host=$(printf '%s' "$DATABASE_URL" | sed -E 's#^[a-z]+://([^@/]*@)?([^:/]+).*#\2#')
db_port=$(printf '%s' "$DATABASE_URL" | sed -nE 's#^[a-z]+://([^@/]*@)?[^:/]+:([0-9]+).*#\2#p')
db_port=${db_port:-5432}
if ! pg_isready -q -h "$db_host" -p "$db_port" -t 5 && command -v pg_ctlcluster >/dev/null 2>&1 \
  && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | head -n 1)
  echo "postgres: not answering; trying to start the local cluster ($version main)"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
fi
if ! pg_isready -q -h "$db_host" -p "$db_port" -t 10; then
  echo "Postgres is not reachable at $DATABASE_URL." >&2
  echo "The tests need it: start Postgres (127.0.0.1:5432, user postgres, trust auth) or set DATABASE_URL." >&2
  exit 1
fi
if ! PGCONNECT_TIMEOUT=10 psql "$DATABASE_URL" -w -Atqc 'select 1' >/dev/null; then
  echo "Postgres answers at $db_host:$db_port but refuses the connection to $DATABASE_URL." >&2
  echo "The tests connect without a password: give user postgres trust auth on 127.0.0.1 (a first line" >&2
  echo "'host all postgres 127.0.0.1/32 trust' in pg_hba.conf, then pg_ctlcluster VERSION main reload)," >&2
  echo "or set DATABASE_URL to a role that may create databases." >&2
  exit 1
fi
echo "postgres: $db_host:$db_port answers"

if [ "$(id -u)" -ne 0 ]; then
  echo "note: the fault-injection tests need root (a Postgres cluster run as user postgres, a tmpfs" >&2
  echo "mounted for the SQLite disk scenarios); as $(id -un) they fail." >&2
fi

if "$setup_only"; then
  exit 0
fi
exec cargo test --workspace --locked "$@"
