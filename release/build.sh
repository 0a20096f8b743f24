#!/usr/bin/env bash
# Build the release archives of talos-sso (the CLI) and talos-sso-server for
# one target, from a clean checkout:
#
#   release/build.sh                                   # this machine's target, into target/release-out
#   release/build.sh --target aarch64-apple-darwin --out DIR --only cli
#
# Each archive holds the binary (built with `cargo auditable`, so it carries
# its dependency list, and with the version and commit in `--version`), the
# license, README and changelog; the CLI's also its man pages. Next to each:
# a CycloneDX SBOM made from the lock file. SHA256SUMS covers them all.
#
# Not bit-for-bit reproducible: the same commit, toolchain and target give
# the same binaries (paths are remapped, timestamps come from the commit),
# but a different toolchain, linker or C library version gives different
# ones, and each SBOM carries the time it was made and a random serial
# number. The checksums are of what was built, not a prediction of it.
set -euo pipefail
cd "$(dirname "$0")/.."

target=$(rustc -vV | sed -n 's/^host: //p')
out=target/release-out
only=both
allow_dirty=no
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --allow-dirty) allow_dirty=yes; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "release/build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in both|cli|server) ;; *) echo "--only takes cli, server or both" >&2; exit 2 ;; esac

for tool in cargo-auditable cargo-cyclonedx; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "release/build.sh: $tool is missing: cargo install --locked $tool" >&2
    exit 1
  fi
done

commit=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  if [ "$allow_dirty" != yes ]; then
    echo "release/build.sh: the checkout has uncommitted changes; commit them (or --allow-dirty, which marks the commit -dirty)" >&2
    exit 1
  fi
  commit="$commit-dirty"
fi
version=$(cargo pkgid --locked -p talos-sso | sed 's/.*[#@]//')
# Times in archives and binaries come from the commit, not the clock.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH TALOS_SSO_REVISION="$commit"
# Paths of this machine stay out of the binaries (panic locations, debug info).
export RUSTFLAGS="${RUSTFLAGS:-} --remap-path-prefix=$PWD=/build/talos-sso --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"

packages=()
[ "$only" != server ] && packages+=(-p talos-sso --bin talos-sso)
[ "$only" != cli ] && packages+=(-p talos-sso-server --bin talos-sso-server)
echo "== building talos-sso $version ($commit) for $target"
cargo auditable build --release --locked --target "$target" "${packages[@]}"

rm -rf "$out" && mkdir -p "$out/stage"
# GNU tar and sha256sum (macOS: `brew install gnu-tar coreutils`).
tar=$(command -v gtar || command -v tar)
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }
exe=""
case "$target" in *windows*) exe=".exe" ;; esac

# One archive: .zip for Windows, else .tar.gz with fixed owners, order and times.
archive() {
  local name=$1
  if [ -n "$exe" ]; then
    (cd "$out/stage" && find "$name" -exec touch -d "@$SOURCE_DATE_EPOCH" {} + \
      && if command -v zip >/dev/null 2>&1; then zip -qrX "../$name.zip" "$name"; else 7z a -tzip -bso0 "../$name.zip" "$name"; fi)
  else
    "$tar" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
      --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
      -C "$out/stage" -cf - "$name" | gzip -n -9 > "$out/$name.tar.gz"
  fi
}

# The SBOM of one package, from the lock file, for this target.
sbom() {
  local package=$1 dir=$2 name=$3
  cargo cyclonedx --manifest-path "$dir/Cargo.toml" --format json --spec-version 1.5 \
    --target "$target" --override-filename "$name.cdx" >/dev/null
  mv "$dir/$name.cdx.json" "$out/$name.cdx.json"
  # It writes one for every workspace member; only this package's is kept.
  find . -maxdepth 2 -name "$name.cdx.json" -not -path "./target/*" -delete
}

if [ "$only" != server ]; then
  name="talos-sso-$version-$target"
  mkdir -p "$out/stage/$name/man"
  cp "target/$target/release/talos-sso$exe" "$out/stage/$name/"
  cp LICENSE README.md CHANGELOG.md "$out/stage/$name/"
  cp docs/man/*.1 "$out/stage/$name/man/"
  archive "$name"
  sbom talos-sso client "$name"
fi
if [ "$only" != cli ]; then
  name="talos-sso-server-$version-$target"
  mkdir -p "$out/stage/$name"
  cp "target/$target/release/talos-sso-server$exe" "$out/stage/$name/"
  cp LICENSE README.md CHANGELOG.md "$out/stage/$name/"
  archive "$name"
  sbom talos-sso-server server "$name"
fi
rm -rf "$out/stage"

shopt -s nullglob
(cd "$out" && files=(*.tar.gz *.zip *.cdx.json) && sha256 -- "${files[@]}" > SHA256SUMS)
(cd "$out" && sha256 -c --quiet SHA256SUMS)
echo "== $out:"
(cd "$out" && ls -l --time-style=+ -- * | awk '{print $5, $NF}')
