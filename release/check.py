#!/usr/bin/env python3
"""Check what release/build.sh made, as someone downloading it would.

    python3 release/check.py target/release-out

- SHA256SUMS lists every archive and SBOM, and each checksum matches.
- Each archive unpacks into one folder named after it, with the binary,
  LICENSE, README.md and CHANGELOG.md (and the CLI's man pages).
- The binary (when it runs on this machine) says its version and the
  commit it was built from: `NAME VERSION (commit SHA)`.
- The binary carries its dependency list (`cargo auditable`: the
  zlib-compressed JSON in its `.dep-v0` section), and every package in it
  is in Cargo.lock at that version.
- The SBOM is CycloneDX 1.5 JSON for the binary's own package and
  version, and lists the same crates at the same versions as Cargo.lock.

Exits 1 with every problem found. Needs Python 3.11 (tomllib), tar and
objcopy (binutils).
"""

import hashlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib
import zlib

REPO = pathlib.Path(__file__).resolve().parent.parent
problems = []


def problem(text):
    problems.append(text)
    print(f"  problem: {text}")


def lock_packages():
    lock = tomllib.loads((REPO / "Cargo.lock").read_text())
    return {(p["name"], p["version"]) for p in lock["package"]}


def check_sums(out):
    sums = out / "SHA256SUMS"
    if not sums.is_file():
        problem("no SHA256SUMS")
        return
    listed = {}
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.lstrip("*")] = digest
    made = {p.name for p in out.iterdir() if p.name != "SHA256SUMS"}
    if set(listed) != made:
        problem(f"SHA256SUMS lists {sorted(listed)}, the folder holds {sorted(made)}")
    for name, digest in listed.items():
        actual = hashlib.sha256((out / name).read_bytes()).hexdigest()
        if actual != digest:
            problem(f"{name}: checksum {actual} is not the listed {digest}")
    print(f"SHA256SUMS: {len(listed)} files, every checksum matches")


def dependency_list(binary):
    """The JSON `cargo auditable` embeds, or None."""
    with tempfile.NamedTemporaryFile() as section:
        done = subprocess.run(
            ["objcopy", "--dump-section", f".dep-v0={section.name}", str(binary), "/dev/null"],
            capture_output=True,
        )
        if done.returncode != 0:
            return None
        return json.loads(zlib.decompress(pathlib.Path(section.name).read_bytes()))


def check_archive(out, archive, commit, locked):
    name = archive.name.removesuffix(".tar.gz")
    match = re.fullmatch(r"(talos-sso(?:-server)?)-(\d+\.\d+\.\d+[^-]*)-(.+)", name)
    if not match:
        problem(f"{archive.name}: not NAME-VERSION-TARGET.tar.gz")
        return
    program, version, target = match.groups()
    print(f"{archive.name}: {program} {version} for {target}, {archive.stat().st_size / 1048576:.1f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "-xzf", str(archive), "-C", tmp], check=True)
        folders = list(pathlib.Path(tmp).iterdir())
        if [f.name for f in folders] != [name]:
            problem(f"{archive.name}: unpacks into {[f.name for f in folders]}, not one folder {name}")
            return
        folder = folders[0]
        wanted = [program, "LICENSE", "README.md", "CHANGELOG.md"] + (["man"] if program == "talos-sso" else [])
        for item in wanted:
            if not (folder / item).exists():
                problem(f"{archive.name}: no {item}")
        binary = folder / program
        if target == host_target():
            said = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
            expected = f"{program} {version} (commit {commit})"
            if said != expected:
                problem(f"{program} --version says {said!r}, not {expected!r}")
            else:
                print(f"  --version: {said}")
        embedded = dependency_list(binary)
        if embedded is None:
            problem(f"{program}: no dependency list (.dep-v0) in the binary")
        else:
            packages = {(p["name"], p["version"]) for p in embedded["packages"]}
            unknown = sorted(p for p in packages if p not in locked)
            if unknown:
                problem(f"{program}: embedded packages not in Cargo.lock: {unknown[:5]}")
            if (program, version) not in packages:
                problem(f"{program}: its own package is not in its embedded list")
            print(f"  dependency list in the binary: {len(packages)} packages, all in Cargo.lock")
        check_sbom(out / f"{name}.cdx.json", program, version, locked, embedded)


def check_sbom(path, program, version, locked, embedded):
    if not path.is_file():
        problem(f"no SBOM {path.name}")
        return
    sbom = json.loads(path.read_text())
    if sbom.get("bomFormat") != "CycloneDX" or sbom.get("specVersion") != "1.5":
        problem(f"{path.name}: not CycloneDX 1.5 ({sbom.get('bomFormat')} {sbom.get('specVersion')})")
    top = sbom.get("metadata", {}).get("component", {})
    if (top.get("name"), top.get("version")) != (program, version):
        problem(f"{path.name}: describes {top.get('name')} {top.get('version')}, not {program} {version}")
    components = {(c["name"], c["version"]) for c in sbom.get("components", [])}
    unknown = sorted(c for c in components if c not in locked)
    if unknown:
        problem(f"{path.name}: components not in Cargo.lock: {unknown[:5]}")
    if embedded is not None:
        # What the binary was built from must all be in the SBOM (the SBOM
        # may list more: build dependencies, other features' crates).
        built = {(p["name"], p["version"]) for p in embedded["packages"] if p.get("kind", "runtime") == "runtime"}
        missing = sorted(built - components - {(program, version)})
        if missing:
            problem(f"{path.name}: crates in the binary but not in the SBOM: {missing[:5]}")
    print(f"  SBOM {path.name}: CycloneDX 1.5, {len(components)} components, all in Cargo.lock")


def host_target():
    info = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    return next(line.split(": ", 1)[1] for line in info.splitlines() if line.startswith("host: "))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: release/check.py OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        commit += "-dirty"
    locked = lock_packages()
    check_sums(out)
    archives = sorted(out.glob("*.tar.gz"))
    if not archives:
        problem(f"no archives in {out}")
    for archive in archives:
        check_archive(out, archive, commit, locked)
    if problems:
        sys.exit(f"{len(problems)} problem(s) in {out}")
    print(f"{out}: {len(archives)} archive(s) checked")


main()
