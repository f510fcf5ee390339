//! The identity check before a request body is read (issue 27, finding 5).
//!
//! tonic decodes a message before the handler (and so the per-call
//! [`crate::gate::Gate`]) runs: a caller whose identity may never call a
//! method would still make the server buffer and decode its body. The
//! [`PreAuthLayer`], a tower layer on the server (`Server::layer`), reads
//! the verified [`PeerInfo`] the TLS listener put in the request's
//! extensions and the method from the request path, and answers
//! PERMISSION_DENIED (trailers-only, the body never polled: hyper resets
//! the stream) when
//!
//! - the connection has no verified identity,
//! - the presented certificate's `notAfter` has passed (a connection
//!   opened before the expiry; [`crate::server`]'s maximum connection age
//!   bounds how long it may live at all), or
//! - the identity's kind may call the method under no request at all
//!   ([`authz::may_ever_call`], derived from the one table: the most
//!   permissive call for that identity — its own Region, a narrow Inspect).
//!
//! Everything else passes on to the service, whose gate applies the
//! fine-grained rules (the Region the request names, Inspect's filter)
//! once the body is decoded within the service's message size bound.
//! Paths of services the layer was not told about (gRPC health) and
//! unknown methods of a known service pass unchanged (tonic answers
//! UNIMPLEMENTED without reading the body). Refusals are audited through
//! [`crate::refusal_log`] (collapsed per identity, method and cause).

use std::sync::Arc;
use std::time::SystemTime;

use futures_util::future::{Either, Ready};
use tonic::codegen::{http, Context, Poll, Service};
use tonic::Status;

use crate::authz::{self, Method};
use crate::refusal_log;
use crate::server::PeerInfo;

/// One gRPC service the layer judges: its full name (tonic's
/// `NamedService::NAME`, `package.Service`) and its methods (each
/// [`Method::name`] is the gRPC method name).
#[derive(Clone, Copy, Debug)]
pub struct GuardedService {
    pub name: &'static str,
    pub methods: &'static [Method],
}

/// Refuses, before the body is read, calls the caller's identity may
/// never make (see the module docs). `enabled` false (a plaintext
/// listener, where nobody is authenticated) passes everything.
#[derive(Clone, Debug)]
pub struct PreAuthLayer {
    services: Arc<[GuardedService]>,
    enabled: bool,
}

impl PreAuthLayer {
    pub fn new(services: &[GuardedService], enabled: bool) -> Self {
        PreAuthLayer {
            services: services.into(),
            enabled,
        }
    }

    /// The method a request path (`/package.Service/Method`) names, when
    /// it is one of the guarded services' methods.
    pub fn method_of(&self, path: &str) -> Option<Method> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let guarded = self.services.iter().find(|s| s.name == service)?;
        guarded.methods.iter().copied().find(|m| m.name() == method)
    }

    /// Why a request on a connection of `peer` to `path` is refused now,
    /// or `None` when it goes on to the service.
    pub fn refusal(&self, path: &str, peer: Option<&PeerInfo>, now: SystemTime) -> Option<Status> {
        if !self.enabled {
            return None;
        }
        let method = self.method_of(path)?;
        let Some(peer) = peer else {
            refusal_log::audit(
                "unauthenticated",
                method.name(),
                "no identity",
                "no verified client identity",
            );
            return Some(Status::permission_denied(format!(
                "{method}: no verified client identity"
            )));
        };
        if peer.expired_at(now) {
            let identity = peer.identity.to_string();
            refusal_log::audit(
                &identity,
                method.name(),
                "expired",
                "the certificate has expired",
            );
            return Some(Status::permission_denied(format!(
                "{identity} may not call {method}: the certificate has expired"
            )));
        }
        if let Err(denied) = authz::may_ever_call(&peer.identity, method) {
            let identity = peer.identity.to_string();
            refusal_log::audit(&identity, method.name(), denied.reason, denied.reason);
            return Some(Status::permission_denied(denied.to_string()));
        }
        None
    }
}

impl<S> tower_layer::Layer<S> for PreAuthLayer {
    type Service = PreAuth<S>;

    fn layer(&self, inner: S) -> PreAuth<S> {
        PreAuth {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`PreAuthLayer`].
#[derive(Clone, Debug)]
pub struct PreAuth<S> {
    inner: S,
    layer: PreAuthLayer,
}

impl<S, B> Service<http::Request<B>> for PreAuth<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    // Not boxed: no allocation and no copy of the service's future (the
    // whole handler) per request.
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let refusal = self.layer.refusal(
            request.uri().path(),
            request.extensions().get::<PeerInfo>(),
            SystemTime::now(),
        );
        match refusal {
            // The request (and its body, never polled) is dropped here.
            Some(status) => Either::Left(futures_util::future::ready(Ok(status.into_http()))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use std::time::Duration;

    const SERVICES: &[GuardedService] = &[
        GuardedService {
            name: "leasehold.allocator.v1.Allocator",
            methods: &[Method::Register, Method::Inspect, Method::CreatePool],
        },
        GuardedService {
            name: "leasehold.allocator.v1.Raft",
            methods: &[Method::AppendEntries, Method::InstallSnapshot],
        },
    ];

    fn peer(identity: Identity, not_after: Option<SystemTime>) -> PeerInfo {
        PeerInfo {
            identity,
            remote_addr: None,
            not_after,
        }
    }

    fn refused(layer: &PreAuthLayer, path: &str, peer: Option<&PeerInfo>) -> bool {
        layer.refusal(path, peer, SystemTime::now()).is_some()
    }

    #[test]
    fn a_kind_that_may_never_call_a_method_is_refused_by_path() {
        let layer = PreAuthLayer::new(SERVICES, true);
        let gateway = peer(Identity::Gateway("eu".into()), None);
        for path in [
            "/leasehold.allocator.v1.Allocator/Register",
            "/leasehold.allocator.v1.Allocator/Inspect",
            "/leasehold.allocator.v1.Raft/AppendEntries",
            "/leasehold.allocator.v1.Raft/InstallSnapshot",
        ] {
            let status = layer
                .refusal(path, Some(&gateway), SystemTime::now())
                .expect("refused");
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            assert!(status.message().contains("gateway/eu"), "{status:?}");
        }
        let region = peer(Identity::Region("eu".into()), None);
        // The fine-grained rules (which Region, Inspect's filter) are the
        // gate's, after decoding: both may still pass here.
        assert!(!refused(
            &layer,
            "/leasehold.allocator.v1.Allocator/Register",
            Some(&region)
        ));
        assert!(!refused(
            &layer,
            "/leasehold.allocator.v1.Allocator/Inspect",
            Some(&region)
        ));
        assert!(refused(
            &layer,
            "/leasehold.allocator.v1.Allocator/CreatePool",
            Some(&region)
        ));
        assert!(refused(
            &layer,
            "/leasehold.allocator.v1.Raft/AppendEntries",
            Some(&region)
        ));
        let node = peer(Identity::Node(2), None);
        assert!(!refused(
            &layer,
            "/leasehold.allocator.v1.Raft/AppendEntries",
            Some(&node)
        ));
    }

    #[test]
    fn unknown_paths_pass_and_a_missing_identity_is_refused() {
        let layer = PreAuthLayer::new(SERVICES, true);
        let gateway = peer(Identity::Gateway("eu".into()), None);
        assert!(!refused(
            &layer,
            "/grpc.health.v1.Health/Check",
            Some(&gateway)
        ));
        assert!(!refused(
            &layer,
            "/leasehold.allocator.v1.Allocator/Bogus",
            Some(&gateway)
        ));
        assert!(!refused(&layer, "garbage", Some(&gateway)));
        assert!(refused(
            &layer,
            "/leasehold.allocator.v1.Allocator/Inspect",
            None
        ));
        let open = PreAuthLayer::new(SERVICES, false);
        assert!(!refused(
            &open,
            "/leasehold.allocator.v1.Allocator/CreatePool",
            None
        ));
    }

    #[test]
    fn an_expired_certificate_is_refused_even_for_allowed_calls() {
        let layer = PreAuthLayer::new(SERVICES, true);
        let now = SystemTime::now();
        let admin = peer(Identity::Admin, Some(now - Duration::from_secs(1)));
        let status = layer
            .refusal(
                "/leasehold.allocator.v1.Allocator/CreatePool",
                Some(&admin),
                now,
            )
            .expect("refused");
        assert!(status.message().contains("expired"), "{status:?}");
        let valid = peer(Identity::Admin, Some(now + Duration::from_secs(60)));
        assert!(layer
            .refusal(
                "/leasehold.allocator.v1.Allocator/CreatePool",
                Some(&valid),
                now
            )
            .is_none());
    }

    #[test]
    fn may_ever_call_agrees_with_the_table() {
        // For every identity kind and method: refused by the layer exactly
        // when no Call the table could see is allowed.
        let identities = [
            Identity::Region("eu".into()),
            Identity::Gateway("eu".into()),
            Identity::Node(1),
            Identity::Prober,
            Identity::Admin,
            Identity::Sre,
        ];
        for identity in &identities {
            for method in Method::ALL {
                let some_call_allowed = ["eu", "us"].iter().any(|region| {
                    [true, false].iter().any(|narrow| {
                        let call = authz::Call {
                            method,
                            region: Some(region),
                            narrow_inspect: *narrow,
                        };
                        authz::authorize(identity, &call).is_ok()
                    })
                }) || authz::authorize(identity, &authz::Call::new(method))
                    .is_ok();
                assert_eq!(
                    authz::may_ever_call(identity, method).is_ok(),
                    some_call_allowed,
                    "{identity} {method}"
                );
            }
        }
    }
}
