//! `application/problem+json` bodies (RFC 9457): any content type and body are read as problem
//! details or not, never a panic; a status is one of 100 to 999, and a summary never grows past
//! the body it came from. The input is the `Content-Type` value, a newline, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watukuy_http::ProblemDetails;

fuzz_target!(|data: &[u8]| {
    let (content_type, body) = match data.iter().position(|b| *b == b'\n') {
        Some(newline) => {
            let (content_type, rest) = data.split_at(newline);
            (content_type, rest.get(1..).unwrap_or_default())
        }
        None => (data, &[][..]),
    };
    let content_type = std::str::from_utf8(content_type).ok();
    let Some(problem) = ProblemDetails::parse(content_type, body) else {
        return;
    };
    assert!(
        problem.status.is_none_or(|s| (100..=999).contains(&s)),
        "{problem:?}"
    );
    if let Some(summary) = problem.summary() {
        assert!(
            summary.len() <= body.len(),
            "{summary:?} from {} bytes",
            body.len()
        );
    }
});
