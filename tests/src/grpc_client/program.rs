//! Client programs (tests/go/talos-grpc, tests/grpc/grpcio_client.py): the
//! flags they take, running one to its end, and the JSON line it prints.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::{Call, CallOutcome, Mode, TalosContext};

/// The JSON line tests/go/talos-grpc and tests/grpc/grpcio_client.py print.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reported {
    code: i32,
    message: String,
    #[serde(default)]
    message_raw: Option<String>,
    headers: Vec<(String, String)>,
    trailers: Vec<(String, String)>,
    sizes: Vec<usize>,
    /// Base64, when kept.
    messages: Vec<String>,
    sha256: String,
    #[serde(default)]
    error: Option<String>,
}

/// A program's JSON line as an outcome.
pub(crate) fn outcome_from_json(line: &str) -> Result<CallOutcome, String> {
    let reported: Reported = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
    let messages = reported
        .messages
        .iter()
        .map(|m| STANDARD.decode(m))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    Ok(CallOutcome {
        code: reported.code,
        message: reported.message,
        message_raw: reported.message_raw,
        headers: reported.headers,
        trailers: reported.trailers,
        sizes: reported.sizes,
        messages,
        sha256: reported.sha256,
        transport_error: reported.error,
    })
}

/// The flags both programs take for `call`, with the context's PEM written
/// into `dir`.
pub(crate) fn program_args(dir: &Path, context: &TalosContext, call: &Call) -> Vec<String> {
    let write = |name: &str, contents: &str| {
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write a PEM file");
        path.to_string_lossy().into_owned()
    };
    let mut args = vec![
        "--endpoint".to_owned(),
        context.authority(),
        "--server-name".to_owned(),
        context.host_port().0,
        "--ca".to_owned(),
        write("ca.pem", &context.ca_pem),
        "--crt".to_owned(),
        write("crt.pem", &context.crt_pem),
        "--key".to_owned(),
        write("key.pem", &context.key_pem),
        "--method".to_owned(),
        call.method.clone(),
        "--request".to_owned(),
        STANDARD.encode(&call.request),
    ];
    for (key, value) in &call.metadata {
        args.push("--md".to_owned());
        args.push(format!("{key}={value}"));
    }
    let mut mode = |name: &str, extra: &[String]| {
        args.push("--mode".to_owned());
        args.push(name.to_owned());
        args.extend_from_slice(extra);
    };
    match &call.mode {
        Mode::Unary => mode("unary", &[]),
        Mode::ServerStream { take } => mode(
            "server-stream",
            &["--count".into(), take.unwrap_or(0).to_string()],
        ),
        Mode::ClientStream { bytes } => mode("client-stream", &["--bytes".into(), bytes.to_string()]),
        Mode::Bidi { messages } => {
            let sends: Vec<String> = messages
                .iter()
                .flat_map(|m| ["--send".to_owned(), STANDARD.encode(m)])
                .collect();
            mode("bidi", &sends)
        }
    }
    args
}

/// Run a client program to its end (at most `timeout`) and read its JSON
/// line; a program that says nothing readable fails the test with what it
/// printed.
pub(crate) async fn run_program(mut command: tokio::process::Command, timeout: Duration) -> CallOutcome {
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let program = format!("{:?}", command.as_std().get_program());
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("{program}: {e}")),
        Err(_) => panic!("{program} still running after {timeout:?}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("");
    outcome_from_json(line).unwrap_or_else(|e| {
        panic!(
            "{program} ({}) printed no outcome: {e}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}
