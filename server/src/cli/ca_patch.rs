//! `ca patch add|remove`: the machine-config patches that make Talos accept
//! a client-only CA (`machine.acceptedCAs`) or stop accepting it, printed
//! for review in both forms, or written to files ready for `talosctl`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use super::files::write_new_file;
use crate::ca::patch::{self, AcceptedCasPatches, AcceptedEntry};
use crate::ca::{CaSummary, can_vouch_for_a_server, describe_name, parse_certificates};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PatchAction {
    /// Add the CA to machine.acceptedCAs.
    Add,
    /// Remove the CA from machine.acceptedCAs (the cut-off).
    Remove,
}

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// Add or remove.
    #[arg(value_enum)]
    action: PatchAction,
    /// The client-only CA certificate (PEM), as `talos-sso-server ca client-ca` wrote it.
    #[arg(long)]
    ca_cert: PathBuf,
    /// The node's current machine config, or `talosctl get machineconfig -o
    /// yaml` output (`-`: standard input, so that the config, which holds
    /// the node's secrets, need not be written to disk): the replace form
    /// carries the CAs it already accepts. Required for `remove`.
    #[arg(long)]
    current: Option<PathBuf>,
    /// Write each patch to a file in this folder (made if missing; files
    /// are never overwritten) and print the talosctl commands that apply
    /// them.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// The files `--out-dir` writes.
const APPEND_FILE: &str = "accepted-ca-append.yaml";
const DELETE_FILE: &str = "accepted-ca-replace-1-delete.yaml";
const LIST_FILE: &str = "accepted-ca-replace-2-list.yaml";

pub(super) fn run(args: &PatchArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let text = crate::text_file::read(&args.ca_cert)
        .with_context(|| format!("cannot read {}", args.ca_cert.display()))?;
    let certs = parse_certificates(&text, &args.ca_cert.display().to_string())?;
    let [ca] = certs.as_slice() else {
        bail!(
            "{} holds {} certificates; give the one client-only CA",
            args.ca_cert.display(),
            certs.len()
        );
    };
    if ca.basic_constraints().is_none_or(|bc| !bc.ca) {
        bail!("{} is not a CA certificate", args.ca_cert.display());
    }
    // Whatever Talos lists in acceptedCAs also verifies servers for talosctl
    // and the nodes: only a CA that cannot vouch for one may be added.
    if matches!(args.action, PatchAction::Add) && can_vouch_for_a_server(ca) {
        bail!(
            "{} can vouch for servers (its extended key usage allows serverAuth, or it has none): listed in \
             machine.acceptedCAs, its key could impersonate apid; add a client-only CA (talos-sso-server \
             ca client-ca)",
            args.ca_cert.display()
        );
    }
    let current = match &args.current {
        Some(path) => {
            let text = if path == Path::new("-") {
                crate::text_file::read_from(std::io::stdin()).context("cannot read standard input")?
            } else {
                crate::text_file::read(path).with_context(|| format!("cannot read {}", path.display()))?
            };
            Some(patch::current_accepted_cas(&text).with_context(|| format!("{}", path.display()))?)
        }
        None => None,
    };
    let patches = match (args.action, &current) {
        (PatchAction::Add, current) => patch::add(current.as_deref().unwrap_or_default(), ca),
        (PatchAction::Remove, Some(current)) => patch::remove(current, ca)?,
        (PatchAction::Remove, None) => bail!(
            "`ca patch remove` needs --current: the replace form writes the whole list, so it must \
             carry the CAs the node accepts besides this one"
        ),
    };
    let now = time::OffsetDateTime::now_utc();
    let summary = CaSummary::of(ca, now);
    writeln!(
        out,
        "CA: {} (sha256 {})",
        summary.subject, summary.sha256_fingerprint
    )?;
    describe_change(out, args, current.as_deref(), &patches)?;
    match &args.out_dir {
        Some(dir) => write_files(out, dir, &patches, current.is_some()),
        None => print_forms(out, &patches, current.is_some()),
    }
}

/// The list before and after, in words.
fn describe_change(
    out: &mut (dyn Write + Send),
    args: &PatchArgs,
    current: Option<&[AcceptedEntry]>,
    patches: &AcceptedCasPatches,
) -> anyhow::Result<()> {
    let Some(current) = current else {
        writeln!(
            out,
            "no --current: only the append form is printed (the replace form must carry the CAs the \
             node already accepts)"
        )?;
        return Ok(());
    };
    let verb = match (args.action, patches.changes) {
        (PatchAction::Add, true) => "adds the CA",
        (PatchAction::Add, false) => "the CA is already accepted: the replace form keeps the list as it is",
        (PatchAction::Remove, true) => "removes the CA",
        (PatchAction::Remove, false) => "the CA is not in the list: the replace form keeps it as it is",
    };
    writeln!(
        out,
        "machine.acceptedCAs: {} now, {} after ({verb})",
        entries(current.len()),
        entries(patches.resulting.len())
    )?;
    // Every certificate of an entry is listed, since Talos trusts them all
    // (their names escaped: they come from a node's config).
    writeln!(out, "the list after the change:")?;
    for entry in &patches.resulting {
        let names: Vec<String> = match &entry.certs {
            Some(certs) => certs.iter().map(|c| describe_name(&c.raw_subject)).collect(),
            None => vec!["(unreadable entry, kept as it is)".into()],
        };
        writeln!(out, "  - {}", names.join(" + "))?;
    }
    Ok(())
}

fn entries(n: usize) -> String {
    if n == 1 {
        "1 entry".into()
    } else {
        format!("{n} entries")
    }
}

fn print_forms(
    out: &mut (dyn Write + Send),
    patches: &AcceptedCasPatches,
    replace: bool,
) -> anyhow::Result<()> {
    if let Some(append) = &patches.append {
        writeln!(
            out,
            "\n== append form: adds the CA; apply it once (by hand, or in `talosctl gen config \
             --config-patch`). Applied again, it adds the CA again. =="
        )?;
        write!(out, "{append}")?;
    }
    if replace {
        writeln!(
            out,
            "\n== replace form, patch 1 of 2: deletes the list. Apply both in one call; re-applying \
             them leaves the same list (use this from automation, and to remove a CA). =="
        )?;
        write!(out, "{}", patches.delete_list)?;
        writeln!(out, "\n== replace form, patch 2 of 2: the whole new list ==")?;
        write!(out, "{}", patches.new_list)?;
    }
    writeln!(
        out,
        "\nwrite them to files with --out-dir DIR to get the talosctl commands"
    )?;
    Ok(())
}

fn write_files(
    out: &mut (dyn Write + Send),
    dir: &Path,
    patches: &AcceptedCasPatches,
    replace: bool,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut files = Vec::new();
    if let Some(append) = &patches.append {
        files.push((APPEND_FILE, append));
    }
    if replace {
        files.push((DELETE_FILE, &patches.delete_list));
        files.push((LIST_FILE, &patches.new_list));
    }
    for (name, _) in &files {
        if dir.join(name).exists() {
            bail!(
                "{} already exists; refusing to overwrite it",
                dir.join(name).display()
            );
        }
    }
    for (name, contents) in &files {
        write_new_file(&dir.join(name), contents, 0o644)?;
        writeln!(out, "wrote {}", dir.join(name).display())?;
    }
    let at = |name: &str| format!("@{}", dir.join(name).display());
    writeln!(
        out,
        "\nApply to every control plane node, then to every worker (a worker's apid takes its client CAs \
         from a control plane's trustd; the change makes it fetch them at once, otherwise it does within \
         12 hours). Check first, then apply without a reboot:"
    )?;
    if replace {
        let patches = format!("--patch {} --patch {}", at(DELETE_FILE), at(LIST_FILE));
        writeln!(
            out,
            "  talosctl -n <node> patch machineconfig --mode=no-reboot --dry-run {patches}"
        )?;
        writeln!(
            out,
            "  talosctl -n <node> patch machineconfig --mode=no-reboot {patches}"
        )?;
    }
    if patches.append.is_some() {
        writeln!(
            out,
            "append form, once: talosctl -n <node> patch machineconfig --mode=no-reboot --patch {}",
            at(APPEND_FILE)
        )?;
    }
    Ok(())
}
