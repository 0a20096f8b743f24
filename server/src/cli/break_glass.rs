//! `break-glass`: a certificate without the identity provider, written as
//! a talosconfig (to a file, or alone on standard output).

use std::io::Write;
use std::path::Path;

use crate::break_glass::BreakGlassRequest;

/// `break-glass` with the configuration at `config`.
pub(super) async fn run(
    config: &Path,
    request: &BreakGlassRequest<'_>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let config = super::load_config(config)?;
    let result = crate::break_glass::run(&config, request).await?;
    let summary = format!(
        "(context {}): serial {}, valid until {}, audit record {}; signed by {}, {} mode",
        result.context,
        result.serial,
        crate::ca::format_time(result.not_after),
        result.audit_seq,
        result.signed_by,
        result.mode
    );
    match &result.talosconfig {
        // Standard output carries the talosconfig alone; what is
        // said about it goes to standard error.
        Some(talosconfig) => {
            out.write_all(talosconfig.as_bytes())?;
            out.flush()?;
            eprintln!("wrote the talosconfig to standard output {summary}");
        }
        None => writeln!(out, "wrote {} {summary}", request.out.display())?,
    }
    Ok(())
}
