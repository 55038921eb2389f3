//! What a user of OpenTelemetry gets from a real engine run: the spans through
//! `tracing-opentelemetry`, the metrics through `MetricsHooks`, the `metrics` facade and the
//! `metrics-exporter-opentelemetry` bridge, both read back from the SDK's in-memory exporters.
//!
//! Each test installs the OpenTelemetry layer as its thread's `tracing` subscriber and the bridge
//! as its thread's `metrics` recorder, and runs the engine (SQLite in a temporary file, the
//! in-process fake API) on a current-thread runtime on that same thread. No real sleeps: the
//! retry test moves a manual clock.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{
    Aggregation, InMemoryMetricExporter, Instrument, InstrumentKind, PeriodicReader,
    SdkMeterProvider, Stream,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use watukuy_core::backoff::Backoff;
use watukuy_core::clock::{Clock, ManualClock, SystemClock};
use watukuy_core::telemetry::{HISTOGRAM_BUCKETS_MS, MetricsHooks, PollTrace, TraceContext};
use watukuy_core::{
    DeliveryOptions, Engine, Event, FetchContext, HandlerContext, HandlerError, Poller,
    TickOptions, TickResult, cursor,
};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::{FakeApi, FakeApiOptions, fake_items};

const INSTANCE: &str = "otel-test";

// ---------------------------------------------------------------------------------------------
// The OpenTelemetry side: providers with in-memory exporters, and what they exported.
// ---------------------------------------------------------------------------------------------

/// A tracer provider and a meter provider exporting to memory, and the `metrics` bridge.
struct Otel {
    spans: InMemorySpanExporter,
    metrics: InMemoryMetricExporter,
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    recorder: metrics_exporter_opentelemetry::Recorder,
}

impl Otel {
    fn new() -> Self {
        let spans = InMemorySpanExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let metrics = InMemoryMetricExporter::default();
        let reader = PeriodicReader::builder(metrics.clone()).build();
        let (meter_provider, recorder) =
            metrics_exporter_opentelemetry::Recorder::builder("watukuy")
                .with_meter_provider(|builder| {
                    builder.with_reader(reader).with_view(watukuy_histograms)
                })
                .build();
        Self {
            spans,
            metrics,
            tracer_provider,
            meter_provider,
            recorder,
        }
    }

    /// Runs `work` on a current-thread runtime with the OpenTelemetry layer as this thread's
    /// subscriber and the bridge as this thread's `metrics` recorder.
    fn run<T>(&self, work: impl Future<Output = T>) -> T {
        let layer =
            tracing_opentelemetry::layer().with_tracer(self.tracer_provider.tracer("watukuy"));
        let _subscriber =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let _recorder = metrics::set_default_local_recorder(&self.recorder);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(work)
    }

    /// The spans finished since the last call (flushed first).
    fn take_spans(&self) -> Vec<SpanData> {
        self.tracer_provider.force_flush().expect("spans flush");
        let spans = self.spans.get_finished_spans().expect("finished spans");
        self.spans.reset();
        spans
    }

    /// Every data point of the last collection (flushed first; counters are cumulative).
    fn points(&self) -> Vec<Point> {
        self.meter_provider.force_flush().expect("metrics flush");
        let exported = self
            .metrics
            .get_finished_metrics()
            .expect("finished metrics");
        let last = exported.last().expect("one collection at least");
        let mut points = Vec::new();
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                let name = metric.name().to_owned();
                match metric.data() {
                    AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                        points.extend(sum.data_points().map(|p| Point {
                            name: name.clone(),
                            unit: metric.unit().to_owned(),
                            attributes: attributes(p.attributes()),
                            value: Value::Sum(p.value()),
                            bounds: Vec::new(),
                        }));
                    }
                    AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
                        points.extend(histogram.data_points().map(|p| Point {
                            name: name.clone(),
                            unit: metric.unit().to_owned(),
                            attributes: attributes(p.attributes()),
                            value: Value::Histogram(p.count()),
                            bounds: p.bounds().collect(),
                        }));
                    }
                    AggregatedMetrics::F64(MetricData::Gauge(gauge)) => {
                        points.extend(gauge.data_points().map(|p| Point {
                            name: name.clone(),
                            unit: metric.unit().to_owned(),
                            attributes: attributes(p.attributes()),
                            value: Value::Gauge(p.value()),
                            bounds: Vec::new(),
                        }));
                    }
                    other => panic!("{name}: unexpected data {other:?}"),
                }
            }
        }
        points
    }
}

impl Drop for Otel {
    fn drop(&mut self) {
        drop(self.tracer_provider.shutdown());
        drop(self.meter_provider.shutdown());
    }
}

/// The view docs/operations.md shows: watukuy's histograms in `ms` with its buckets.
fn watukuy_histograms(instrument: &Instrument) -> Option<Stream> {
    if instrument.kind() != InstrumentKind::Histogram || !instrument.name().starts_with("watukuy.")
    {
        return None;
    }
    Stream::builder()
        .with_unit("ms")
        .with_aggregation(Aggregation::ExplicitBucketHistogram {
            boundaries: HISTOGRAM_BUCKETS_MS.to_vec(),
            record_min_max: true,
        })
        .build()
        .ok()
}

/// One exported data point.
#[derive(Debug)]
struct Point {
    name: String,
    unit: String,
    attributes: BTreeMap<String, String>,
    value: Value,
    /// A histogram's bucket boundaries.
    bounds: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    /// A counter's cumulative sum.
    Sum(u64),
    /// A histogram's count of recordings.
    Histogram(u64),
    /// A gauge's last value.
    Gauge(f64),
}

fn attributes<'a>(
    kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>,
) -> BTreeMap<String, String> {
    kvs.map(|kv| (kv.key.to_string(), kv.value.as_str().into_owned()))
        .collect()
}

/// The labels every engine metric carries for this run's key.
fn key_labels(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    [("poller", "items"), ("partition", ""), ("lane", "live")]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The points named `name`, as (attributes, value).
fn named<'a>(points: &'a [Point], name: &str) -> Vec<(&'a BTreeMap<String, String>, Value)> {
    points
        .iter()
        .filter(|p| p.name == name)
        .map(|p| (&p.attributes, p.value))
        .collect()
}

/// A span's attribute as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

fn named_spans<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// True when `child`'s parent is `parent`, in the same trace.
fn is_child_of(child: &SpanData, parent: &SpanData) -> bool {
    child.span_context.trace_id() == parent.span_context.trace_id()
        && child.parent_span_id == parent.span_context.span_id()
}

/// A W3C traceparent for a span's context.
fn traceparent_of(span: &SpanData) -> String {
    let context = &span.span_context;
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

// ---------------------------------------------------------------------------------------------
// The engine side: SQLite, the fake API, a recording handler.
// ---------------------------------------------------------------------------------------------

/// The events the handler saw (every attempt, in order).
type Seen = Arc<Mutex<Vec<Event>>>;

struct Run {
    engine: Engine,
    seen: Seen,
    _dir: tempfile::TempDir,
}

/// An engine over a fresh SQLite file whose poller lists `items` fake items. The handler opens
/// its own `handler.work` span and fails every attempt at `fail` (if any).
fn engine(
    clock: Arc<dyn Clock>,
    items: usize,
    fail: Option<&'static str>,
    trace: Option<Arc<dyn TraceContext>>,
) -> Run {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = SqliteStore::open(SqliteOptions::file(dir.path().join("otel.sqlite")))
        .expect("the SQLite store");
    let api = FakeApi::new(FakeApiOptions::new(Arc::clone(&clock)));
    api.seed(fake_items(items)).expect("seeded");
    let poller = Poller::builder::<serde_json::Value>("items")
        .identity_field("id")
        .cursor(cursor::token(None))
        .delivery(DeliveryOptions::default().attempts(2).backoff(Backoff::new(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(1),
        )))
        .fetch(move |ctx: FetchContext| {
            let api = api.clone();
            async move { api.fetch_token(&ctx).await }
        })
        .build()
        .expect("the poller");
    let mut builder = Engine::builder(Arc::new(store))
        .clock(clock)
        .poller(poller)
        .hooks(Arc::new(MetricsHooks::new()))
        .instance_id(INSTANCE);
    if let Some(trace) = trace {
        builder = builder.trace_context(trace);
    }
    let engine = builder.build().expect("the engine");
    let seen: Seen = Arc::default();
    engine
        .on("items", {
            let seen = Arc::clone(&seen);
            move |event: Event, _ctx: HandlerContext| {
                let seen = Arc::clone(&seen);
                async move {
                    let subject = event.subject.clone();
                    tracing::info_span!("handler.work", subject = %subject).in_scope(|| {
                        seen.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(event);
                    });
                    if fail == Some(subject.as_str()) {
                        return Err(HandlerError::transient(format!("{subject} is rejected")));
                    }
                    Ok::<(), HandlerError>(())
                }
            }
        })
        .expect("the handler");
    Run {
        engine,
        seen,
        _dir: dir,
    }
}

async fn tick(engine: &Engine) -> TickResult {
    engine.tick(TickOptions::default()).await.expect("the tick")
}

fn seen(seen: &Seen) -> Vec<Event> {
    seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------

/// One tick that fetches two items and delivers both: the span tree, its attributes, and the
/// metrics with their labels and values.
#[test]
fn a_tick_exports_the_span_tree_and_the_metrics() {
    let otel = Otel::new();
    let run = engine(Arc::new(SystemClock), 2, None, None);
    let result = otel.run(tick(&run.engine));
    assert_eq!(result.delivered, 2, "{result:?}");
    assert_eq!(result.polled.len(), 1, "{result:?}");
    let events = seen(&run.seen);
    assert_eq!(events.len(), 2);

    let spans = otel.take_spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();

    // One lane cycle: the root of the tick's trace.
    let polls = named_spans(&spans, "watukuy.poll");
    assert_eq!(polls.len(), 1, "{names:?}");
    let poll = polls[0];
    assert_eq!(
        poll.parent_span_id,
        SpanId::INVALID,
        "watukuy.poll is a root"
    );
    assert_eq!(attr(poll, "poller").as_deref(), Some("items"));
    assert_eq!(attr(poll, "partition").as_deref(), Some(""));
    assert_eq!(attr(poll, "lane").as_deref(), Some("live"));
    assert_eq!(attr(poll, "instance_id").as_deref(), Some(INSTANCE));
    assert_eq!(attr(poll, "error"), None, "a cycle that did not fail");
    // The traceparent the engine stamped on the events (by default generated per cycle, not
    // the OpenTelemetry span's own context).
    let stamped = attr(poll, "traceparent").expect("the poll records its traceparent");
    assert!(
        watukuy_core::telemetry::is_traceparent(&stamped),
        "{stamped}"
    );
    assert_ne!(stamped, traceparent_of(poll));
    for event in &events {
        assert_eq!(event.traceparent.as_deref(), Some(stamped.as_str()));
    }

    // The fetch of the one page and the commit of its events: children of the poll.
    let fetches = named_spans(&spans, "watukuy.fetch");
    assert_eq!(fetches.len(), 1, "{names:?}");
    let fetch = fetches[0];
    assert!(is_child_of(fetch, poll), "watukuy.fetch under watukuy.poll");
    assert_eq!(attr(fetch, "page").as_deref(), Some("1"));
    let commits = named_spans(&spans, "watukuy.commit");
    assert_eq!(commits.len(), 1, "{names:?}");
    let commit = commits[0];
    assert!(
        is_child_of(commit, poll),
        "watukuy.commit under watukuy.poll"
    );
    assert_eq!(attr(commit, "events").as_deref(), Some("2"));
    assert_eq!(attr(commit, "upserts").as_deref(), Some("2"));
    assert_eq!(attr(commit, "deletes").as_deref(), Some("0"));
    // The fetch ends before the commit starts.
    assert!(fetch.end_time <= commit.start_time);

    // One delivery per event, inside the cycle (the drain after the commit), with the
    // handler's own span under it.
    let delivers = named_spans(&spans, "watukuy.deliver");
    assert_eq!(delivers.len(), 2, "{names:?}");
    for (deliver, event) in delivers.iter().zip(&events) {
        assert!(
            is_child_of(deliver, poll),
            "watukuy.deliver under watukuy.poll"
        );
        assert!(
            commit.end_time <= deliver.start_time,
            "delivered after the commit"
        );
        assert_eq!(attr(deliver, "poller").as_deref(), Some("items"));
        assert_eq!(attr(deliver, "partition").as_deref(), Some(""));
        assert_eq!(attr(deliver, "lane").as_deref(), Some("live"));
        assert_eq!(
            attr(deliver, "event_id").as_deref(),
            Some(event.id.as_str())
        );
        assert_eq!(attr(deliver, "event_type").as_deref(), Some("created"));
        assert_eq!(attr(deliver, "attempt").as_deref(), Some("1"));
        assert_eq!(attr(deliver, "traceparent"), Some(stamped.clone()));
        assert_eq!(attr(deliver, "error"), None);
    }
    let works = named_spans(&spans, "handler.work");
    assert_eq!(works.len(), 2, "{names:?}");
    for (work, deliver) in works.iter().zip(&delivers) {
        assert!(
            is_child_of(work, deliver),
            "the handler's span under watukuy.deliver"
        );
    }
    // Nothing else: a new span name shows up here.
    let mut kinds: Vec<&str> = names.clone();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "handler.work",
            "watukuy.commit",
            "watukuy.deliver",
            "watukuy.fetch",
            "watukuy.poll"
        ],
    );

    // The metrics, with the key's labels.
    let points = otel.points();
    assert_eq!(
        named(&points, "watukuy.items.fetched"),
        [(&key_labels(&[]), Value::Sum(2))]
    );
    assert_eq!(
        named(&points, "watukuy.events.emitted"),
        [(
            &key_labels(&[("watukuy.event.type", "created")]),
            Value::Sum(2)
        )]
    );
    assert_eq!(
        named(&points, "watukuy.events.delivered"),
        [(&key_labels(&[]), Value::Sum(2))]
    );
    assert_eq!(
        named(&points, "watukuy.deliver.duration"),
        [(&key_labels(&[]), Value::Histogram(2))]
    );
    assert_eq!(
        named(&points, "watukuy.poll.duration"),
        [(
            &key_labels(&[("watukuy.outcome", "ok")]),
            Value::Histogram(1)
        )]
    );
    // The schedule's interval (a gauge without `lane`): the default 30 s.
    let key: BTreeMap<String, String> = [("partition", ""), ("poller", "items")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(
        named(&points, "watukuy.schedule.interval"),
        [(&key, Value::Gauge(30_000.0))]
    );
    // With the view, the histograms are in ms with watukuy's buckets.
    for point in points.iter().filter(|p| p.name.ends_with(".duration")) {
        assert_eq!(point.unit, "ms", "{point:?}");
        assert_eq!(point.bounds, HISTOGRAM_BUCKETS_MS, "{point:?}");
    }
    let labels: BTreeMap<&str, usize> = points.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(p.name.as_str()).or_default() += 1;
        m
    });
    for absent in [
        "watukuy.events.retried",
        "watukuy.events.parked",
        "watukuy.errors",
    ] {
        assert!(!labels.contains_key(absent), "{absent} in {labels:?}");
    }
    for point in &points {
        assert!(
            !point.attributes.contains_key("instance_id"),
            "no high-cardinality label: {point:?}"
        );
    }
}

/// A handler that keeps failing one event: the failed attempts carry `error` on their
/// `watukuy.deliver` span, `watukuy.events.retried` and then `watukuy.events.parked` count them.
/// The retry comes from the next tick's outbox drain, which runs before that tick's poll.
#[test]
fn a_retry_and_a_park_show_in_the_spans_and_the_metrics() {
    let otel = Otel::new();
    let clock = Arc::new(ManualClock::new(1_767_225_600_000));
    let run = engine(clock.clone(), 2, Some("item-002"), None);

    let first = otel.run(tick(&run.engine));
    assert_eq!(first.delivered, 1, "{first:?}");
    let spans = otel.take_spans();
    let poll = named_spans(&spans, "watukuy.poll")[0];
    let stamped = attr(poll, "traceparent").expect("a traceparent");
    let delivers = named_spans(&spans, "watukuy.deliver");
    assert_eq!(delivers.len(), 2);
    let failed = delivers
        .iter()
        .find(|d| attr(d, "error").is_some())
        .expect("the failed attempt");
    assert_eq!(attr(failed, "attempt").as_deref(), Some("1"));
    assert_eq!(
        attr(failed, "error").as_deref(),
        Some("item-002 is rejected")
    );
    assert!(is_child_of(failed, poll));

    // Past the backoff (1 s) and the poll interval: the next tick drains the retry first.
    clock.advance(Duration::from_secs(3_600));
    let second = otel.run(tick(&run.engine));
    assert_eq!(second.delivered, 0, "{second:?}");
    let spans = otel.take_spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    let retry = named_spans(&spans, "watukuy.deliver");
    assert_eq!(retry.len(), 1, "{names:?}");
    let retry = retry[0];
    assert_eq!(attr(retry, "attempt").as_deref(), Some("2"));
    assert_eq!(
        attr(retry, "error").as_deref(),
        Some("item-002 is rejected")
    );
    // The drain before the poll runs outside any watukuy.poll span: the retry is the root of
    // its own trace, tied to the cycle that observed the change only by its traceparent field.
    assert_eq!(retry.parent_span_id, SpanId::INVALID, "{spans:?}");
    assert_eq!(attr(retry, "traceparent"), Some(stamped));
    // Then the tick's own cycle (nothing new, so no commit), a trace of its own.
    let polls = named_spans(&spans, "watukuy.poll");
    assert_eq!(polls.len(), 1, "{names:?}");
    assert_ne!(
        polls[0].span_context.trace_id(),
        retry.span_context.trace_id()
    );
    for fetch in named_spans(&spans, "watukuy.fetch") {
        assert!(is_child_of(fetch, polls[0]));
    }
    assert!(
        named_spans(&spans, "watukuy.commit").is_empty(),
        "{names:?}"
    );
    let attempts: Vec<u32> = seen(&run.seen)
        .iter()
        .filter(|e| e.subject == "item-002")
        .map(|e| e.attempt)
        .collect();
    assert_eq!(attempts, [1, 2]);

    let points = otel.points();
    assert_eq!(
        named(&points, "watukuy.events.delivered"),
        [(&key_labels(&[]), Value::Sum(1))]
    );
    assert_eq!(
        named(&points, "watukuy.events.retried"),
        [(&key_labels(&[]), Value::Sum(1))]
    );
    assert_eq!(
        named(&points, "watukuy.events.parked"),
        [(&key_labels(&[("watukuy.kind", "poison")]), Value::Sum(1))]
    );
    // Failed deliveries do not fail the cycle (both polls are `ok`) and are not
    // `watukuy.errors`: retried and parked count them.
    assert_eq!(
        named(&points, "watukuy.poll.duration"),
        [(
            &key_labels(&[("watukuy.outcome", "ok")]),
            Value::Histogram(2)
        )]
    );
    assert!(named(&points, "watukuy.errors").is_empty());
}

/// A [`TraceContext`] that stamps events with the OpenTelemetry context of the current span,
/// which is `watukuy.poll` when the engine asks: consumers then continue the poll's trace.
struct OtelTraceContext;

impl TraceContext for OtelTraceContext {
    fn traceparent(&self, _poll: &PollTrace<'_>) -> Option<String> {
        let context = tracing::Span::current().context();
        let span = context.span();
        let span = span.span_context();
        span.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                span.trace_id(),
                span.span_id(),
                span.trace_flags().to_u8()
            )
        })
    }
}

#[test]
fn an_opentelemetry_trace_context_stamps_the_poll_span_on_the_events() {
    let otel = Otel::new();
    let run = engine(
        Arc::new(SystemClock),
        2,
        None,
        Some(Arc::new(OtelTraceContext)),
    );
    otel.run(tick(&run.engine));
    let spans = otel.take_spans();
    let poll = named_spans(&spans, "watukuy.poll")[0];
    let expected = traceparent_of(poll);
    assert_eq!(attr(poll, "traceparent"), Some(expected.clone()));
    let events = seen(&run.seen);
    assert_eq!(events.len(), 2);
    for event in &events {
        assert_eq!(event.traceparent.as_deref(), Some(expected.as_str()));
    }
    for deliver in named_spans(&spans, "watukuy.deliver") {
        assert_eq!(attr(deliver, "traceparent"), Some(expected.clone()));
    }
}
