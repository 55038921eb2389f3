//! Rate-limit headers: IETF `RateLimit` / `RateLimit-Policy`, the legacy
//! `RateLimit-*` trio and vendor `X-RateLimit-*` / `X-Rate-Limit-*` headers.

use reqwest::header::HeaderMap;
use watukuy_core::store::{RateLimitInfo, RateLimitSource};

use crate::num::{f64_to_i64, parse_number};

/// A day in milliseconds: epoch-seconds resets older than this are read as deltas.
const DAY_MS: i64 = 86_400_000;

/// Reads rate-limit information from response headers; `now_ms` anchors relative resets.
///
/// The first family that yields any of limit, remaining or reset wins:
///
/// 1. IETF structured fields: `RateLimit: "name";r=<remaining>;t=<seconds>` with
///    `RateLimit-Policy: "name";q=<quota>;w=<window>` (the policy named by `RateLimit` wins,
///    else the first), and the older dictionary form `RateLimit: limit=, remaining=, reset=`.
/// 2. Legacy `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
/// 3. Vendor `X-RateLimit-*` and `X-Rate-Limit-*`, where `…-Reset-After` (seconds) is preferred
///    over `…-Reset`.
///
/// A reset value is read as epoch milliseconds when it is at least 10¹², as epoch seconds when
/// it is at least 10⁹ and not older than a day, and as seconds from now otherwise. (The legacy
/// and IETF headers are specified as seconds from now; the heuristic only changes how values no
/// API would send as a delta are read, so an epoch sent by mistake does not pace for decades.)
///
/// Lenient and total: malformed values (and negative counts) are skipped, and it never panics.
pub fn parse_rate_limit(headers: &HeaderMap, now_ms: i64) -> Option<RateLimitInfo> {
    ietf(headers, now_ms)
        .or_else(|| legacy(headers, now_ms))
        .or_else(|| vendor(headers, now_ms))
}

/// Every value of a header joined with `, ` (as one structured-field list); values that are not
/// visible ASCII are skipped.
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        None
    } else {
        Some(values.join(", "))
    }
}

fn first_number(headers: &HeaderMap, name: &str) -> Option<f64> {
    let value = joined(headers, name)?;
    // `100, 100;w=60` and `100;w=60` both mean 100.
    let first = split_outside_quotes(&value, ',').into_iter().next()?;
    let item = split_outside_quotes(first, ';').into_iter().next()?;
    parse_number(item)
}

/// A quota or a number of requests left: a negative one means nothing and is skipped.
fn count(value: Option<f64>) -> Option<i64> {
    value
        .filter(|v| *v >= 0.0)
        .and_then(|v| f64_to_i64(v.floor()))
}

/// A reset value as epoch milliseconds (see [`parse_rate_limit`]); negative values are ignored.
fn reset_at(value: f64, now_ms: i64) -> Option<i64> {
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    if value >= 1e12 {
        return f64_to_i64(value.round());
    }
    if value >= 1e9 {
        let epoch_ms = f64_to_i64((value * 1000.0).round())?;
        if epoch_ms >= now_ms.saturating_sub(DAY_MS) {
            return Some(epoch_ms);
        }
    }
    delta_at(value, now_ms)
}

/// `now + seconds`.
fn delta_at(seconds: f64, now_ms: i64) -> Option<i64> {
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    Some(now_ms.saturating_add(f64_to_i64((seconds * 1000.0).round())?))
}

fn info(
    limit: Option<i64>,
    remaining: Option<i64>,
    reset_at: Option<i64>,
    policy: Option<String>,
    source: RateLimitSource,
) -> Option<RateLimitInfo> {
    if limit.is_none() && remaining.is_none() && reset_at.is_none() {
        return None;
    }
    Some(RateLimitInfo {
        limit,
        remaining,
        reset_at,
        policy,
        source,
    })
}

/// One member of a structured-field list: its bare item and its parameters.
struct Member<'a> {
    item: &'a str,
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Member<'a> {
    fn parse(text: &'a str) -> Self {
        let mut parts = split_outside_quotes(text, ';').into_iter();
        let item = parts.next().unwrap_or("").trim();
        let params = parts
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => (p.trim(), ""),
            })
            .collect();
        Self { item, params }
    }

    fn param(&self, key: &str) -> Option<&'a str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| *v)
    }

    /// The item as a name (a quoted string unquoted, or a token).
    fn name(&self) -> String {
        unquote(self.item)
    }
}

/// Splits on `sep` outside double-quoted strings (backslash escapes honoured).
fn split_outside_quotes(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut in_quotes, mut escaped, mut start) = (false, false, 0);
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if in_quotes && c == '\\' {
            escaped = true;
        } else if c == '"' {
            in_quotes = !in_quotes;
        } else if c == sep && !in_quotes {
            // `start` and `i` are char boundaries (from char_indices): the slices cannot panic.
            parts.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&text[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn unquote(text: &str) -> String {
    let text = text.trim();
    match text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut escaped = false;
            for c in inner.chars() {
                if escaped || c != '\\' {
                    out.push(c);
                    escaped = false;
                } else {
                    escaped = true;
                }
            }
            out
        }
        None => text.to_owned(),
    }
}

fn ietf(headers: &HeaderMap, now_ms: i64) -> Option<RateLimitInfo> {
    let limit_header = joined(headers, "ratelimit");
    let policy_header = joined(headers, "ratelimit-policy");
    if limit_header.is_none() && policy_header.is_none() {
        return None;
    }
    let members: Vec<Member<'_>> = limit_header
        .as_deref()
        .map(|h| {
            split_outside_quotes(h, ',')
                .into_iter()
                .map(Member::parse)
                .collect()
        })
        .unwrap_or_default();
    let (mut limit, mut remaining, mut reset) = (None, None, None);
    let mut name = None;
    if members.iter().any(|m| m.item.contains('=')) {
        // The older dictionary form: `limit=100, remaining=50, reset=30`.
        for member in &members {
            let Some((key, value)) = member.item.split_once('=') else {
                continue;
            };
            let value = parse_number(value);
            match key.trim().to_ascii_lowercase().as_str() {
                "limit" => limit = count(value),
                "remaining" => remaining = count(value),
                "reset" => reset = value.and_then(|v| reset_at(v, now_ms)),
                _ => {}
            }
        }
    } else if let Some(member) = members.first() {
        name = Some(member.name());
        remaining = count(member.param("r").and_then(parse_number));
        reset = member
            .param("t")
            .and_then(parse_number)
            .and_then(|v| reset_at(v, now_ms));
    }
    if let Some(policy) = &policy_header {
        let policies: Vec<Member<'_>> = split_outside_quotes(policy, ',')
            .into_iter()
            .map(Member::parse)
            .collect();
        let chosen = name
            .as_deref()
            .and_then(|n| policies.iter().find(|p| p.name() == n))
            .or_else(|| policies.first());
        if limit.is_none() {
            // `"name";q=100;w=60`, or the older `100;w=60`.
            limit = count(chosen.and_then(|policy| {
                policy
                    .param("q")
                    .and_then(parse_number)
                    .or_else(|| parse_number(policy.item))
            }));
        }
    }
    info(
        limit,
        remaining,
        reset,
        policy_header,
        RateLimitSource::Ietf,
    )
}

fn legacy(headers: &HeaderMap, now_ms: i64) -> Option<RateLimitInfo> {
    info(
        count(first_number(headers, "ratelimit-limit")),
        count(first_number(headers, "ratelimit-remaining")),
        first_number(headers, "ratelimit-reset").and_then(|v| reset_at(v, now_ms)),
        None,
        RateLimitSource::Legacy,
    )
}

fn vendor(headers: &HeaderMap, now_ms: i64) -> Option<RateLimitInfo> {
    ["x-ratelimit-", "x-rate-limit-"]
        .into_iter()
        .find_map(|prefix| {
            let header = |suffix: &str| first_number(headers, &format!("{prefix}{suffix}"));
            let reset = header("reset-after")
                .and_then(|v| delta_at(v, now_ms))
                .or_else(|| header("reset").and_then(|v| reset_at(v, now_ms)));
            info(
                count(header("limit")),
                count(header("remaining")),
                reset,
                None,
                RateLimitSource::Vendor,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn parse(pairs: &[(&str, &str)]) -> Option<RateLimitInfo> {
        parse_rate_limit(&headers(pairs), NOW)
    }

    /// `pairs` read as `source` with this limit, remaining count and reset time.
    fn assert_reads(
        pairs: &[(&str, &str)],
        source: RateLimitSource,
        expected: (Option<i64>, Option<i64>, Option<i64>),
    ) {
        let info = parse(pairs).expect("a rate limit");
        assert_eq!(info.source, source, "{pairs:?}");
        assert_eq!(
            (info.limit, info.remaining, info.reset_at),
            expected,
            "{pairs:?}"
        );
    }

    #[test]
    fn ietf_structured_fields() {
        let info = parse(&[
            ("RateLimit", "\"default\";r=50;t=30"),
            (
                "RateLimit-Policy",
                "\"burst\";q=10;w=1, \"default\";q=100;w=60",
            ),
        ])
        .unwrap();
        assert_eq!(info.source, RateLimitSource::Ietf);
        assert_eq!(info.remaining, Some(50));
        assert_eq!(info.reset_at, Some(NOW + 30_000));
        assert_eq!(info.limit, Some(100), "the policy named by RateLimit wins");
        assert_eq!(
            info.policy.as_deref(),
            Some("\"burst\";q=10;w=1, \"default\";q=100;w=60")
        );
    }

    #[test]
    fn ietf_unnamed_policy_falls_back_to_the_first() {
        let info = parse(&[
            ("RateLimit", "\"x\";r=0;t=10"),
            ("RateLimit-Policy", "\"other\";q=7;w=10"),
        ])
        .unwrap();
        assert_eq!(info.limit, Some(7));
        assert_eq!(info.remaining, Some(0));
        let info = parse(&[("RateLimit-Policy", "100;w=60")]).unwrap();
        assert_eq!(
            (info.limit, info.remaining, info.reset_at),
            (Some(100), None, None)
        );
    }

    #[test]
    fn ietf_old_dictionary_form() {
        assert_reads(
            &[("RateLimit", "limit=100, remaining=5, reset=12")],
            RateLimitSource::Ietf,
            (Some(100), Some(5), Some(NOW + 12_000)),
        );
    }

    #[test]
    fn legacy_trio() {
        assert_reads(
            &[
                ("RateLimit-Limit", "60"),
                ("RateLimit-Remaining", "59"),
                ("RateLimit-Reset", "58"),
                ("X-RateLimit-Remaining", "1"),
            ],
            RateLimitSource::Legacy,
            (Some(60), Some(59), Some(NOW + 58_000)),
        );
    }

    #[test]
    fn vendor_headers_and_reset_semantics() {
        let info = parse(&[
            ("X-RateLimit-Limit", "5000"),
            ("X-RateLimit-Remaining", "4999"),
            ("X-RateLimit-Reset", "1767225660"),
        ])
        .unwrap();
        assert_eq!(info.source, RateLimitSource::Vendor);
        assert_eq!(info.reset_at, Some(NOW + 60_000), "epoch seconds");
        let info = parse(&[("X-RateLimit-Reset", "1767225660000")]).unwrap();
        assert_eq!(info.reset_at, Some(NOW + 60_000), "epoch milliseconds");
        let info = parse(&[("X-RateLimit-Reset", "1000000000")]).unwrap();
        assert_eq!(
            info.reset_at,
            Some(NOW + 1_000_000_000_000),
            "an epoch older than a day is a delta"
        );
        let info = parse(&[
            ("X-Rate-Limit-Remaining", "3"),
            ("X-Rate-Limit-Reset", "1767225660"),
            ("X-Rate-Limit-Reset-After", "1.5"),
        ])
        .unwrap();
        assert_eq!(info.remaining, Some(3));
        assert_eq!(info.reset_at, Some(NOW + 1_500), "reset-after is preferred");
    }

    #[test]
    fn nothing_usable_is_none() {
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[("RateLimit", "garbage")]), None);
        assert_eq!(parse(&[("X-RateLimit-Limit", "many")]), None);
        assert_eq!(parse(&[("RateLimit-Reset", "-5")]), None);
    }

    #[test]
    fn malformed_input_never_panics() {
        let samples = [
            "",
            ",",
            ";",
            "=",
            "\"",
            "\"\\",
            "\"a\";r",
            "\"a\";r=;t=",
            "a=,b=",
            "1e400",
            "-1e400",
            "NaN",
            "inf",
            "9999999999999999999999",
            "\"é\";r=1",
            "r=1;;;;,,,",
            "\"a\", \"b\"",
            "limit=1e308, remaining=-1e308, reset=1e308",
            "\"d\";r=1;t=1e308",
        ];
        for value in samples {
            for name in [
                "RateLimit",
                "RateLimit-Policy",
                "RateLimit-Limit",
                "RateLimit-Reset",
                "X-RateLimit-Reset",
                "X-RateLimit-Reset-After",
            ] {
                let Ok(v) = HeaderValue::from_str(value) else {
                    continue;
                };
                let mut map = HeaderMap::new();
                map.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), v);
                let _ = parse_rate_limit(&map, NOW);
                let _ = parse_rate_limit(&map, i64::MAX);
                let _ = parse_rate_limit(&map, i64::MIN);
            }
        }
        let mut map = HeaderMap::new();
        map.insert(
            "ratelimit",
            HeaderValue::from_bytes(b"\"\xff\";r=1").unwrap(),
        );
        assert_eq!(
            parse_rate_limit(&map, NOW),
            None,
            "non-ASCII values are skipped"
        );
    }

    /// Found by tests/properties.rs: a negative quota or remaining count was taken as is.
    #[test]
    fn negative_counts_are_skipped() {
        assert_eq!(parse(&[("RateLimit-Policy", "-4509840866133.797")]), None);
        let info = parse(&[("X-RateLimit-Remaining", "-3"), ("X-RateLimit-Limit", "60")])
            .expect("the limit");
        assert_eq!((info.limit, info.remaining), (Some(60), None));
    }
}
