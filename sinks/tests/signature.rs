//! Signature test vectors: known values computed independently, round trips, and rejections.

use std::time::Duration;

use watukuy_sinks::{
    WebhookSecret, WebhookVerifyError, sign_webhook, verify_webhook_signature,
    verify_webhook_signature_with_tolerance,
};

/// The Standard Webhooks reference vector. Recomputed independently with
/// `printf '%s' 'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}' |
///  openssl dgst -sha256 -mac HMAC -macopt hexkey:$(echo -n MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw |
///  base64 -d | xxd -p | tr -d '\n') -binary | base64`.
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STANDARD_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const STANDARD_TS: i64 = 1_614_265_330;
const STANDARD_BODY: &[u8] = br#"{"test": 2432232314}"#;
const STANDARD_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn spec_secret() -> WebhookSecret {
    WebhookSecret::new(STANDARD_SECRET).unwrap()
}

/// Verifies the reference vector's message (its id, timestamp and body) against
/// `signature_header` with `secret`, at `now_secs`.
fn verify_standard(
    secret: &WebhookSecret,
    signature_header: &str,
    now_secs: i64,
) -> Result<(), WebhookVerifyError> {
    verify_webhook_signature(
        secret,
        STANDARD_ID,
        "1614265330",
        STANDARD_BODY,
        signature_header,
        now_secs,
    )
}

#[test]
fn whsec_secret_matches_the_standard_webhooks_vector() {
    assert_eq!(
        sign_webhook(&spec_secret(), STANDARD_ID, STANDARD_TS, STANDARD_BODY),
        STANDARD_SIGNATURE
    );
    assert_eq!(
        verify_standard(&spec_secret(), STANDARD_SIGNATURE, STANDARD_TS),
        Ok(())
    );
}

#[test]
fn raw_secret_is_used_as_utf8_bytes() {
    // printf '%s' 'evt_1.1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'plain-secret' -binary | base64
    let secret = WebhookSecret::new("plain-secret").unwrap();
    assert_eq!(
        sign_webhook(&secret, "evt_1", 1_700_000_000, br#"{"a":1}"#),
        "v1,wKhIRO95CwgkVRfQoJ5oO40goe0AQm3d2QjVzZkvLnA="
    );
}

#[test]
fn sign_then_verify_round_trips() {
    let secret = WebhookSecret::new("whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=").unwrap();
    let body = br#"{"specversion":"1.0","id":"abc"}"#;
    for ts in [0_i64, 1_700_000_000, 4_102_444_800] {
        let signature = sign_webhook(&secret, "abc", ts, body);
        assert_eq!(
            verify_webhook_signature(&secret, "abc", &ts.to_string(), body, &signature, ts),
            Ok(())
        );
    }
}

#[test]
fn tampering_and_wrong_secrets_are_rejected() {
    let secret = spec_secret();
    let verify = |id: &str, ts: &str, body: &[u8], header: &str| {
        verify_webhook_signature(&secret, id, ts, body, header, STANDARD_TS)
    };
    let mismatch = Err(WebhookVerifyError::SignatureMismatch);
    assert_eq!(
        verify(
            STANDARD_ID,
            "1614265330",
            br#"{"test": 2432232315}"#,
            STANDARD_SIGNATURE
        ),
        mismatch,
        "tampered body"
    );
    assert_eq!(
        verify("msg_other", "1614265330", STANDARD_BODY, STANDARD_SIGNATURE),
        mismatch,
        "another message id"
    );
    assert_eq!(
        verify(STANDARD_ID, "1614265331", STANDARD_BODY, STANDARD_SIGNATURE),
        mismatch,
        "another timestamp"
    );
    let wrong = WebhookSecret::new("whsec_d3Jvbmctc2VjcmV0").unwrap();
    assert_eq!(
        verify_standard(&wrong, STANDARD_SIGNATURE, STANDARD_TS),
        mismatch,
        "wrong secret"
    );
    assert_eq!(
        verify(
            STANDARD_ID,
            "1614265330",
            STANDARD_BODY,
            "v1,bm90IGEgc2lnbmF0dXJl"
        ),
        mismatch,
        "a signature of the wrong length"
    );
    assert_eq!(
        verify(
            STANDARD_ID,
            "1614265330",
            STANDARD_BODY,
            "v1,***not base64***"
        ),
        mismatch
    );
    assert_eq!(
        verify(STANDARD_ID, "1614265330", STANDARD_BODY, ""),
        Err(WebhookVerifyError::NoSignature)
    );
    assert_eq!(
        verify(
            STANDARD_ID,
            "1614265330",
            STANDARD_BODY,
            "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        ),
        Err(WebhookVerifyError::NoSignature),
        "other schemes are ignored"
    );
    assert!(matches!(
        verify(STANDARD_ID, "yesterday", STANDARD_BODY, STANDARD_SIGNATURE),
        Err(WebhookVerifyError::InvalidTimestamp(_))
    ));
}

#[test]
fn one_matching_signature_among_several_is_enough() {
    let header = format!("v1,Zm9vYmFyYmF6 v1a,ignored {STANDARD_SIGNATURE}  v1,b3RoZXI=");
    assert_eq!(
        verify_standard(&spec_secret(), &header, STANDARD_TS),
        Ok(())
    );
}

#[test]
fn timestamps_outside_the_tolerance_are_rejected() {
    let secret = spec_secret();
    let verify = |now: i64| verify_standard(&secret, STANDARD_SIGNATURE, now);
    assert_eq!(verify(STANDARD_TS + 300), Ok(()), "exactly 5 minutes old");
    assert_eq!(verify(STANDARD_TS - 300), Ok(()), "exactly 5 minutes ahead");
    assert_eq!(
        verify(STANDARD_TS + 301),
        Err(WebhookVerifyError::TimestampTooOld {
            timestamp: STANDARD_TS,
            now: STANDARD_TS + 301,
            tolerance_secs: 300
        })
    );
    assert_eq!(
        verify(STANDARD_TS - 301),
        Err(WebhookVerifyError::TimestampTooNew {
            timestamp: STANDARD_TS,
            now: STANDARD_TS - 301,
            tolerance_secs: 300
        })
    );
    // An old timestamp is refused even with a valid signature, and before any signature check.
    let old = verify_webhook_signature(
        &secret,
        STANDARD_ID,
        "1614265330",
        b"tampered",
        "",
        STANDARD_TS + 3_600,
    );
    assert!(matches!(
        old,
        Err(WebhookVerifyError::TimestampTooOld { .. })
    ));
    // A custom tolerance.
    assert_eq!(
        verify_webhook_signature_with_tolerance(
            &secret,
            STANDARD_ID,
            "1614265330",
            STANDARD_BODY,
            STANDARD_SIGNATURE,
            STANDARD_TS + 3_600,
            Duration::from_secs(3_600)
        ),
        Ok(())
    );
    // Extreme values do not overflow.
    assert!(verify(i64::MIN).is_err());
    assert!(verify(i64::MAX).is_err());
}
