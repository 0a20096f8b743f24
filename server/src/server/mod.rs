//! Start-up and shutdown of a serving talos-sso-server: one path for
//! `serve`, the tests and the quick start.
//!
//! [`Server::bind`] builds and checks everything (the TLS material, the app
//! with its background tasks) before it takes the port, so that a broken
//! configuration is reported as such, not as a port someone else holds.
//! [`Server::run_until_stopped`] serves (the API, and the metrics on their
//! own listener when `metrics.listen` is set) until its shutdown future
//! completes, then stops in the order that loses nothing: no new
//! connections on either listener, in-flight requests finish within
//! `http.shutdown_grace`, the periodic tasks stop, the last refusal counts
//! are recorded while the audit writer still takes records, the writer
//! drains, and the last checkpoint is signed. The reload watcher
//! (`reload_watch`) starts here too.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::app::{App, Background, Clock, StartError};
use crate::config::{Config, ConfigError};
use crate::http::serve::{self, TlsFiles};

pub mod reload_watch;

/// A server that holds its port, ready to serve.
#[derive(Debug)]
pub struct Server {
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    /// Where the listener is bound: the configured address, with the port
    /// the system chose when the configuration says 0.
    local_addr: SocketAddr,
    /// The metrics listener (`metrics.listen`) and where it is bound.
    metrics: Option<(tokio::net::TcpListener, SocketAddr)>,
    /// `None` for plain HTTP (`insecure_http`).
    tls: Option<TlsFiles>,
    /// The web console (`console.enabled`).
    console: Option<Arc<crate::http::console::Console>>,
    /// The access gateways of the clusters that have one.
    gateways: crate::gateway::Gateways,
    tasks: Tasks,
}

/// What runs beside the serve loop.
#[derive(Debug)]
struct Tasks {
    background: Background,
    /// Reloads the TLS certificate and key when their files change.
    tls_reloader: Option<JoinHandle<()>>,
    /// Reloads the configuration on SIGHUP and when its files change; only
    /// for a configuration read from a file.
    config_watcher: Option<JoinHandle<()>>,
}

impl Tasks {
    /// Stop everything periodic, and wait until it has stopped: a task
    /// that is only told to stop may still hold the app for a moment. The
    /// audit writer keeps taking records.
    async fn stop_periodic(&mut self) {
        let background = &mut self.background;
        let periodic = [
            &mut background.refusal_recorder,
            &mut background.key_refresher,
            &mut background.rate_limit_janitor,
        ];
        let optional = [
            self.tls_reloader.as_mut(),
            background.checkpoint_signer.as_mut(),
            self.config_watcher.as_mut(),
        ];
        for task in periodic.into_iter().chain(optional.into_iter().flatten()) {
            task.abort();
            // Cancelled, or it had ended: either way it holds nothing now.
            let _ = task.await;
        }
    }
}

impl Server {
    /// Load the TLS material, build the app (CA material, rules, policy
    /// examples, the identity provider, the database) and only then bind
    /// `metrics.listen` (when set), then `config.listen`. Nothing is left
    /// running when this fails.
    pub async fn bind(config: Config, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        let (tls, tls_reloader) = tls_material(&config).await?.unzip();
        let (listen, metrics_listen) = (config.listen, config.metrics.listen);
        let tls_not_after = tls
            .clone()
            .map(|files| -> crate::metrics::Read<Option<i64>> { Box::new(move || files.not_after()) });
        // Before the CA material is read: a file changed while the server
        // starts is then seen as changed by the reload watcher.
        let loaded_state = reload_watch::loaded_state(&config);
        let (app, background) = match App::build(config, clock, tls_not_after).await {
            Ok(built) => built,
            Err(error) => {
                if let Some(reloader) = tls_reloader {
                    reloader.abort();
                }
                return Err(error);
            }
        };
        let settings = app.settings();
        let config_watcher = settings
            .config
            .source
            .is_some()
            .then(|| reload_watch::spawn_watcher(&app, settings.config.reload.interval, loaded_state));
        drop(settings);
        let mut tasks = Tasks {
            background,
            tls_reloader,
            config_watcher,
        };
        let console = match crate::http::console::Console::new(&app.settings().config) {
            Ok(console) => console.map(Arc::new),
            Err(error) => {
                tasks.stop_periodic().await;
                return Err(StartError::Console(error));
            }
        };
        let gateways = match crate::gateway::Gateways::bind(&app) {
            Ok(gateways) => gateways,
            Err(error) => {
                tasks.stop_periodic().await;
                return Err(StartError::Gateway(error.to_string()));
            }
        };
        let bound = metrics_listen
            .map(|address| listen_on(address).map_err(|error| (address, error)))
            .transpose()
            .and_then(|metrics| {
                let main = listen_on(listen).map_err(|error| (listen, error))?;
                Ok((main, metrics))
            });
        let ((listener, local_addr), metrics) = match bound {
            Ok(bound) => bound,
            Err((address, error)) => {
                // The app goes with this error, and its audit writer with it.
                tasks.stop_periodic().await;
                return Err(StartError::Listen { address, error });
            }
        };
        if let Some((_, address)) = &metrics {
            tracing::info!(address = %address, "serving metrics (plain HTTP)");
        }
        tracing::info!(address = %local_addr, tls = tls.is_some(), "listening");
        Ok(Self {
            app,
            listener,
            local_addr,
            metrics,
            tls,
            console,
            gateways,
            tasks,
        })
    }

    /// Where each cluster's gateway listens.
    pub fn gateway_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.gateways.addresses()
    }

    /// Where the metrics listener is bound, when `metrics.listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, address)| *address)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The base URL of the listener: `https://` when serving TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// The running state. A handle kept past [`Self::run_until_stopped`]
    /// keeps the audit writer (and the trail readable) until it is dropped.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Serve until `shutdown` completes, then shut down in order.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()>) {
        let Self {
            app,
            listener,
            metrics,
            tls,
            console,
            gateways,
            mut tasks,
            ..
        } = self;
        // One shutdown for both listeners.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let stopped = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        let shutdown = async {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight requests");
            let _ = stop.send(true);
        };
        let api = serve::run(
            app.clone(),
            crate::http::router(app.clone(), console),
            listener,
            tls,
            stopped(stopping.clone()),
        );
        let grace = app.settings().config.http.shutdown_grace;
        let gateways = gateways.run(app.clone(), stopping.clone(), grace);
        let metrics = async {
            if let Some((listener, _)) = metrics {
                let router = crate::http::metrics_router(app.clone());
                serve::run(app.clone(), router, listener, None, stopped(stopping)).await;
            }
        };
        tokio::join!(shutdown, api, metrics, gateways);
        // The refusal recorder stops first, so that the last window is
        // closed once, here, while the writer still takes its records.
        tasks.stop_periodic().await;
        app.record_refusals().await;
        let last_checkpoint = app
            .checkpoints
            .clone()
            .map(|checkpoints| (checkpoints, app.audit.store().clone(), app.clock.clone()));
        // The writer ends when its last handle is dropped, after writing
        // what is queued. No connection holds the app any more; a handle
        // taken with `app()` and still held keeps the writer for its holder.
        if let Some(app) = Arc::into_inner(app) {
            drop(app);
            let _ = tasks.background.audit_writer.await;
        }
        // Signed after the last record is committed: the trail as this
        // server leaves it.
        if let Some((checkpoints, store, clock)) = last_checkpoint {
            let trigger = talos_sso_api::checkpoint::trigger::SHUTDOWN;
            if let Err(error) = checkpoints.publish(&store, trigger, clock.now()).await {
                tracing::error!(target: "talos_sso::audit::checkpoint", "no checkpoint signed at shutdown: {error}");
            }
        }
        tracing::info!("stopped");
    }
}

/// The TLS certificate and key with the task that reloads them, or `None`
/// when the configuration asks for plain HTTP.
async fn tls_material(config: &Config) -> Result<Option<(TlsFiles, JoinHandle<()>)>, StartError> {
    match (&config.tls, config.insecure_http) {
        (Some(tls), _) => serve::tls_from_config(tls)
            .await
            .map(Some)
            .map_err(|error| StartError::Tls {
                cert_file: tls.cert_file.clone(),
                key_file: tls.key_file.clone(),
                error,
            }),
        (None, true) => {
            tracing::warn!("serving plain HTTP (insecure_http): only behind a proxy that terminates TLS");
            Ok(None)
        }
        (None, false) => Err(StartError::Config(ConfigError::Invalid(
            "no TLS configured: set `tls` (cert_file, key_file), or `insecure_http: true` behind a TLS proxy"
                .into(),
        ))),
    }
}

/// A listener on `address`, as the serve loop takes it.
fn listen_on(address: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    Ok((tokio::net::TcpListener::from_std(listener)?, local_addr))
}
