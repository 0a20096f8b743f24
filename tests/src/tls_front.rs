//! A TLS front for a plain-HTTP test service (the identity provider
//! emulator): a company's provider behind its own certificate authority.
//! It listens first, so that its address can go into the service's
//! configuration, and forwards each connection, after the handshake, to
//! the address given later.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug)]
pub struct TlsFront {
    pub address: SocketAddr,
    upstream: watch::Sender<Option<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Listen on 127.0.0.1 with the certificate and key in `cert`/`key`.
    pub async fn bind(cert: &Path, key: &Path) -> std::io::Result<Self> {
        let config = talos_sso_server::http::serve::load_tls(cert, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (upstream, mut wanted) = watch::channel(None);
        let task = tokio::spawn(async move {
            let Ok(Some(to)) = wanted.wait_for(Option::is_some).await.map(|to| *to) else {
                return;
            };
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Ok(Self {
            address,
            upstream,
            task,
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Forward connections to `to` from now on.
    pub fn forward_to(&self, to: SocketAddr) {
        let _ = self.upstream.send(Some(to));
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
