//! Rate-limit headers: any header block gives counts that are never negative and, at a present
//! after 1970, a reset that is not before 1970 (a delta never wraps), never a panic. The input is a header block as a server sends
//! it, `name: value` per line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watukuy_http::header::{HeaderMap, HeaderName, HeaderValue};
use watukuy_http::parse_rate_limit;

/// 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600_000;

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = line.split_at(colon);
        let value = value.get(1..).unwrap_or_default();
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim_ascii()),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) {
            headers.append(name, value);
        }
    }
    for now in [NOW, 0, i64::MAX, i64::MIN] {
        if let Some(info) = parse_rate_limit(&headers, now) {
            assert!(
                info.limit.is_none_or(|n| n >= 0),
                "{info:?} from {headers:?}"
            );
            assert!(
                info.remaining.is_none_or(|n| n >= 0),
                "{info:?} from {headers:?}"
            );
            assert!(
                now < 0 || info.reset_at.is_none_or(|at| at >= 0),
                "{info:?} at {now} from {headers:?}"
            );
        }
    }
});
