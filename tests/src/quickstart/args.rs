//! The quick start's command line: its options, defaults and `--help`.

use std::ffi::OsString;
use std::path::PathBuf;

/// The ports the quick start listens on unless told otherwise. Fixed, so
/// that the commands it prints keep working across runs.
pub const DEFAULT_EMULATOR_PORT: u16 = 8400;
pub const DEFAULT_SERVER_PORT: u16 = 8443;
/// The demo folder unless `--dir` says otherwise (from the current directory).
pub const DEFAULT_DIR: &str = "target/quickstart";

/// `quickstart --help`.
pub const USAGE: &str = "\
quickstart: all of talos-sso on this machine, with no external service: an
Entra ID emulator, a throwaway Talos CA, talos-sso-server with SQLite, a real
`talos-sso login` as a demo user and the auditor's view of the audit trail.

Usage: cargo run -p talos-sso-tests --bin quickstart [-- OPTIONS]

Options:
      --once                  stop after the demo instead of serving until Ctrl-C
      --dir PATH              the demo folder, deleted and recreated on each run; every
                              file the demo writes is in it (default: target/quickstart,
                              from the current directory)
      --emulator-port PORT    the Entra ID emulator's port (default: 8400; 0: any free port)
      --server-port PORT      talos-sso-server's port (default: 8443; 0: any free port)
  -h, --help                  print this help
";

/// The `quickstart` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickstartArgs {
    pub dir: PathBuf,
    pub emulator_port: u16,
    pub server_port: u16,
    pub once: bool,
}

impl Default for QuickstartArgs {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(DEFAULT_DIR),
            emulator_port: DEFAULT_EMULATOR_PORT,
            server_port: DEFAULT_SERVER_PORT,
            once: false,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Help,
    Run(QuickstartArgs),
}

fn port(option: &str, value: Option<OsString>) -> Result<u16, String> {
    let range = "0 to 65535; 0: any free port";
    let value = value.ok_or_else(|| format!("{option} needs a port number ({range})"))?;
    let text = value.to_string_lossy();
    text.parse::<u16>()
        .map_err(|_| format!("{option}: `{text}` is not a port number ({range})"))
}

/// Parse the arguments after the program name. Both `--option value` and
/// `--option=value` work; the error names the option that is wrong.
pub fn parse_args(arguments: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut parsed = QuickstartArgs::default();
    let mut arguments = arguments.into_iter();
    while let Some(argument) = arguments.next() {
        // Options are ASCII; only a value (a --dir path) may be any bytes.
        let (option, inline) = match argument.to_str() {
            Some(text) => match text.split_once('=') {
                Some((option, value)) if option.starts_with("--") => {
                    (option.to_owned(), Some(OsString::from(value)))
                }
                _ => (text.to_owned(), None),
            },
            None => {
                return Err(format!(
                    "unknown argument `{}`; see --help",
                    argument.to_string_lossy()
                ));
            }
        };
        let no_value = || match inline {
            Some(_) => Err(format!("{option} takes no value")),
            None => Ok(()),
        };
        match option.as_str() {
            "-h" | "--help" => {
                no_value()?;
                return Ok(Parsed::Help);
            }
            "--once" => {
                no_value()?;
                parsed.once = true;
            }
            "--dir" => {
                let value = inline.or_else(|| arguments.next());
                match value {
                    Some(dir) if !dir.is_empty() => parsed.dir = PathBuf::from(dir),
                    _ => return Err("--dir needs a path".into()),
                }
            }
            "--emulator-port" => parsed.emulator_port = port(&option, inline.or_else(|| arguments.next()))?,
            "--server-port" => parsed.server_port = port(&option, inline.or_else(|| arguments.next()))?,
            other => return Err(format!("unknown argument `{other}`; see --help")),
        }
    }
    if parsed.emulator_port != 0 && parsed.emulator_port == parsed.server_port {
        return Err(format!(
            "--emulator-port and --server-port are both {}; they need different ports",
            parsed.server_port
        ));
    }
    Ok(Parsed::Run(parsed))
}
