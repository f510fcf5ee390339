//! Times every call of a gRPC service and opens its tracing span, for the
//! allocator's and the agent's Prometheus RPC metrics.
//!
//! [`Timed`] wraps a tonic service (it keeps the service's
//! [`NamedService`] name, so it is added to a router like the service
//! itself). Each call gets an `rpc` span (`method`, `region` when the
//! listener serves one, `code` once answered) that the handler's own spans
//! and events nest in (at debug for a [`Timed::quiet`] service: raft), and
//! its [`RpcObserver`] hears `started` and
//! `finished` (method, gRPC code, latency). Labels are closed sets: the
//! method is one of the service's own names (`_unknown` otherwise: a path
//! is the caller's choice) and the code one of gRPC's 17.
//!
//! The code is read from the response head: tonic answers a refusal
//! "trailers-only" (`grpc-status` in the head), and a unary success carries
//! it in the trailers, so a head without one is `OK`. A call dropped before
//! its answer (the client went away, a timeout) is `Cancelled`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tracing::Instrument;

/// Method label of a path that names none of the service's methods.
pub const UNKNOWN_METHOD: &str = "_unknown";

/// What the metrics of a service hear about each call.
pub trait RpcObserver: Send + Sync + 'static {
    /// A call to `method` began.
    fn started(&self, method: &'static str);
    /// It ended with `code` after `elapsed` (exactly once per `started`).
    fn finished(&self, method: &'static str, code: tonic::Code, elapsed: Duration);
}

/// A tonic service, timed (see the module docs).
pub struct Timed<S> {
    inner: S,
    methods: &'static [&'static str],
    region: Option<Arc<str>>,
    observer: Arc<dyn RpcObserver>,
    /// Spans at debug rather than info (see [`Timed::quiet`]).
    quiet: bool,
}

impl<S: Clone> Clone for Timed<S> {
    fn clone(&self) -> Self {
        Timed {
            inner: self.inner.clone(),
            methods: self.methods,
            region: self.region.clone(),
            observer: self.observer.clone(),
            quiet: self.quiet,
        }
    }
}

impl<S> Timed<S> {
    /// `methods`: the service's method names (the label's closed set);
    /// `region`: the Region the listener serves, a field of every span.
    pub fn new(
        inner: S,
        methods: &'static [&'static str],
        region: Option<&str>,
        observer: Arc<dyn RpcObserver>,
    ) -> Self {
        Timed {
            inner,
            methods,
            region: region.map(Into::into),
            observer,
            quiet: false,
        }
    }

    /// Its `rpc` spans at debug level: for a service whose calls are
    /// machine traffic many times a second (raft), which would otherwise
    /// fill an info-level log. Its metrics are unchanged.
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }
}

impl<S: NamedService> NamedService for Timed<S> {
    const NAME: &'static str = S::NAME;
}

/// The method label of a request path (`/package.Service/Method`).
pub fn method_label(path: &str, methods: &'static [&'static str]) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or_default();
    methods
        .iter()
        .find(|known| **known == name)
        .copied()
        .unwrap_or(UNKNOWN_METHOD)
}

/// The gRPC code of a response head: `grpc-status` when present, else OK.
pub fn code_of(headers: &http::HeaderMap) -> tonic::Code {
    headers.get("grpc-status").map_or(tonic::Code::Ok, |value| {
        tonic::Code::from_bytes(value.as_bytes())
    })
}

/// A code's label: its canonical gRPC name.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Every code's label, for tests and dashboards.
pub const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Reports `finished` exactly once: with the answer's code, or
/// `Cancelled` when the call is dropped first.
struct Finish {
    observer: Arc<dyn RpcObserver>,
    method: &'static str,
    started: Instant,
    done: bool,
}

impl Finish {
    fn finish(&mut self, code: tonic::Code) {
        if !self.done {
            self.done = true;
            self.observer
                .finished(self.method, code, self.started.elapsed());
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

impl<S, B, RB> Service<http::Request<B>> for Timed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path(), self.methods);
        let region = self.region.as_deref();
        let span = if self.quiet {
            tracing::debug_span!("rpc", method, region, code = tracing::field::Empty)
        } else {
            tracing::info_span!("rpc", method, region, code = tracing::field::Empty)
        };
        self.observer.started(method);
        let mut finish = Finish {
            observer: self.observer.clone(),
            method,
            started: Instant::now(),
            done: false,
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(
            async move {
                let result = future.await;
                let code = match &result {
                    Ok(response) => code_of(response.headers()),
                    Err(_) => tonic::Code::Internal,
                };
                tracing::Span::current().record("code", code_name(code));
                finish.finish(code);
                result
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers at once, with `grpc-status` in the head when set.
    #[derive(Clone)]
    struct Answer(Option<&'static str>);

    impl Service<http::Request<()>> for Answer {
        type Response = http::Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let mut response = http::Response::new(());
            if let Some(status) = self.0 {
                response
                    .headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static(status));
            }
            std::future::ready(Ok(response))
        }
    }

    #[derive(Default)]
    struct Seen {
        started: Mutex<Vec<&'static str>>,
        finished: Mutex<Vec<(&'static str, tonic::Code)>>,
    }

    impl RpcObserver for Seen {
        fn started(&self, method: &'static str) {
            self.started.lock().unwrap().push(method);
        }

        fn finished(&self, method: &'static str, code: tonic::Code, _: Duration) {
            self.finished.lock().unwrap().push((method, code));
        }
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    #[tokio::test]
    async fn each_call_is_finished_once_with_its_code_or_cancelled() {
        let seen = Arc::new(Seen::default());
        let mut ok = Timed::new(Answer(None), METHODS, Some("eu"), seen.clone());
        let mut denied = Timed::new(Answer(Some("7")), METHODS, None, seen.clone());
        ok.call(request("/x.Y/Grant")).await.unwrap();
        denied.call(request("/x.Y/Inspect")).await.unwrap();
        drop(ok.call(request("/x.Y/Nope")));
        assert_eq!(
            *seen.started.lock().unwrap(),
            vec!["Grant", "Inspect", UNKNOWN_METHOD]
        );
        assert_eq!(
            *seen.finished.lock().unwrap(),
            vec![
                ("Grant", tonic::Code::Ok),
                ("Inspect", tonic::Code::PermissionDenied),
                (UNKNOWN_METHOD, tonic::Code::Cancelled),
            ]
        );
    }

    /// Answers with the level of the span it was called in.
    #[derive(Clone, Default)]
    struct SpanLevel(Arc<Mutex<Vec<Option<tracing::Level>>>>);

    impl Service<http::Request<()>> for SpanLevel {
        type Response = http::Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let level = tracing::Span::current().metadata().map(|m| *m.level());
            self.0.lock().unwrap().push(level);
            std::future::ready(Ok(http::Response::new(())))
        }
    }

    #[test]
    fn a_quiet_service_opens_its_spans_at_debug() {
        let levels = SpanLevel::default();
        let seen = Arc::new(Seen::default());
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let mut loud = Timed::new(levels.clone(), METHODS, None, seen.clone());
            let mut quiet = Timed::new(levels.clone(), METHODS, None, seen.clone()).quiet();
            drop(loud.call(request("/x.Y/Grant")));
            drop(quiet.call(request("/x.Y/Grant")));
        });
        assert_eq!(
            *levels.0.lock().unwrap(),
            vec![Some(tracing::Level::INFO), Some(tracing::Level::DEBUG)]
        );
    }

    const METHODS: &[&str] = &["Grant", "Inspect"];

    #[test]
    fn method_labels_are_the_services_own_names_only() {
        assert_eq!(
            method_label("/leasehold.allocator.v1.Allocator/Grant", METHODS),
            "Grant"
        );
        assert_eq!(method_label("/x.Y/Inspect", METHODS), "Inspect");
        assert_eq!(method_label("/x.Y/Grant2", METHODS), UNKNOWN_METHOD);
        assert_eq!(method_label("", METHODS), UNKNOWN_METHOD);
    }

    #[test]
    fn codes_come_from_the_head_and_default_to_ok() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(code_of(&headers), tonic::Code::Ok);
        headers.insert("grpc-status", http::HeaderValue::from_static("7"));
        assert_eq!(code_of(&headers), tonic::Code::PermissionDenied);
        for code in 0..17 {
            let name = code_name(tonic::Code::from_i32(code));
            assert!(CODE_NAMES.contains(&name), "{name}");
        }
    }
}
