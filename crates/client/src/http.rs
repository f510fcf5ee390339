//! A [`Decision`] as an HTTP answer (ARCHITECTURE §2, §3.7). Pure.
//!
//! | decision | answer |
//! |---|---|
//! | allowed | pass to the backend (its status, e.g. 200); optional quota headers |
//! | RATE_EXCEEDED, CONCURRENCY_EXCEEDED (also from a local fallback bucket, `fallback = true`) | 429 + `Retry-After` |
//! | LIMITER_UNAVAILABLE (fail-closed) | 503 (+ `Retry-After` when the hint is > 0) |
//! | POLICY_ERROR | 500, no `Retry-After` |
//! | denied with no reason (malformed) | 429, the conservative reading |
//!
//! - `Retry-After` = max(1, ceil(retry_ms / 1000)) seconds. A "never" hint
//!   (-1) sends **no** `Retry-After`, and the problem body says retrying will
//!   not help.
//! - Every refusal carries an `application/problem+json` body (type, title,
//!   status, detail; `decisionId` for authenticated callers) and
//!   `Cache-Control: no-store` (a 429 must not be replayed by a cache).
//! - Quota headers in the IETF draft's structured-field syntax
//!   (draft-ietf-httpapi-ratelimit-headers):
//!   `RateLimit-Policy: "<scope>";q=<limit>;w=<window s>` and
//!   `RateLimit: "<scope>";r=<remaining>;t=<s>` — **only for authenticated
//!   callers and only for a scope they may see** ([`Caller`]; default only
//!   `"user"`: a tenant-wide or global remaining count is never shown to a
//!   caller not entitled to it). `t` is the seconds until more is available:
//!   the `Retry-After` value on a refusal (absent for "never"), and on a pass
//!   the time to refill to the limit at limit/window (0 when full). A
//!   decision with an unknown `remaining` (< 0, made from leased blocks) gets
//!   `RateLimit-Policy` only; one with no scope, limit or window gets none.
//! - Unauthenticated callers get a plain refusal: `Retry-After` and a generic
//!   body; no policy names, limits, remaining counts, reset times or ids.

use leasehold_proto::agent::v1::{Decision, Reason};

/// The scopes an authenticated caller sees quota headers for, by default.
pub const DEFAULT_VISIBLE_SCOPES: &[&str] = &["user"];
/// Media type of the refusal bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Who is asking, as far as quota disclosure goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// Not (yet) authenticated: never shown quota figures.
    Anonymous,
    /// Verified; shown quota headers for these scopes only.
    Authenticated { visible_scopes: &'a [&'a str] },
}

impl Caller<'static> {
    /// An authenticated caller who may see only `"user"`-scope quotas.
    pub const fn authenticated() -> Self {
        Caller::Authenticated {
            visible_scopes: DEFAULT_VISIBLE_SCOPES,
        }
    }
}

impl Caller<'_> {
    fn may_see(&self, scope: &str) -> bool {
        match self {
            Caller::Anonymous => false,
            Caller::Authenticated { visible_scopes } => {
                !scope.is_empty() && visible_scopes.contains(&scope)
            }
        }
    }

    fn is_authenticated(&self) -> bool {
        matches!(self, Caller::Authenticated { .. })
    }
}

/// Mapping options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpOptions {
    /// Send quota headers on passed requests too (so clients can self-pace).
    pub quota_headers_on_pass: bool,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            quota_headers_on_pass: true,
        }
    }
}

/// One response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: &'static str,
    pub value: String,
}

/// What the gateway does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpAnswer {
    /// Forward to the backend; add `headers` to its response.
    Pass { headers: Vec<Header> },
    /// Answer now with `status`, `headers` and a problem+json `body`.
    Refuse {
        status: u16,
        headers: Vec<Header>,
        body: String,
    },
}

impl HttpAnswer {
    /// The status the gateway sends itself (None: the backend's).
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpAnswer::Pass { .. } => None,
            HttpAnswer::Refuse { status, .. } => Some(*status),
        }
    }

    pub fn headers(&self) -> &[Header] {
        match self {
            HttpAnswer::Pass { headers } | HttpAnswer::Refuse { headers, .. } => headers,
        }
    }

    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers()
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name))
            .map(|header| header.value.as_str())
    }

    pub fn body(&self) -> Option<&str> {
        match self {
            HttpAnswer::Pass { .. } => None,
            HttpAnswer::Refuse { body, .. } => Some(body),
        }
    }
}

/// `Retry-After` seconds for a hint: max(1, ceil(ms / 1000)); None for a
/// negative ("never") hint.
pub fn retry_after_seconds(retry_after_ms: i64) -> Option<u64> {
    let retry_after_ms = u64::try_from(retry_after_ms).ok()?;
    Some(retry_after_ms.div_ceil(1_000).max(1))
}

/// The HTTP answer for `decision` to `caller`.
pub fn answer(decision: &Decision, caller: Caller<'_>, options: HttpOptions) -> HttpAnswer {
    if decision.allowed {
        let headers = if options.quota_headers_on_pass {
            quota_headers(decision, caller)
        } else {
            Vec::new()
        };
        return HttpAnswer::Pass { headers };
    }
    let refusal = Refusal::of(decision);
    let mut headers = Vec::new();
    if let Some(seconds) = refusal.retry_after_seconds(decision) {
        headers.push(header("Retry-After", seconds.to_string()));
    }
    if refusal == Refusal::TooManyRequests {
        headers.extend(quota_headers(decision, caller));
    }
    headers.push(header("Content-Type", PROBLEM_JSON.to_owned()));
    headers.push(header("Cache-Control", "no-store".to_owned()));
    HttpAnswer::Refuse {
        status: refusal.status(),
        headers,
        body: problem_body(refusal, decision, caller),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    TooManyRequests,
    Unavailable,
    PolicyError,
}

impl Refusal {
    fn of(decision: &Decision) -> Self {
        match decision.reason() {
            Reason::LimiterUnavailable => Refusal::Unavailable,
            Reason::PolicyError => Refusal::PolicyError,
            Reason::RateExceeded
            | Reason::ConcurrencyExceeded
            | Reason::QuotaExceeded
            | Reason::Unspecified => Refusal::TooManyRequests,
        }
    }

    fn status(self) -> u16 {
        match self {
            Refusal::TooManyRequests => 429,
            Refusal::Unavailable => 503,
            Refusal::PolicyError => 500,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Refusal::TooManyRequests => "Too Many Requests",
            Refusal::Unavailable => "Service Unavailable",
            Refusal::PolicyError => "Internal Server Error",
        }
    }

    fn retry_after_seconds(self, decision: &Decision) -> Option<u64> {
        match self {
            Refusal::TooManyRequests => retry_after_seconds(decision.retry_after_ms),
            Refusal::Unavailable if decision.retry_after_ms > 0 => {
                retry_after_seconds(decision.retry_after_ms)
            }
            Refusal::Unavailable | Refusal::PolicyError => None,
        }
    }

    fn detail(self, decision: &Decision, authenticated: bool) -> &'static str {
        let never = decision.retry_after_ms < 0;
        match (self, never, authenticated) {
            (Refusal::TooManyRequests, true, true) => {
                "This request can never succeed under the current limit (it costs more than the \
                 limit allows), so no Retry-After is given: retrying will not help."
            }
            (Refusal::TooManyRequests, true, false) => {
                "This request cannot succeed by retrying, so no Retry-After is given."
            }
            (Refusal::TooManyRequests, false, true) => {
                "Too many requests for this credential. Retry after the interval given in \
                 Retry-After."
            }
            (Refusal::TooManyRequests, false, false) => {
                "Too many requests. Retry after the interval given in Retry-After."
            }
            (Refusal::Unavailable, _, _) => {
                "The rate limiter is unavailable, so the request was not admitted. Retry later."
            }
            (Refusal::PolicyError, _, _) => {
                "The rate-limit policy could not be evaluated for this request."
            }
        }
    }
}

fn header(name: &'static str, value: String) -> Header {
    Header { name, value }
}

fn problem_body(refusal: Refusal, decision: &Decision, caller: Caller<'_>) -> String {
    let authenticated = caller.is_authenticated();
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": refusal.title(),
        "status": refusal.status(),
        "detail": refusal.detail(decision, authenticated),
    });
    if authenticated && !decision.decision_id.is_empty() {
        body["decisionId"] = serde_json::Value::from(decision.decision_id.as_str());
    }
    body.to_string()
}

/// `RateLimit-Policy` and `RateLimit` for the decision's own scope, when the
/// caller may see it.
fn quota_headers(decision: &Decision, caller: Caller<'_>) -> Vec<Header> {
    if !caller.may_see(&decision.scope) || decision.limit <= 0 || decision.window_ms <= 0 {
        return Vec::new();
    }
    let Some(name) = structured_string(&decision.scope) else {
        return Vec::new();
    };
    let window_seconds = decision.window_ms.unsigned_abs().div_ceil(1_000).max(1);
    let mut headers = vec![header(
        "RateLimit-Policy",
        format!("{name};q={};w={window_seconds}", decision.limit),
    )];
    if decision.remaining >= 0 {
        let mut value = format!("{name};r={}", decision.remaining.min(decision.limit));
        if let Some(seconds) = seconds_until_more(decision) {
            value.push_str(&format!(";t={seconds}"));
        }
        headers.push(header("RateLimit", value));
    }
    headers
}

/// `t`: on a refusal the Retry-After seconds (None for "never"); on a pass
/// the seconds to refill to the limit at limit per window.
fn seconds_until_more(decision: &Decision) -> Option<u64> {
    if !decision.allowed {
        return retry_after_seconds(decision.retry_after_ms);
    }
    let limit = u128::from(decision.limit.unsigned_abs());
    let missing =
        u128::from((decision.limit - decision.remaining.min(decision.limit)).unsigned_abs());
    let window_ms = u128::from(decision.window_ms.unsigned_abs());
    let refill_ms = (missing * window_ms).div_ceil(limit);
    u64::try_from(refill_ms.div_ceil(1_000)).ok()
}

/// A structured-field sf-string (RFC 8941 §3.3.3): printable ASCII, with
/// `"` and `\` escaped. None when the text cannot be one.
fn structured_string(text: &str) -> Option<String> {
    if !text.bytes().all(|byte| (0x20..=0x7e).contains(&byte)) {
        return None;
    }
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        if character == '"' || character == '\\' {
            quoted.push('\\');
        }
        quoted.push(character);
    }
    quoted.push('"');
    Some(quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(reason: Reason, retry_after_ms: i64) -> Decision {
        let mut decision = Decision {
            allowed: false,
            decision_id: "r-9f3a61c2e07b4d18".into(),
            policy_id: "P-READ".into(),
            denied_scope: "user".into(),
            scope: "user".into(),
            limit: 20,
            remaining: 0,
            retry_after_ms,
            window_ms: 10_000,
            ..Decision::default()
        };
        decision.set_reason(reason);
        decision
    }

    fn allowed(scope: &str, remaining: i64) -> Decision {
        Decision {
            allowed: true,
            decision_id: "d-1".into(),
            scope: scope.into(),
            limit: 20,
            remaining,
            window_ms: 10_000,
            ..Decision::default()
        }
    }

    fn body_json(answer: &HttpAnswer) -> serde_json::Value {
        serde_json::from_str(answer.body().expect("a refusal has a body")).expect("valid JSON")
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(retry_after_seconds(500), Some(1));
        assert_eq!(retry_after_seconds(3_500), Some(4));
        assert_eq!(retry_after_seconds(0), Some(1));
        assert_eq!(retry_after_seconds(1), Some(1));
        assert_eq!(retry_after_seconds(1_000), Some(1));
        assert_eq!(retry_after_seconds(1_001), Some(2));
        assert_eq!(retry_after_seconds(-1), None);
    }

    #[test]
    fn rate_exceeded_is_429_with_retry_after_and_no_store() {
        let answer = answer(
            &denial(Reason::RateExceeded, 3_500),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(answer.status(), Some(429));
        assert_eq!(answer.header("Retry-After"), Some("4"));
        assert_eq!(
            answer.header("Content-Type"),
            Some("application/problem+json")
        );
        assert_eq!(answer.header("Cache-Control"), Some("no-store"));
    }

    #[test]
    fn concurrency_exceeded_is_429() {
        let answer = answer(
            &denial(Reason::ConcurrencyExceeded, 2_000),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(answer.status(), Some(429));
        assert_eq!(answer.header("Retry-After"), Some("2"));
    }

    #[test]
    fn authenticated_429_carries_exact_draft_quota_headers_for_its_own_scope() {
        let answer = answer(
            &denial(Reason::RateExceeded, 500),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(
            answer.header("RateLimit-Policy"),
            Some("\"user\";q=20;w=10")
        );
        assert_eq!(answer.header("RateLimit"), Some("\"user\";r=0;t=1"));
        assert_eq!(answer.header("Retry-After"), Some("1"));
        let names: Vec<&str> = answer.headers().iter().map(|header| header.name).collect();
        assert_eq!(
            names,
            [
                "Retry-After",
                "RateLimit-Policy",
                "RateLimit",
                "Content-Type",
                "Cache-Control"
            ]
        );
    }

    #[test]
    fn authenticated_pass_carries_remaining_and_refill_seconds() {
        // 5 of 20 missing at 20 per 10 s: 2.5 s to refill → t=3.
        let answer = answer(
            &allowed("user", 15),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(
            answer,
            HttpAnswer::Pass {
                headers: vec![
                    header("RateLimit-Policy", "\"user\";q=20;w=10".into()),
                    header("RateLimit", "\"user\";r=15;t=3".into()),
                ]
            }
        );
        let full = super::answer(
            &allowed("user", 20),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(full.header("RateLimit"), Some("\"user\";r=20;t=0"));
    }

    #[test]
    fn pass_headers_can_be_turned_off() {
        let options = HttpOptions {
            quota_headers_on_pass: false,
        };
        let answer = answer(&allowed("user", 15), Caller::authenticated(), options);
        assert_eq!(answer, HttpAnswer::Pass { headers: vec![] });
    }

    #[test]
    fn unauthenticated_caller_gets_a_plain_429_without_quota_figures() {
        let answer = answer(
            &denial(Reason::RateExceeded, 500),
            Caller::Anonymous,
            HttpOptions::default(),
        );
        assert_eq!(answer.status(), Some(429));
        assert_eq!(answer.header("Retry-After"), Some("1"));
        assert_eq!(answer.header("RateLimit"), None);
        assert_eq!(answer.header("RateLimit-Policy"), None);
        let body = answer.body().unwrap();
        for secret in ["P-READ", "r-9f3a61c2e07b4d18", "20", "user"] {
            assert!(!body.contains(secret), "{secret} leaked in {body}");
        }
        let pass = super::answer(
            &allowed("user", 15),
            Caller::Anonymous,
            HttpOptions::default(),
        );
        assert_eq!(pass, HttpAnswer::Pass { headers: vec![] });
    }

    #[test]
    fn tenant_scope_is_shown_only_to_callers_entitled_to_it() {
        let tenant_denial = Decision {
            scope: "tenant".into(),
            ..denial(Reason::RateExceeded, 500)
        };
        let user_only = answer(
            &tenant_denial,
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(user_only.header("RateLimit-Policy"), None);
        assert_eq!(user_only.header("RateLimit"), None);
        assert_eq!(user_only.header("Retry-After"), Some("1"));
        let admin = Caller::Authenticated {
            visible_scopes: &["user", "tenant"],
        };
        let admin_answer = answer(&tenant_denial, admin, HttpOptions::default());
        assert_eq!(
            admin_answer.header("RateLimit-Policy"),
            Some("\"tenant\";q=20;w=10")
        );
    }

    #[test]
    fn never_hint_sends_no_retry_after_and_says_so() {
        let answer = answer(
            &denial(Reason::RateExceeded, -1),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(answer.status(), Some(429));
        assert_eq!(answer.header("Retry-After"), None);
        assert_eq!(
            answer.header("RateLimit"),
            Some("\"user\";r=0"),
            "no t= for never"
        );
        let detail = body_json(&answer)["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("never succeed") && detail.contains("no Retry-After"));
    }

    #[test]
    fn limiter_unavailable_is_503_not_429() {
        let closed = Decision {
            scope: String::new(),
            ..denial(Reason::LimiterUnavailable, 1_000)
        };
        let answer = answer(&closed, Caller::authenticated(), HttpOptions::default());
        assert_eq!(answer.status(), Some(503));
        assert_eq!(answer.header("Retry-After"), Some("1"));
        assert_eq!(answer.header("RateLimit"), None);
        assert_eq!(answer.header("Cache-Control"), Some("no-store"));
        assert_eq!(body_json(&answer)["title"], "Service Unavailable");
    }

    #[test]
    fn local_fallback_exhausted_is_429() {
        let exhausted = Decision {
            fallback: true,
            ..denial(Reason::RateExceeded, 700)
        };
        let answer = answer(&exhausted, Caller::authenticated(), HttpOptions::default());
        assert_eq!(answer.status(), Some(429));
        assert_eq!(answer.header("Retry-After"), Some("1"));
    }

    #[test]
    fn policy_error_is_500_without_retry_after() {
        let answer = answer(
            &denial(Reason::PolicyError, -1),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(answer.status(), Some(500));
        assert_eq!(answer.header("Retry-After"), None);
    }

    #[test]
    fn problem_body_has_type_title_status_detail_and_decision_id() {
        let answer = answer(
            &denial(Reason::RateExceeded, 500),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        let body = body_json(&answer);
        assert_eq!(body["type"], "about:blank");
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["status"], 429);
        assert!(body["detail"].as_str().unwrap().contains("Retry-After"));
        assert_eq!(body["decisionId"], "r-9f3a61c2e07b4d18");
        let anonymous = super::answer(
            &denial(Reason::RateExceeded, 500),
            Caller::Anonymous,
            HttpOptions::default(),
        );
        assert!(body_json(&anonymous).get("decisionId").is_none());
    }

    #[test]
    fn unknown_remaining_sends_the_policy_only() {
        let answer = answer(
            &allowed("user", -1),
            Caller::authenticated(),
            HttpOptions::default(),
        );
        assert_eq!(
            answer.header("RateLimit-Policy"),
            Some("\"user\";q=20;w=10")
        );
        assert_eq!(answer.header("RateLimit"), None);
    }

    #[test]
    fn scope_names_are_escaped_or_refused_as_structured_strings() {
        assert_eq!(structured_string("a\"b\\c").unwrap(), "\"a\\\"b\\\\c\"");
        assert_eq!(structured_string("caf\u{e9}"), None);
        assert_eq!(structured_string("line\nbreak"), None);
    }
}
