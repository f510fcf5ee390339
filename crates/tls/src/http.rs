//! The HTTP(S) listener every Leasehold process serves `/metrics` (and the
//! agent `/health`) on: HTTP/1.1 through hyper's own connection builder
//! (for its head-size cap and header-read timeout), an idle timeout on
//! each connection, and — with a [`TlsAcceptor`] — an mTLS handshake first,
//! each request then carrying the caller's [`PeerInfo`] and authorized by
//! the one table ([`crate::authz`]) before it reaches a handler.
//!
//! Shared by the agent's `http_listen` and the allocator's
//! `metrics_listen`: one implementation of the listener limits
//! (`[http_limits]`).

use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::authz::{self, Call, Method};
use crate::server::{PeerInfo, TlsAcceptor};

/// Cap on `http_limits.max_header_bytes`.
pub const MAX_HTTP_HEADER_BYTES: u64 = 1 << 20;
/// Cap on `http_limits.max_body_bytes`.
pub const MAX_HTTP_BODY_BYTES: u64 = 16 << 20;

/// `[http_limits]`: what one caller of an HTTP listener may hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    /// Largest request head (request line and headers); a larger one is
    /// answered 431 and the connection closed.
    pub max_header_bytes: u64,
    /// Largest request body; a declared larger one is answered 413 (the
    /// endpoints read no body).
    pub max_body_bytes: u64,
    /// A request head not complete this long after the server started
    /// waiting for it (a new connection, or the next request on a kept-alive
    /// one) closes the connection: a slow client cannot hold it.
    pub header_read_timeout_ms: u64,
    /// A connection on which nothing is read or written this long is closed.
    pub idle_timeout_ms: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_header_bytes: 16_384,
            max_body_bytes: 65_536,
            header_read_timeout_ms: 5_000,
            idle_timeout_ms: 60_000,
        }
    }
}

/// Refuses a request whose declared body is above `limits.max_body_bytes`
/// (413), at once, and caps any extractor a handler may add through axum's
/// `DefaultBodyLimit`.
pub fn limit_body(router: axum::Router, limits: &HttpLimits) -> axum::Router {
    let body_bytes = usize::try_from(limits.max_body_bytes).unwrap_or(usize::MAX);
    router
        .layer(axum::extract::DefaultBodyLimit::max(body_bytes))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                let declared = request
                    .headers()
                    .get(axum::http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                match declared {
                    Some(length) if length > body_bytes as u64 => {
                        axum::http::StatusCode::PAYLOAD_TOO_LARGE.into_response()
                    }
                    _ => next.run(request).await,
                }
            },
        ))
}

/// Asks the authorization table (ARCHITECTURE §8) before each HTTPS
/// request: `method_of(path)` names the [`Method`], `region` the Region the
/// listener serves (the agent's; `None` for the allocator). A refusal is 403
/// naming the identity and the method, written to the `audit` target
/// (collapsed, [`crate::refusal_log`]); so is a request on a connection
/// whose certificate has expired since it was opened. The
/// caller's [`PeerInfo`] is set per connection by [`serve`].
pub fn authorize(
    router: axum::Router,
    region: Option<String>,
    method_of: fn(&str) -> Method,
) -> axum::Router {
    let region: Option<Arc<str>> = region.map(Into::into);
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let region = region.clone();
            async move {
                let method = method_of(request.uri().path());
                let Some(peer) = request.extensions().get::<PeerInfo>() else {
                    // Served only behind the TLS acceptor, which sets it.
                    return (
                        axum::http::StatusCode::FORBIDDEN,
                        format!("{method}: no verified client identity"),
                    )
                        .into_response();
                };
                if peer.expired_at(std::time::SystemTime::now()) {
                    let identity = peer.identity.to_string();
                    crate::refusal_log::audit(
                        &identity,
                        method.name(),
                        "expired",
                        "the certificate has expired",
                    );
                    return (
                        axum::http::StatusCode::FORBIDDEN,
                        format!("PERMISSION_DENIED: {identity} may not call {method}: the certificate has expired\n"),
                    )
                        .into_response();
                }
                let call = match region.as_deref() {
                    Some(region) => Call::for_region(method, region),
                    None => Call::new(method),
                };
                match authz::authorize(&peer.identity, &call) {
                    Ok(()) => next.run(request).await,
                    Err(denied) => {
                        authz::audit_refusal(&denied);
                        (
                            axum::http::StatusCode::FORBIDDEN,
                            format!("PERMISSION_DENIED: {denied}\n"),
                        )
                            .into_response()
                    }
                }
            }
        },
    ))
}

/// Pause after a failed accept (out of file descriptors, say), so the loop
/// does not spin while the condition lasts.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Serves `router` over HTTP/1.1 on `listener` with `limits`: hyper's head
/// size cap (431) and header-read timeout, and an idle timeout on the
/// connection's I/O ([`IdleTimeout`]). With `tls`, every connection is an
/// mTLS handshake first (bounded like the gRPC listener's, see
/// [`crate::incoming`]) and its requests carry the caller's [`PeerInfo`].
/// Ends when `stop` turns true, closing every connection.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: axum::Router,
    limits: HttpLimits,
    stop: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms.max(1)))
        .max_header_size(usize::try_from(limits.max_header_bytes).unwrap_or(usize::MAX));
    let idle = Duration::from_millis(limits.idle_timeout_ms.max(1));
    match tls {
        Some(acceptor) => {
            use tokio_stream::StreamExt;
            let mut incoming = std::pin::pin!(crate::incoming(listener, acceptor));
            loop {
                let mut stopping = stop.clone();
                let connection = tokio::select! {
                    next = incoming.next() => next,
                    _ = stopping.wait_for(|stop| *stop) => return,
                };
                match connection {
                    Some(Ok(connection)) => {
                        let peer = connection.peer().clone();
                        serve_connection(
                            &builder,
                            &router,
                            &stop,
                            IdleTimeout::new(connection, idle),
                            Some(peer),
                        );
                    }
                    // `incoming` yields no errors; its end ends the server.
                    Some(Err(_)) => continue,
                    None => return,
                }
            }
        }
        None => loop {
            let mut stopping = stop.clone();
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopping.wait_for(|stop| *stop) => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            serve_connection(
                &builder,
                &router,
                &stop,
                IdleTimeout::new(stream, idle),
                None,
            );
        },
    }
}

/// Serves one HTTP connection in its own task until it closes or `stop`
/// turns true; its requests carry `peer` when it is an mTLS connection.
fn serve_connection<S>(
    builder: &hyper::server::conn::http1::Builder,
    router: &axum::Router,
    stop: &watch::Receiver<bool>,
    io: S,
    peer: Option<PeerInfo>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let router = match peer {
        Some(peer) => router.clone().layer(axum::Extension(peer)),
        None => router.clone(),
    };
    let service = hyper_util::service::TowerToHyperService::new(router);
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let mut stopping = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            served = connection => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "HTTP connection closed");
                }
            }
            _ = stopping.wait_for(|stop| *stop) => {}
        }
    });
}

/// A stream that fails with `TimedOut` once nothing was read or written on
/// it for `timeout` while its user waits on it: hyper then drops the
/// connection. Keeps a kept-alive or stalled client from holding a socket.
struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        IdleTimeout {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn touch(&mut self) {
        let next = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// Called when the inner stream is pending: times out past the deadline.
    fn pending<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        match self.deadline.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "HTTP connection idle past http_limits.idle_timeout_ms",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleTimeout<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, buf) {
            std::task::Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.touch();
                }
                std::task::Poll::Ready(result)
            }
            std::task::Poll::Pending => this.pending(cx),
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.inner).poll_write(cx, buf) {
            std::task::Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    this.touch();
                }
                std::task::Poll::Ready(result)
            }
            std::task::Poll::Pending => this.pending(cx),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.inner).poll_flush(cx) {
            std::task::Poll::Pending => this.pending(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
