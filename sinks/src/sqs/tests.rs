//! The classification of SDK errors (on errors built here: a real server cannot be made to
//! throttle, fail with a 5xx or refuse credentials on demand) and the checks of the options.

use aws_sdk_sqs::error::{ConnectorError, ErrorMetadata};
use aws_sdk_sqs::operation::send_message::SendMessageError;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use watukuy_core::delivery::HandlerErrorKind;

use super::*;

const QUEUE: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo";

fn response(status: u16) -> HttpResponse {
    HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty())
}

/// SQS' answer `status` with `code` and `message`, as the SDK hands it over.
fn answer(status: u16, code: &str, message: &str) -> SdkError<SendMessageError, HttpResponse> {
    let meta = ErrorMetadata::builder().code(code).message(message).build();
    SdkError::service_error(SendMessageError::generic(meta), response(status))
}

fn classified(error: SdkError<SendMessageError, HttpResponse>) -> (HandlerErrorKind, String) {
    let error = classify(error, QUEUE);
    (error.kind().clone(), error.to_string())
}

#[test]
fn throttling_and_the_services_own_trouble_are_transient() {
    for (status, code) in [
        (400, "ThrottlingException"),
        (400, "Throttling"),
        (403, "RequestThrottled"),
        (403, "OverLimit"),
        (403, "AWS.SimpleQueueService.OverLimit"),
        (400, "KmsThrottled"),
        (429, "TooManyRequestsException"),
        (400, "RequestLimitExceeded"),
        (500, "InternalError"),
        (500, "InternalFailure"),
        (503, "ServiceUnavailable"),
        (503, "AWS.SimpleQueueService.ServiceUnavailable"),
        (400, "RequestTimeout"),
        (403, "ExpiredToken"),
        // Any 5xx and 429, whatever the code, or with none.
        (502, "SomethingNew"),
        (504, ""),
        (429, ""),
    ] {
        let (kind, text) = classified(answer(status, code, "try later"));
        assert_eq!(kind, HandlerErrorKind::Transient, "{status} {code}: {text}");
        assert!(text.contains(QUEUE), "{text}");
        assert!(text.contains("try later"), "{text}");
    }
}

#[test]
fn a_missing_queue_is_permanent_and_names_it() {
    for code in [
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    ] {
        let (kind, text) = classified(answer(400, code, "The specified queue does not exist."));
        assert_eq!(kind, HandlerErrorKind::Permanent, "{code}: {text}");
        assert_eq!(
            text,
            format!(
                "sqs: queue {QUEUE} does not exist ({code}: The specified queue does not exist.)"
            )
        );
    }
}

#[test]
fn refused_credentials_and_invalid_requests_are_permanent_with_the_services_message() {
    for (status, code, message) in [
        (403, "AccessDenied", "Access to the resource is denied."),
        (400, "AccessDeniedException", "User is not authorized"),
        (
            403,
            "InvalidClientTokenId",
            "The security token included in the request is invalid.",
        ),
        (
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match.",
        ),
        (
            400,
            "UnrecognizedClientException",
            "The security token is invalid.",
        ),
        (
            403,
            "MissingAuthenticationToken",
            "Request is missing Authentication Token",
        ),
        (
            400,
            "InvalidParameterValue",
            "One or more parameters are invalid. Reason: Message must be shorter than 262144 bytes.",
        ),
        (
            400,
            "MissingParameter",
            "The request must contain the parameter MessageGroupId.",
        ),
        (400, "InvalidMessageContents", "Invalid binary character"),
        (400, "KmsAccessDenied", "The KMS key is not accessible"),
        (
            400,
            "AWS.SimpleQueueService.UnsupportedOperation",
            "Not supported",
        ),
        // An unknown 4xx.
        (400, "SomethingNew", "no"),
    ] {
        let (kind, text) = classified(answer(status, code, message));
        assert_eq!(kind, HandlerErrorKind::Permanent, "{status} {code}: {text}");
        assert_eq!(
            text,
            format!("sqs: SendMessage to {QUEUE}: HTTP {status}, {code}: {message}")
        );
    }
}

#[test]
fn an_error_answered_in_xml_is_read_for_its_code() {
    let xml = "<?xml version=\"1.0\"?>\n<ErrorResponse><Errors><Error>\
               <Code>InvalidClientTokenId</Code><Message>The token &amp; key are invalid.</Message>\
               <Type>Sender</Type></Error></Errors></ErrorResponse>";
    let raw = HttpResponse::new(StatusCode::try_from(403).unwrap(), SdkBody::from(xml));
    let error = SdkError::service_error(
        SendMessageError::generic(ErrorMetadata::builder().build()),
        raw,
    );
    let (kind, text) = classified(error);
    assert_eq!(kind, HandlerErrorKind::Permanent, "{text}");
    assert_eq!(
        text,
        format!(
            "sqs: SendMessage to {QUEUE}: HTTP 403, InvalidClientTokenId: The token & key are invalid."
        )
    );
    // Throttling answered in XML is still throttling.
    let xml = "<ErrorResponse><Error><Code>Throttling</Code></Error></ErrorResponse>";
    let raw = HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::from(xml));
    let error = SdkError::service_error(
        SendMessageError::generic(ErrorMetadata::builder().build()),
        raw,
    );
    let (kind, text) = classified(error);
    assert_eq!(kind, HandlerErrorKind::Transient, "{text}");
    assert!(text.ends_with("HTTP 400, Throttling"), "{text}");
}

#[test]
fn timeouts_connection_errors_and_unreadable_answers_are_transient() {
    let cases: Vec<SdkError<SendMessageError, HttpResponse>> = vec![
        SdkError::timeout_error("operation timeout (all attempts including retries) occurred"),
        SdkError::dispatch_failure(ConnectorError::io("connection refused".into())),
        SdkError::dispatch_failure(ConnectorError::timeout("connect timed out".into())),
        SdkError::dispatch_failure(ConnectorError::other(
            "failed to load credentials".into(),
            None,
        )),
        SdkError::response_error("not JSON: <html>", response(502)),
    ];
    let expected = [
        "request has timed out: operation timeout (all attempts including retries) occurred",
        "dispatch failure: io error: connection refused",
        "dispatch failure: timeout: connect timed out",
        "dispatch failure: other: failed to load credentials",
        "response error: not JSON: <html>",
    ];
    for (error, expected) in cases.into_iter().zip(expected) {
        let (kind, text) = classified(error);
        assert_eq!(kind, HandlerErrorKind::Transient, "{text}");
        assert_eq!(
            text,
            format!("sqs: SendMessage to {QUEUE} failed: {expected}")
        );
    }
}

#[test]
fn a_request_the_sdk_cannot_build_is_permanent() {
    let (kind, text) = classified(SdkError::construction_failure("missing queue_url"));
    assert_eq!(kind, HandlerErrorKind::Permanent, "{text}");
    assert!(text.contains("missing queue_url"), "{text}");
}

fn check(options: SqsOptions) -> Result<(), String> {
    check_urls(&options).map_err(|e| e.to_string())
}

#[test]
fn queue_urls_are_checked() {
    assert_eq!(check(SqsOptions::new(QUEUE)), Ok(()));
    assert_eq!(
        check(SqsOptions::new(
            "http://127.0.0.1:4566/000000000000/q-1_a.fifo"
        )),
        Ok(())
    );
    assert_eq!(
        check(SqsOptions::new("https://sqs.eu-west-1.amazonaws.com/1/orders").standard()),
        Ok(())
    );
    assert_eq!(
        check(SqsOptions::new(" ")),
        Err("sqs.queue_url: must not be empty".into())
    );
    for url in [
        "orders.fifo",
        "sqs.eu-west-1.amazonaws.com/1/orders.fifo",
        "ftp://host/1/orders.fifo",
        "https:///1/orders.fifo",
        "https://host",
        "https://host/1/",
        "https://host/1/orders .fifo",
    ] {
        let error = check(SqsOptions::new(url)).unwrap_err();
        assert!(error.starts_with("sqs.queue_url: "), "{url}: {error}");
    }
    let error = check(SqsOptions::new("https://host/1/or*ders.fifo")).unwrap_err();
    assert!(error.contains("may hold only"), "{error}");

    let error = check(SqsOptions::new("https://host/1/orders")).unwrap_err();
    assert!(
        error.starts_with("sqs.queue_url: ")
            && error.contains("is not a FIFO queue")
            && error.contains("standard()"),
        "{error}"
    );
    let error = check(SqsOptions::new(QUEUE).standard()).unwrap_err();
    assert!(error.contains("drop SqsOptions::standard()"), "{error}");
    let error = check(
        SqsOptions::new("https://host/1/orders")
            .standard()
            .group_id(|e| e.poller.to_string()),
    )
    .unwrap_err();
    assert!(error.starts_with("sqs.group_id: "), "{error}");
    let error = check(SqsOptions::new(QUEUE).endpoint_url("localhost:4566")).unwrap_err();
    assert!(error.starts_with("sqs.endpoint_url: "), "{error}");
    assert_eq!(
        check(SqsOptions::new(QUEUE).endpoint_url("http://127.0.0.1:4566")),
        Ok(())
    );
}

#[test]
fn the_region_of_an_aws_queue_url() {
    let region = |url: &str| url_region(url).map(|r| r.as_ref().to_owned());
    assert_eq!(region(QUEUE).as_deref(), Some("eu-west-1"));
    assert_eq!(
        region("https://sqs.cn-north-1.amazonaws.com.cn/1/q").as_deref(),
        Some("cn-north-1")
    );
    assert_eq!(
        region("https://us-east-2.queue.amazonaws.com/1/q").as_deref(),
        Some("us-east-2")
    );
    assert_eq!(region("http://127.0.0.1:4566/1/q"), None);
    assert_eq!(region("https://sqs.example.com/1/q"), None);
}
