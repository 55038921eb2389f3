#![doc = include_str!("../README.md")]

#[cfg(feature = "bullmq")]
mod bullmq;
mod format;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbit;
#[cfg(any(
    feature = "bullmq",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq",
    feature = "sqs",
    feature = "webhook"
))]
mod send;
mod signature;
#[cfg(feature = "sqs")]
mod sqs;
#[cfg(feature = "webhook")]
mod webhook;

#[cfg(feature = "bullmq")]
pub use bullmq::{
    BULLMQ_VERSIONS, BullMqConfigError, BullMqSink, DEFAULT_BULLMQ_PREFIX, DEFAULT_BULLMQ_TIMEOUT,
    JobAdded,
};
pub use format::{
    CLOUDEVENTS_CONTENT_TYPE, EventFormat, JSON_CONTENT_TYPE, KeyFn, SerializedEvent, default_key,
    serialize_event,
};
#[cfg(feature = "kafka")]
pub use kafka::{
    DEFAULT_KAFKA_TIMEOUT, KAFKA_CONTENT_TYPE_HEADER, KafkaConfigError, KafkaFormat, KafkaOptions,
    KafkaRecordAck, KafkaSink,
};
#[cfg(feature = "nats")]
pub use nats::{DEFAULT_NATS_ACK_TIMEOUT, NatsSink};
#[cfg(feature = "rabbitmq")]
pub use rabbit::{DEFAULT_RABBIT_TIMEOUT, RabbitSink};
pub use signature::{
    DEFAULT_WEBHOOK_TOLERANCE, WEBHOOK_SECRET_PREFIX, WebhookSecret, WebhookSecretError,
    WebhookVerifyError, decode_webhook_secret, sign_webhook, verify_webhook_signature,
    verify_webhook_signature_with_tolerance,
};
#[cfg(feature = "sqs")]
pub use sqs::{
    DEFAULT_SQS_TIMEOUT, SQS_CONTENT_TYPE_ATTRIBUTE, SQS_POLLER_ATTRIBUTE, SQS_TYPE_ATTRIBUTE,
    SqsConfigError, SqsOptions, SqsSink,
};
#[cfg(feature = "webhook")]
pub use webhook::{
    DEFAULT_WEBHOOK_TIMEOUT, MAX_WEBHOOK_ERROR_BODY_CHARS, WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER, WebhookConfigError, WebhookDeliveryError,
    WebhookOptions, WebhookSink,
};
