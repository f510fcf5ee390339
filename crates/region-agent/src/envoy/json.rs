//! The RLS messages as protojson, for upstream's HTTP `/json` endpoint:
//! a `RateLimitRequest` in (camelCase or snake_case field names, numbers
//! or strings for 64-bit values, units by name or number), a
//! `RateLimitResponse` out (camelCase, defaults left out, durations as
//! `"58s"`), as protojson writes them.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

/// Why a body is not a `RateLimitRequest`: the field and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct JsonError {
    pub field: String,
    pub reason: String,
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> JsonError {
    JsonError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `object[camel]` or `object[snake]`.
fn field<'a>(object: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    object.get(camel).or_else(|| object.get(snake))
}

fn string(value: Option<&Value>, name: &str) -> Result<String, JsonError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(error(name, "expected a string")),
    }
}

/// A protojson integer: a JSON number or a decimal string.
fn integer(value: &Value, name: &str, max: u64) -> Result<u64, JsonError> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    n.filter(|n| *n <= max)
        .ok_or_else(|| error(name, format!("expected an integer in [0, {max}]")))
}

fn unit(value: &Value, name: &str) -> Result<i32, JsonError> {
    match value {
        Value::String(s) => Unit::from_str_name(s)
            .map(|u| u as i32)
            .ok_or_else(|| error(name, "not a unit name")),
        other => Ok(integer(other, name, i32::MAX as u64)? as i32),
    }
}

/// Parses a protojson `RateLimitRequest`.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| error("body", format!("not JSON: {e}")))?;
    let Value::Object(root) = value else {
        return Err(error("body", "expected a JSON object"));
    };
    let mut request = RateLimitRequest {
        domain: string(root.get("domain"), "domain")?,
        ..Default::default()
    };
    if let Some(hits) = field(&root, "hitsAddend", "hits_addend") {
        request.hits_addend = integer(hits, "hits_addend", u32::MAX as u64)? as u32;
    }
    let descriptors = match root.get("descriptors") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(items)) => &items[..],
        Some(_) => return Err(error("descriptors", "expected a list")),
    };
    for (i, item) in descriptors.iter().enumerate() {
        let at = |name: &str| format!("descriptors[{i}].{name}");
        let Value::Object(object) = item else {
            return Err(error(format!("descriptors[{i}]"), "expected an object"));
        };
        let mut descriptor = RateLimitDescriptor::default();
        let entries = match object.get("entries") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(items)) => &items[..],
            Some(_) => return Err(error(at("entries"), "expected a list")),
        };
        for (j, entry) in entries.iter().enumerate() {
            let Value::Object(entry) = entry else {
                return Err(error(
                    format!("descriptors[{i}].entries[{j}]"),
                    "expected an object",
                ));
            };
            descriptor.entries.push(Entry {
                key: string(
                    entry.get("key"),
                    &format!("descriptors[{i}].entries[{j}].key"),
                )?,
                value: string(
                    entry.get("value"),
                    &format!("descriptors[{i}].entries[{j}].value"),
                )?,
            });
        }
        if let Some(Value::Object(limit)) = object.get("limit") {
            descriptor.limit = Some(RateLimitOverride {
                requests_per_unit: match field(limit, "requestsPerUnit", "requests_per_unit") {
                    Some(v) => integer(v, &at("limit.requests_per_unit"), u32::MAX as u64)? as u32,
                    None => 0,
                },
                unit: match limit.get("unit") {
                    Some(v) => unit(v, &at("limit.unit"))?,
                    None => 0,
                },
            });
        }
        if let Some(hits) = field(object, "hitsAddend", "hits_addend") {
            // A wrapper: the number itself, or `{"value": n}`.
            let hits = match hits {
                Value::Object(wrapper) => wrapper.get("value").cloned().unwrap_or(json!(0)),
                other => other.clone(),
            };
            descriptor.hits_addend = Some(UInt64Value {
                value: integer(&hits, &at("hits_addend"), u64::MAX)?,
            });
        }
        request.descriptors.push(descriptor);
    }
    Ok(request)
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A `RateLimitResponse` as protojson (defaults left out).
pub fn response(response: &RateLimitResponse) -> Value {
    let mut root = Map::new();
    root.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let mut object = Map::new();
            object.insert("code".into(), json!(code_name(status.code)));
            if let Some(limit) = &status.current_limit {
                let mut current = Map::new();
                if !limit.name.is_empty() {
                    current.insert("name".into(), json!(limit.name));
                }
                if limit.requests_per_unit != 0 {
                    current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                }
                let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                current.insert("unit".into(), json!(unit));
                object.insert("currentLimit".into(), Value::Object(current));
            }
            if status.limit_remaining != 0 {
                object.insert("limitRemaining".into(), json!(status.limit_remaining));
            }
            if let Some(reset) = &status.duration_until_reset {
                object.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", reset.seconds)),
                );
            }
            Value::Object(object)
        })
        .collect();
    if !statuses.is_empty() {
        root.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        root.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit,
    };
    use envoy_types::pb::google::protobuf::Duration;

    #[test]
    fn requests_read_both_field_spellings_and_units_by_name_or_number() {
        let camel = br#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":"5","unit":"MINUTE"},"hitsAddend":{"value":"0"}}]}"#;
        let snake = br#"{"domain":"d","hits_addend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requests_per_unit":5,"unit":2},"hits_addend":0}]}"#;
        let a = request(camel).unwrap();
        assert_eq!(a, request(snake).unwrap());
        assert_eq!(a.hits_addend, 2);
        let d = &a.descriptors[0];
        assert_eq!(
            (d.entries[0].key.as_str(), d.entries[0].value.as_str()),
            ("k", "v")
        );
        assert_eq!(
            d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            Some((5, 2))
        );
        assert_eq!(d.hits_addend.as_ref().map(|h| h.value), Some(0));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        for (body, field) in [
            (&b"}"[..], "body"),
            (b"[]", "body"),
            (br#"{"domain":3}"#, "domain"),
            (br#"{"domain":"d","descriptors":{}}"#, "descriptors"),
            (
                br#"{"descriptors":[{"entries":[{"key":1}]}]}"#,
                "descriptors[0].entries[0].key",
            ),
            (
                br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "descriptors[0].limit.unit",
            ),
            (br#"{"hitsAddend":-1}"#, "hits_addend"),
        ] {
            assert_eq!(
                request(body).unwrap_err().field,
                field,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn responses_are_protojson_with_defaults_left_out() {
        let ok = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        assert_eq!(response(&ok).to_string(), r#"{"overallCode":"OK"}"#);
        let over = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 10,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration {
                    seconds: 58,
                    nanos: 0,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            response(&over),
            json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [{
                    "code": "OVER_LIMIT",
                    "currentLimit": {"requestsPerUnit": 10, "unit": "MINUTE"},
                    "durationUntilReset": "58s"
                }]
            })
        );
    }
}
