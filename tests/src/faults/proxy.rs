//! A TCP proxy that breaks the path to a service on demand.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lock;

/// A TCP proxy in front of a service, to break the path to it: `down`
/// (connections refused, open ones cut), `up` again on the same port, or
/// cut one connection right after the client sent a given message (the
/// server got it, its answer never arrives).
#[derive(Debug)]
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct ProxyState {
    connections: Vec<tokio::task::AbortHandle>,
    /// Cut the first connection whose client sends these bytes: after
    /// the given time, or never (stalled until [`TcpProxy::down`]).
    cut_after: Option<(Vec<u8>, Option<Duration>)>,
    /// Connections cut that way so far.
    cuts: u64,
}

impl TcpProxy {
    pub async fn start(target: std::net::SocketAddr) -> Result<Self, String> {
        Self::start_on(0, target).await
    }

    /// On a given port (0: any free one).
    pub async fn start_on(port: u16, target: std::net::SocketAddr) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let proxy = Self {
            port,
            target,
            state: Arc::default(),
            accept: Mutex::new(None),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (state, target) = (self.state.clone(), self.target);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state_for_pipe = state.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(upstream) = tokio::net::TcpStream::connect(target).await {
                        pipe(client, upstream, state_for_pipe).await;
                    }
                });
                lock(&state).connections.push(pipe.abort_handle());
            }
        });
        *lock(&self.accept) = Some(task);
    }

    /// Refuse new connections and cut the open ones.
    pub fn down(&self) {
        if let Some(task) = lock(&self.accept).take() {
            task.abort();
        }
        for connection in lock(&self.state).connections.drain(..) {
            connection.abort();
        }
    }

    /// Accept again, on the same port.
    pub async fn up(&self) -> Result<(), String> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .map_err(|e| e.to_string())?;
        self.serve(listener);
        Ok(())
    }

    /// Cut the next connection whose client sends `message`: the service
    /// gets it, its answers no longer reach the client, and the connection
    /// closes after `close_after` (`None`: it stays silent until
    /// [`TcpProxy::down`]).
    pub fn cut_after(&self, message: &[u8], close_after: Option<Duration>) {
        lock(&self.state).cut_after = Some((message.to_vec(), close_after));
    }

    pub fn cuts(&self) -> u64 {
        lock(&self.state).cuts
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.down();
    }
}

async fn pipe(client: tokio::net::TcpStream, upstream: tokio::net::TcpStream, state: Arc<Mutex<ProxyState>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    // Set when the connection is cut: the service's answers are dropped.
    let muted = Arc::new(AtomicBool::new(false));
    let mute = muted.clone();
    let down = tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match upstream_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !mute.load(Ordering::SeqCst) && client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        if !mute.load(Ordering::SeqCst) {
            let _ = client_write.shutdown().await;
        } else {
            // Silent, not closed: the client waits for its answer.
            std::future::pending::<()>().await;
        }
    });
    // `down` cuts this half too.
    lock(&state).connections.push(down.abort_handle());
    let mut buffer = vec![0u8; 64 * 1024];
    // The end of the previous read, so a message split over two reads matches.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match client_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let wanted = lock(&state).cut_after.clone();
        if let Some((message, close_after)) = wanted {
            let mut seen = std::mem::take(&mut tail);
            seen.extend_from_slice(&buffer[..n]);
            if seen.windows(message.len()).any(|w| w == message.as_slice()) {
                let armed = {
                    let mut s = lock(&state);
                    let armed = s.cut_after.take().is_some();
                    s.cuts += u64::from(armed);
                    armed
                };
                if armed {
                    muted.store(true, Ordering::SeqCst);
                    let _ = upstream_write.write_all(&buffer[..n]).await;
                    match close_after {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending::<()>().await,
                    }
                    down.abort();
                    return;
                }
            }
            let keep = message.len().saturating_sub(1).min(seen.len());
            tail = seen[seen.len() - keep..].to_vec();
        }
        if upstream_write.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = upstream_write.shutdown().await;
    let _ = down.await;
}

/// The simple-query message sqlx sends to commit a transaction.
pub const POSTGRES_COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
