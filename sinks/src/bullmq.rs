//! The BullMQ sink: adds each event as a job to a BullMQ queue in Redis, with job id = event id.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, ServerErrorKind};
use watukuy_core::{Event, HandlerContext, HandlerError, HandlerResult, delivery::Handler};

use crate::format::{EventFormat, KeyFn, default_key, serialize_event};

/// The key prefix BullMQ uses by default (`bull:<queue>:…`).
pub const DEFAULT_BULLMQ_PREFIX: &str = "bull";

/// How long one add waits for Redis by default: 5 seconds.
pub const DEFAULT_BULLMQ_TIMEOUT: Duration = Duration::from_secs(5);

/// The BullMQ releases whose `Queue.add` this sink writes as (checked key by key against each of
/// them, and with an unmodified `Worker` of each, by the crate's tests).
pub const BULLMQ_VERSIONS: &[&str] = &["5.81.5", "6.7.6"];

/// What `Queue.add(name, data, { jobId })` does in BullMQ's `addStandardJob` script, for a job
/// that is neither delayed, prioritized nor part of a flow, in one atomic script: count the id,
/// set the events stream's default length, and either record a duplicate (a job with this id
/// exists: nothing else changes) or store the job hash, announce it, push it on the wait list
/// and set the marker workers block on (unless the queue is paused or at its concurrency).
///
/// KEYS: 1 wait, 2 meta, 3 id, 4 events, 5 marker, 6 active, 7 the job's hash.
/// ARGV: 1 job id, 2 name, 3 data (JSON), 4 opts (JSON).
/// Returns 1 when the job was added, 0 for a duplicate.
const ADD_JOB: &str = r#"
local rcall = redis.call
local jobId = ARGV[1]
rcall("INCR", KEYS[3])
local maxEvents = rcall("HGET", KEYS[2], "opts.maxLenEvents")
if not maxEvents then
  maxEvents = 10000
  rcall("HSET", KEYS[2], "opts.maxLenEvents", maxEvents)
end
if rcall("EXISTS", KEYS[7]) == 1 then
  rcall("XADD", KEYS[4], "MAXLEN", "~", maxEvents, "*", "event", "duplicated", "jobId", jobId)
  return 0
end
local now = rcall("TIME")
local timestamp = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
rcall("HMSET", KEYS[7], "name", ARGV[2], "data", ARGV[3], "opts", ARGV[4],
      "timestamp", string.format("%d", timestamp), "delay", 0, "priority", 0)
rcall("XADD", KEYS[4], "*", "event", "added", "jobId", jobId, "name", ARGV[2])
local meta = rcall("HMGET", KEYS[2], "paused", "concurrency")
local pausedOrMaxed = meta[1] and true or false
if not pausedOrMaxed and meta[2] then
  pausedOrMaxed = rcall("LLEN", KEYS[6]) >= tonumber(meta[2])
end
rcall("LPUSH", KEYS[1], jobId)
if not pausedOrMaxed then
  rcall("ZADD", KEYS[5], 0, "0")
end
rcall("XADD", KEYS[4], "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId)
return 1
"#;

static ADD_JOB_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ADD_JOB));

/// An option of [`BullMqSink`] that cannot be used, named.
#[derive(Debug, thiserror::Error)]
#[error("bullmq.{option}: {message}")]
#[non_exhaustive]
pub struct BullMqConfigError {
    /// The option (`url`, `queue`, `prefix`).
    pub option: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl BullMqConfigError {
    fn new(option: &'static str, message: impl Into<String>) -> Self {
        Self {
            option,
            message: message.into(),
        }
    }
}

/// Whether [`BullMqSink::add`] added the job or found one with its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobAdded {
    /// The job was stored and pushed on the wait list.
    Added,
    /// A job with this id was there already (a redelivered event): nothing changed but the
    /// queue's `duplicated` event, as BullMQ does.
    Duplicate,
}

/// A handler that adds each event as a job to a [BullMQ](https://docs.bullmq.io) queue, written
/// exactly as BullMQ's own `Queue.add(name, data, { jobId })` writes it, so an unmodified BullMQ
/// `Worker` processes it (the versions checked are [`BULLMQ_VERSIONS`]).
///
/// - job id = the event id: BullMQ keeps the first job with an id, so a redelivered event adds
///   no second job;
/// - job name = `<poller>.<created|updated|deleted>` (or [`name`](Self::name));
/// - job data = the event as JSON, a CloudEvents object by default (or [`format`](Self::format));
/// - job options = `{ jobId, attempts }` (BullMQ's defaults, `attempts` settable).
///
/// The add is one Lua script run atomically in Redis; the handler acknowledges once Redis
/// answered. A connection error or a timeout is transient (the dispatcher retries; the
/// connection is re-established in the background); an error Redis answers (a key of the wrong
/// type under the queue's prefix, a script refused) is permanent and parks the event with
/// Redis' message.
#[derive(Clone)]
pub struct BullMqSink {
    conn: ConnectionManager,
    keys: QueueKeys,
    name: KeyFn,
    format: EventFormat,
    attempts: u32,
    timeout: Duration,
}

/// The keys of one queue: `<prefix>:<queue>:<suffix>`.
#[derive(Clone, Debug)]
struct QueueKeys {
    prefix: String,
    queue: String,
}

impl QueueKeys {
    fn key(&self, suffix: &str) -> String {
        format!("{}:{}:{suffix}", self.prefix, self.queue)
    }
}

impl fmt::Debug for BullMqSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BullMqSink")
            .field("prefix", &self.keys.prefix)
            .field("queue", &self.keys.queue)
            .field("format", &self.format)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

fn queue_keys(prefix: &str, queue: &str) -> Result<QueueKeys, BullMqConfigError> {
    if queue.is_empty() {
        return Err(BullMqConfigError::new("queue", "must not be empty"));
    }
    if queue.contains(':') {
        // BullMQ refuses these names too: `:` separates the parts of its keys.
        return Err(BullMqConfigError::new(
            "queue",
            format!("{queue:?} contains ':', which BullMQ does not allow in a queue name"),
        ));
    }
    if prefix.is_empty() {
        return Err(BullMqConfigError::new("prefix", "must not be empty"));
    }
    Ok(QueueKeys {
        prefix: prefix.to_owned(),
        queue: queue.to_owned(),
    })
}

impl BullMqSink {
    /// A sink adding to `queue` under the default prefix `bull`, through `conn` (a connection
    /// manager reconnects by itself after Redis went away).
    pub fn new(conn: ConnectionManager, queue: &str) -> Result<Self, BullMqConfigError> {
        Ok(Self {
            conn,
            keys: queue_keys(DEFAULT_BULLMQ_PREFIX, queue)?,
            name: Arc::new(default_key),
            format: EventFormat::default(),
            attempts: 0,
            timeout: DEFAULT_BULLMQ_TIMEOUT,
        })
    }

    /// Connects to Redis at `url` (`redis://host:port[/db]`, `rediss://` with the `tls`
    /// features of the `redis` crate) and returns a sink adding to `queue`. A Redis that is
    /// down now fails here, transiently later; the connection is re-established in the
    /// background after it drops.
    pub async fn connect(url: &str, queue: &str) -> Result<Self, BullMqConfigError> {
        queue_keys(DEFAULT_BULLMQ_PREFIX, queue)?;
        let client = redis::Client::open(url)
            .map_err(|e| BullMqConfigError::new("url", redacted_error(url, &e)))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_BULLMQ_TIMEOUT))
            .set_response_timeout(Some(DEFAULT_BULLMQ_TIMEOUT))
            // Reconnect quickly: the dispatcher does the waiting between attempts.
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| BullMqConfigError::new("url", redacted_error(url, &e)))?;
        Self::new(conn, queue)
    }

    /// The key prefix (default `bull`, as BullMQ's `prefix` option).
    pub fn prefix(mut self, prefix: &str) -> Result<Self, BullMqConfigError> {
        self.keys = queue_keys(prefix, &self.keys.queue)?;
        Ok(self)
    }

    /// Derives the job name from the event (default `<poller>.<type>`).
    #[must_use]
    pub fn name(mut self, name: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.name = Arc::new(name);
        self
    }

    /// The job data's shape: a CloudEvents object (the default) or the raw event.
    #[must_use]
    pub fn format(mut self, format: EventFormat) -> Self {
        self.format = format;
        self
    }

    /// BullMQ's `attempts` option: how many times a worker tries the job (default 0, BullMQ's
    /// default: once).
    #[must_use]
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// How long one add waits for Redis (default [`DEFAULT_BULLMQ_TIMEOUT`]); then the attempt
    /// is a transient failure.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds one event as a job and waits for Redis' answer.
    pub async fn add(&self, event: &Event) -> Result<JobAdded, HandlerError> {
        let serialized = serialize_event(event, self.format).map_err(HandlerError::permanent)?;
        let data = String::from_utf8(serialized.body).map_err(HandlerError::permanent)?;
        let opts = serde_json::json!({ "jobId": &*event.id, "attempts": self.attempts });
        let keys = &self.keys;
        let mut invocation = ADD_JOB_SCRIPT.prepare_invoke();
        invocation
            .key(keys.key("wait"))
            .key(keys.key("meta"))
            .key(keys.key("id"))
            .key(keys.key("events"))
            .key(keys.key("marker"))
            .key(keys.key("active"))
            .key(keys.key(&event.id))
            .arg(&*event.id)
            .arg((self.name)(event))
            .arg(data)
            .arg(opts.to_string());
        let mut conn = self.conn.clone();
        let added = tokio::time::timeout(self.timeout, invocation.invoke_async::<i64>(&mut conn))
            .await
            .map_err(|_| {
                HandlerError::transient(format!(
                    "redis did not answer within {} ms",
                    self.timeout.as_millis()
                ))
            })?
            .map_err(classify)?;
        Ok(if added == 1 {
            JobAdded::Added
        } else {
            tracing::debug!(event_id = %event.id, "bullmq: a job with this id exists; BullMQ keeps the first");
            JobAdded::Duplicate
        })
    }
}

/// Connection trouble is transient; what Redis answers is permanent, except the answers that
/// say to come back (loading, a failover, a busy script).
fn classify(error: RedisError) -> HandlerError {
    let transient = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    let message = format!("redis: {error}");
    if transient {
        HandlerError::transient(message)
    } else {
        HandlerError::permanent(message)
    }
}

/// A client error about `url`, without the password the URL may carry.
fn redacted_error(url: &str, error: &RedisError) -> String {
    let text = error.to_string();
    match redis::parse_redis_url(url).and_then(|u| u.password().map(str::to_owned)) {
        Some(password) if !password.is_empty() => text.replace(&password, "***"),
        _ => text,
    }
}

#[async_trait]
impl Handler for BullMqSink {
    async fn handle(&self, event: Event, ctx: HandlerContext) -> HandlerResult {
        crate::send::ack_when_sent(&ctx, "bullmq add", self.add(&event)).await
    }
}
