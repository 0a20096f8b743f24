//! `serve`: the server until SIGTERM or SIGINT.

use std::path::Path;
use std::sync::Arc;

use crate::app::SystemClock;
use crate::config::Config;
use crate::server::Server;

/// `serve`: load the configuration and serve until stopped.
pub(super) async fn run(config: &Path) -> anyhow::Result<()> {
    // SIGHUP reloads the configuration. Taken from here on, so that
    // one sent while the server starts (`systemctl reload` during a
    // slow start) does not end it: what is being loaded is the
    // newest configuration anyway.
    let _hangups_while_starting = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    serve(super::load_config(config)?).await
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let server = Server::bind(config, Arc::new(SystemClock)).await?;
    server.run_until_stopped(shutdown_signal()).await;
    Ok(())
}
