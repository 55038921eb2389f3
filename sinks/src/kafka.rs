//! The Kafka sink: one record per event, keyed by the event's subject, acknowledged by every
//! in-sync replica.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::{BackoffConfig, BackoffError};
use serde_json::Value;
use tokio::sync::Mutex;
use watukuy_core::{Event, HandlerContext, HandlerError, HandlerResult, delivery::Handler};

use crate::format::{CLOUDEVENTS_CONTENT_TYPE, JSON_CONTENT_TYPE, KeyFn};

/// How long one delivery may take by default, (re)connecting and the acknowledgement included:
/// 10 seconds.
pub const DEFAULT_KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The header carrying a record's content type (the CloudEvents Kafka binding's name for it).
pub const KAFKA_CONTENT_TYPE_HEADER: &str = "content-type";

/// How a [`KafkaSink`] lays an event out in a record: the two content modes of the CloudEvents
/// Kafka protocol binding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KafkaFormat {
    /// The default. Value = the event's `data` as JSON (`null` for a delete); every CloudEvents
    /// attribute in a `ce_<name>` header (`ce_id`, `ce_type`, `ce_source`, `ce_subject`,
    /// `ce_time`, `ce_specversion` and the `ce_watukuy*` extensions, `ce_traceparent` when set);
    /// `content-type: application/json`.
    #[default]
    Binary,
    /// Value = the CloudEvents JSON object ([`Event::to_cloud_event`]);
    /// `content-type: application/cloudevents+json`.
    Structured,
}

/// An option of [`KafkaSink`] that cannot be used, named.
#[derive(Debug, thiserror::Error)]
#[error("kafka.{option}: {message}")]
#[non_exhaustive]
pub struct KafkaConfigError {
    /// The option (`brokers`, `topic`, `timeout`).
    pub option: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl KafkaConfigError {
    fn new(option: &'static str, message: impl Into<String>) -> Self {
        Self {
            option,
            message: message.into(),
        }
    }
}

/// What a [`KafkaSink`] is built from: the bootstrap brokers and the topic, and optionally the
/// format, the record key, the client id and the timeout.
#[derive(Clone)]
pub struct KafkaOptions {
    brokers: Vec<String>,
    topic: String,
    format: KafkaFormat,
    key: Option<KeyFn>,
    client_id: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("format", &self.format)
            .field("key", &self.key.as_ref().map(|_| "<fn>"))
            .field("client_id", &self.client_id)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl KafkaOptions {
    /// Produce to `topic` through the cluster reached at `brokers` (`host:port` each, e.g.
    /// `["127.0.0.1:9092"]`; the client learns the other brokers from them).
    pub fn new<B: Into<String>>(
        brokers: impl IntoIterator<Item = B>,
        topic: impl Into<String>,
    ) -> Self {
        Self {
            brokers: brokers.into_iter().map(Into::into).collect(),
            topic: topic.into(),
            format: KafkaFormat::default(),
            key: None,
            client_id: None,
            timeout: DEFAULT_KAFKA_TIMEOUT,
        }
    }

    /// The record layout: [`KafkaFormat::Binary`] (the default) or [`KafkaFormat::Structured`].
    #[must_use]
    pub fn format(mut self, format: KafkaFormat) -> Self {
        self.format = format;
        self
    }

    /// Derives the record key from the event (default: the event's subject, so the changes of one
    /// item land in one partition, in order). The partition is chosen from the key as Kafka's
    /// own producers choose it (murmur2 of the key's bytes, modulo the partition count), so the
    /// records of a key share a partition with what a Java client produces under that key.
    #[must_use]
    pub fn key(mut self, key: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The client id the brokers see (default: the Kafka client's own).
    #[must_use]
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = Some(client_id.into());
        self
    }

    /// How long one delivery may take, (re)connecting and the acknowledgement included (default
    /// [`DEFAULT_KAFKA_TIMEOUT`]); then the attempt is a transient failure.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Where a record was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaRecordAck {
    /// The partition of the topic.
    pub partition: i32,
    /// The record's offset in the partition.
    pub offset: i64,
}

/// A handler that produces each event as one record to a Kafka topic.
///
/// - key = the event's subject (or [`key`](KafkaOptions::key)), so one item's events stay in one
///   partition, in order; the partition is murmur2 of the key modulo the partition count, as
///   Kafka's default partitioner computes it;
/// - value and headers as [`KafkaFormat`] says: binary mode by default (the data as the value,
///   CloudEvents attributes in `ce_*` headers), or structured mode (the CloudEvent as the value);
/// - timestamp = the event's time (when it was observed).
///
/// The handler acknowledges once the partition's leader answered the produce request sent with
/// `acks=all` (every in-sync replica has the record). The client has no idempotent producer, so
/// a produce the broker wrote but whose answer was lost is written again on the retry: consumers
/// deduplicate on the event id (`ce_id`, or the `id` of a structured record), as every
/// at-least-once consumer must.
///
/// The sink connects on the first delivery and again after a connection failed, so a cluster
/// that is down only makes deliveries fail (transiently) until it is back. A broker that is
/// unreachable, a leader election, too few in-sync replicas or a timeout is transient (the
/// dispatcher retries); a topic that does not exist, an authorization failure, a record larger
/// than the topic takes or a record the broker calls invalid is permanent and parks the event
/// with the broker's message.
#[derive(Clone)]
pub struct KafkaSink {
    brokers: Vec<String>,
    topic: String,
    format: KafkaFormat,
    key: KeyFn,
    client_id: Option<String>,
    timeout: Duration,
    link: Arc<Mutex<Option<Link>>>,
}

/// A connected client and the topic's partitions as last read from the cluster.
struct Link {
    client: Client,
    partitions: Vec<i32>,
    leaders: HashMap<i32, Arc<PartitionClient>>,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The event's subject: the default record key.
fn subject(event: &Event) -> String {
    event.subject.to_string()
}

impl KafkaSink {
    /// A sink for the options' topic. Nothing connects until the first delivery.
    ///
    /// Fails on options that cannot work: no broker, a broker that is not `host:port`, a topic
    /// name Kafka refuses (empty, `.` or `..`, over 249 characters, or characters other than
    /// ASCII letters, digits, `.`, `_` and `-`), a zero timeout.
    pub fn new(options: KafkaOptions) -> Result<Self, KafkaConfigError> {
        check_brokers(&options.brokers)?;
        check_topic(&options.topic)?;
        if options.timeout.is_zero() {
            return Err(KafkaConfigError::new("timeout", "must be more than zero"));
        }
        Ok(Self {
            brokers: options.brokers,
            topic: options.topic,
            format: options.format,
            key: options.key.unwrap_or_else(|| Arc::new(subject)),
            client_id: options.client_id,
            timeout: options.timeout,
            link: Arc::new(Mutex::new(None)),
        })
    }

    /// The topic records go to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The record an event becomes (what [`send`](Self::send) produces).
    fn record(&self, event: &Event) -> Result<Record, HandlerError> {
        let time = DateTime::parse_from_rfc3339(&event.time).map_err(|e| {
            HandlerError::permanent(format!(
                "kafka: event {} has time {:?}, not an RFC 3339 timestamp: {e}",
                event.id, event.time
            ))
        })?;
        let cloud_event = event.to_cloud_event();
        let mut headers = BTreeMap::new();
        let value = match self.format {
            KafkaFormat::Structured => {
                headers.insert(
                    KAFKA_CONTENT_TYPE_HEADER.to_owned(),
                    CLOUDEVENTS_CONTENT_TYPE.as_bytes().to_vec(),
                );
                serde_json::to_vec(&cloud_event).map_err(HandlerError::permanent)?
            }
            KafkaFormat::Binary => {
                let attributes = match serde_json::to_value(&cloud_event) {
                    Ok(Value::Object(attributes)) => attributes,
                    Ok(other) => {
                        return Err(HandlerError::permanent(format!(
                            "kafka: a CloudEvent serialized as {other}, not an object"
                        )));
                    }
                    Err(e) => return Err(HandlerError::permanent(e)),
                };
                for (name, value) in attributes {
                    // The data is the value; its content type is the `content-type` header.
                    if name == "data" || name == "datacontenttype" {
                        continue;
                    }
                    let text = match value {
                        Value::String(text) => text,
                        Value::Null => continue,
                        other => other.to_string(),
                    };
                    headers.insert(format!("ce_{name}"), text.into_bytes());
                }
                headers.insert(
                    KAFKA_CONTENT_TYPE_HEADER.to_owned(),
                    JSON_CONTENT_TYPE.as_bytes().to_vec(),
                );
                match &event.data {
                    Some(data) => data.as_str().as_bytes().to_vec(),
                    None => b"null".to_vec(),
                }
            }
        };
        Ok(Record {
            key: Some((self.key)(event).into_bytes()),
            value: Some(value),
            headers,
            timestamp: time.with_timezone(&Utc),
        })
    }

    /// Produces one event and waits for the partition leader's acknowledgement (`acks=all`).
    pub async fn send(&self, event: &Event) -> Result<KafkaRecordAck, HandlerError> {
        let record = self.record(event)?;
        let key = record.key.clone().unwrap_or_default();
        match tokio::time::timeout(self.timeout, self.produce(&key, record)).await {
            Ok(Ok(ack)) => Ok(ack),
            Ok(Err(failure)) => {
                if failure.reconnect {
                    self.link.lock().await.take();
                }
                Err(failure.error)
            }
            Err(_) => {
                // A hung connection may still look open: start afresh next time.
                self.link.lock().await.take();
                Err(HandlerError::transient(format!(
                    "kafka: no acknowledgement from topic {} within {} ms",
                    self.topic,
                    self.timeout.as_millis()
                )))
            }
        }
    }

    async fn produce(&self, key: &[u8], record: Record) -> Result<KafkaRecordAck, Failure> {
        let leader = self.leader(key).await?;
        let partition = leader.partition();
        let offsets = leader
            .produce(vec![record], Compression::NoCompression)
            .await
            .map_err(|error| self.failure(&error))?;
        match offsets.as_slice() {
            [offset] => Ok(KafkaRecordAck {
                partition,
                offset: *offset,
            }),
            other => Err(Failure {
                error: HandlerError::transient(format!(
                    "kafka: topic {} partition {partition} answered {} offsets for one record",
                    self.topic,
                    other.len()
                )),
                reconnect: true,
            }),
        }
    }

    /// The client of the partition `key` belongs to, connecting first when needed.
    async fn leader(&self, key: &[u8]) -> Result<Arc<PartitionClient>, Failure> {
        let mut guard = self.link.lock().await;
        let link = match guard.take() {
            Some(link) => link,
            None => self.connect().await?,
        };
        let link = guard.insert(link);
        let partition = partition_for_key(key, &link.partitions).ok_or_else(|| Failure {
            error: HandlerError::transient(format!(
                "kafka: topic {} has no partitions in the cluster's metadata",
                self.topic
            )),
            reconnect: true,
        })?;
        if let Some(leader) = link.leaders.get(&partition) {
            return Ok(Arc::clone(leader));
        }
        let leader = link
            .client
            .partition_client(self.topic.clone(), partition, UnknownTopicHandling::Error)
            .await
            .map_err(|error| self.failure(&error))?;
        let leader = Arc::new(leader);
        link.leaders.insert(partition, Arc::clone(&leader));
        Ok(leader)
    }

    /// A new client, with the topic's partitions read from the cluster.
    async fn connect(&self) -> Result<Link, Failure> {
        // One attempt per delivery: the dispatcher retries, with its own backoff and attempt
        // limit. (A broker's request to throttle is still honoured inside the attempt.)
        let mut builder = ClientBuilder::new(self.brokers.clone()).backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(Duration::ZERO),
        });
        if let Some(client_id) = &self.client_id {
            builder = builder.client_id(client_id.as_str());
        }
        let client = builder
            .build()
            .await
            .map_err(|error| self.failure(&error))?;
        let topics = client
            .list_topics()
            .await
            .map_err(|error| self.failure(&error))?;
        let Some(topic) = topics.into_iter().find(|t| t.name == self.topic) else {
            return Err(Failure {
                error: HandlerError::permanent(format!(
                    "kafka: topic {} does not exist on the cluster at {} (create it; the sink \
                     does not)",
                    self.topic,
                    self.brokers.join(",")
                )),
                reconnect: true,
            });
        };
        let mut partitions: Vec<i32> = topic.partitions.into_iter().collect();
        partitions.sort_unstable();
        Ok(Link {
            client,
            partitions,
            leaders: HashMap::new(),
        })
    }

    fn failure(&self, error: &KafkaError) -> Failure {
        classify(error, &self.topic)
    }
}

/// A failed produce: the error for the dispatcher, and whether the connection is dropped so the
/// next delivery starts afresh.
struct Failure {
    error: HandlerError,
    reconnect: bool,
}

/// Transient or permanent, by the broker's error code; connection and protocol failures are
/// transient.
fn classify(error: &KafkaError, topic: &str) -> Failure {
    match error {
        KafkaError::ServerError {
            protocol_error,
            error_message,
            ..
        } => {
            let message = match error_message.as_deref() {
                Some(detail) if !detail.is_empty() => {
                    format!("kafka: topic {topic}: {protocol_error} ({detail})")
                }
                _ => format!("kafka: topic {topic}: {protocol_error}"),
            };
            if is_permanent(*protocol_error) {
                Failure {
                    error: HandlerError::permanent(message),
                    reconnect: matches!(protocol_error, ProtocolError::UnknownTopicOrPartition),
                }
            } else {
                Failure {
                    error: HandlerError::transient(message),
                    reconnect: true,
                }
            }
        }
        // The one attempt failed in a way the client would have retried: name the cause.
        KafkaError::RetryFailed(BackoffError::DeadlineExceded { source, .. }) => Failure {
            error: HandlerError::transient(format!("kafka: topic {topic}: {source}")),
            reconnect: true,
        },
        other => Failure {
            error: HandlerError::transient(format!("kafka: topic {topic}: {other}")),
            reconnect: true,
        },
    }
}

/// The broker errors no retry mends: the topic is gone, the client may not write to it, or the
/// record can never be taken as it is.
fn is_permanent(error: ProtocolError) -> bool {
    matches!(
        error,
        ProtocolError::UnknownTopicOrPartition
            | ProtocolError::InvalidTopicException
            | ProtocolError::TopicAuthorizationFailed
            | ProtocolError::ClusterAuthorizationFailed
            | ProtocolError::TransactionalIdAuthorizationFailed
            | ProtocolError::SaslAuthenticationFailed
            | ProtocolError::MessageTooLarge
            | ProtocolError::RecordListTooLarge
            | ProtocolError::InvalidRecord
            | ProtocolError::CorruptMessage
            | ProtocolError::InvalidTimestamp
            | ProtocolError::UnsupportedForMessageFormat
            | ProtocolError::PolicyViolation
    )
}

/// Kafka's default partitioner for a keyed record: the positive murmur2 hash of the key's bytes
/// modulo the number of partitions. `None` when the topic has no partitions.
fn partition_for_key(key: &[u8], partitions: &[i32]) -> Option<i32> {
    if partitions.is_empty() {
        return None;
    }
    let hash = u32::from_ne_bytes(murmur2(key).to_ne_bytes()) & 0x7fff_ffff;
    let index = usize::try_from(hash).ok()? % partitions.len();
    partitions.get(index).copied()
}

/// MurmurHash2 (32-bit) as Kafka's Java client computes it (`Utils.murmur2`, seed `0x9747b28c`).
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java's length is an int: a key of 4 GiB or more wraps there too.
    #[allow(clippy::cast_possible_truncation)]
    let length = data.len() as u32;
    let mut h = SEED ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

fn check_brokers(brokers: &[String]) -> Result<(), KafkaConfigError> {
    if brokers.is_empty() {
        return Err(KafkaConfigError::new(
            "brokers",
            "must name at least one broker (host:port)",
        ));
    }
    for broker in brokers {
        let valid = broker.rsplit_once(':').is_some_and(|(host, port)| {
            !host.trim().is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !valid || broker.contains("://") {
            return Err(KafkaConfigError::new(
                "brokers",
                format!("{broker:?} is not host:port (for example 127.0.0.1:9092)"),
            ));
        }
    }
    Ok(())
}

fn check_topic(topic: &str) -> Result<(), KafkaConfigError> {
    let error = |message: String| Err(KafkaConfigError::new("topic", message));
    if topic.is_empty() {
        return error("must not be empty".to_owned());
    }
    if topic == "." || topic == ".." {
        return error(format!("{topic:?} is not a topic name Kafka allows"));
    }
    if topic.len() > 249 {
        return error(format!(
            "is {} characters long; Kafka allows at most 249",
            topic.len()
        ));
    }
    match topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => error(format!(
            "{topic:?} contains {c:?}; Kafka allows ASCII letters, digits, '.', '_' and '-'"
        )),
        None => Ok(()),
    }
}

#[async_trait]
impl Handler for KafkaSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "kafka produce", self.send(&event)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_java_client() {
        // The vectors of Kafka's own test of `Utils.murmur2` (clients/.../utils/UtilsTest.java).
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (data, expected) in cases {
            assert_eq!(
                murmur2(data),
                expected,
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn a_key_goes_to_its_partition_and_no_partitions_is_none() {
        // toPositive(murmur2("foobar")) % 3, as Java computes it.
        let positive = (-790_332_482_i32) & 0x7fff_ffff;
        let expected = positive % 3;
        assert_eq!(partition_for_key(b"foobar", &[0, 1, 2]), Some(expected));
        assert_eq!(partition_for_key(b"foobar", &[]), None);
    }

    fn server_error(protocol_error: ProtocolError, message: Option<&str>) -> KafkaError {
        KafkaError::ServerError {
            protocol_error,
            error_message: message.map(str::to_owned),
            request: rskafka::client::error::RequestContext::Partition("orders".into(), 0),
            response: None,
            is_virtual: false,
        }
    }

    #[test]
    fn broker_errors_are_classified_by_code() {
        use watukuy_core::delivery::HandlerErrorKind;
        let permanent = [
            ProtocolError::UnknownTopicOrPartition,
            ProtocolError::TopicAuthorizationFailed,
            ProtocolError::ClusterAuthorizationFailed,
            ProtocolError::MessageTooLarge,
            ProtocolError::RecordListTooLarge,
            ProtocolError::InvalidRecord,
        ];
        for code in permanent {
            let failure = classify(&server_error(code, Some("refused")), "orders");
            assert_eq!(failure.error.kind(), &HandlerErrorKind::Permanent, "{code}");
            assert_eq!(
                failure.error.to_string(),
                format!("kafka: topic orders: {code} (refused)")
            );
        }
        let transient = [
            ProtocolError::LeaderNotAvailable,
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::NotEnoughReplicas,
            ProtocolError::NotEnoughReplicasAfterAppend,
            ProtocolError::RequestTimedOut,
            ProtocolError::BrokerNotAvailable,
            ProtocolError::NetworkException,
            ProtocolError::KafkaStorageError,
            ProtocolError::ThrottlingQuotaExceeded,
        ];
        for code in transient {
            let failure = classify(&server_error(code, None), "orders");
            assert_eq!(failure.error.kind(), &HandlerErrorKind::Transient, "{code}");
            assert!(failure.reconnect, "{code}");
            assert_eq!(
                failure.error.to_string(),
                format!("kafka: topic orders: {code}")
            );
        }
        let timeout = classify(&KafkaError::Timeout, "orders");
        assert_eq!(timeout.error.kind(), &HandlerErrorKind::Transient);
    }
}
