//! RFC 9457 problem details.

use serde_json::{Map, Value};

/// The problem details of an error response (RFC 9457).
///
/// Standard members are kept only when well typed (`status` may be a three-digit string);
/// every other member is kept in [`extensions`](Self::extensions).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct ProblemDetails {
    /// `type`: a URI reference identifying the problem type.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub problem_type: Option<String>,
    /// `title`: a short summary of the problem type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `status`: the status code the origin server generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// `detail`: an explanation specific to this occurrence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `instance`: a URI reference identifying this occurrence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Every non-standard member, as sent.
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

const STANDARD: [&str; 5] = ["type", "title", "status", "detail", "instance"];

impl ProblemDetails {
    /// Parses problem details from a response body.
    ///
    /// Parsed when the content type is `application/problem+json` (any JSON object), or any JSON
    /// type (`application/json`, `*+json`) whose object has at least one well-typed `type`,
    /// `title`, `status` or `detail`. Anything else, malformed JSON included, is `None`.
    ///
    /// ```
    /// use watukuy_http::ProblemDetails;
    ///
    /// let body = br#"{"title":"Out of credit","status":"403","balance":30,"detail":7}"#;
    /// let problem = ProblemDetails::parse(Some("application/problem+json; charset=utf-8"), body)
    ///     .unwrap();
    /// assert_eq!(problem.title.as_deref(), Some("Out of credit"));
    /// assert_eq!(problem.status, Some(403));
    /// assert_eq!(problem.detail, None, "an ill-typed detail is dropped");
    /// assert_eq!(problem.extensions["balance"], 30);
    /// assert!(ProblemDetails::parse(Some("application/json"), br#"{"error":"x"}"#).is_none());
    /// ```
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Option<Self> {
        let media = content_type?
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let is_problem = media == "application/problem+json";
        if !(is_problem || media == "application/json" || media.ends_with("+json")) {
            return None;
        }
        let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        let string = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
        let problem = Self {
            problem_type: string("type"),
            title: string("title"),
            status: object.get("status").and_then(status),
            detail: string("detail"),
            instance: string("instance"),
            extensions: object
                .iter()
                .filter(|(k, _)| !STANDARD.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let recognisable = problem.problem_type.is_some()
            || problem.title.is_some()
            || problem.status.is_some()
            || problem.detail.is_some();
        (is_problem || recognisable).then_some(problem)
    }

    /// The title, or else the detail: what an error message shows.
    pub fn summary(&self) -> Option<&str> {
        self.title
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .or(self.detail.as_deref().filter(|d| !d.trim().is_empty()))
    }
}

/// A status member: an integer or a three-digit string, 100 to 999.
fn status(value: &Value) -> Option<u16> {
    let n = match value {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()?
        }
        _ => return None,
    };
    u16::try_from(n).ok().filter(|n| (100..=999).contains(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(content_type: &str, body: &Value) -> Option<ProblemDetails> {
        ProblemDetails::parse(Some(content_type), body.to_string().as_bytes())
    }

    #[test]
    fn problem_json_keeps_well_typed_members_and_extensions() {
        let p = parse(
            "Application/Problem+JSON",
            &json!({
                "type": "https://example.com/probs/out-of-credit",
                "title": "You do not have enough credit.",
                "status": 403,
                "detail": "Your current balance is 30, but that costs 50.",
                "instance": "/account/12345/msgs/abc",
                "balance": 30,
                "accounts": ["/account/12345"]
            }),
        )
        .unwrap();
        assert_eq!(p.status, Some(403));
        assert_eq!(p.summary(), Some("You do not have enough credit."));
        assert_eq!(p.extensions.len(), 2);
        assert_eq!(p.extensions["accounts"], json!(["/account/12345"]));
        let p = parse("application/problem+json", &json!({})).unwrap();
        assert_eq!(
            p,
            ProblemDetails::default(),
            "an empty problem is still one"
        );
    }

    #[test]
    fn ill_typed_members_are_dropped() {
        let p = parse(
            "application/problem+json",
            &json!({ "type": 1, "title": ["x"], "status": "4xx", "detail": null, "instance": {} }),
        )
        .unwrap();
        assert_eq!(p, ProblemDetails::default());
        for bad in [
            json!(99),
            json!(1000),
            json!(-404),
            json!(404.5),
            json!("0404"),
        ] {
            let p = parse("application/problem+json", &json!({ "status": bad })).unwrap();
            assert_eq!(p.status, None, "{bad}");
        }
        let p = parse("application/problem+json", &json!({ "status": "503" })).unwrap();
        assert_eq!(p.status, Some(503));
    }

    #[test]
    fn plain_json_needs_a_standard_member() {
        assert!(parse("application/json", &json!({ "error": "nope" })).is_none());
        assert!(parse("application/json", &json!({ "title": 5 })).is_none());
        let p = parse("application/vnd.api+json", &json!({ "detail": "gone" })).unwrap();
        assert_eq!(p.summary(), Some("gone"));
        assert!(parse("text/plain", &json!({ "title": "x" })).is_none());
        assert!(ProblemDetails::parse(None, br#"{"title":"x"}"#).is_none());
    }

    #[test]
    fn malformed_bodies_are_none() {
        for body in [
            &b""[..],
            b"{",
            b"[1,2]",
            b"\"title\"",
            b"\xff\xfe",
            b"{\"title\":\"x\"} trailing",
        ] {
            assert!(ProblemDetails::parse(Some("application/problem+json"), body).is_none());
        }
        let deep = "[".repeat(100_000);
        assert!(ProblemDetails::parse(Some("application/problem+json"), deep.as_bytes()).is_none());
    }
}
