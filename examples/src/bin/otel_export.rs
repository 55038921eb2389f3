//! OpenTelemetry: an engine's traces and metrics sent over OTLP (HTTP/protobuf).
//!
//! Run it with `cargo run -p watukuy-examples --bin otel_export`. It sends to the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (default `http://localhost:4318`, the OTLP/HTTP port of an
//! OpenTelemetry Collector or of Jaeger; `/v1/traces` and `/v1/metrics` are appended), with the
//! other `OTEL_EXPORTER_OTLP_*` variables and `OTEL_SERVICE_NAME` (default
//! `watukuy-otel-export`) as usual. With nothing listening it prints the export errors and still
//! exits 0.
//!
//! What it does: one tick of an engine on SQLite (in memory) against the in-process fake API,
//! which fetches three items, commits three `created` events and delivers them to a handler.
//!
//! - traces: `tracing-opentelemetry`'s layer turns the engine's `tracing` spans into one trace
//!   per lane cycle, `watukuy.poll` with `watukuy.fetch`, `watukuy.commit` and
//!   `watukuy.deliver` (and the handler's own spans) under it;
//! - metrics: `MetricsHooks` records through the `metrics` facade, and
//!   `metrics-exporter-opentelemetry` forwards to an OpenTelemetry meter; a view gives the
//!   duration histograms the unit `ms` and watukuy's bucket boundaries;
//! - the events carry the poll span's own trace context (a `TraceContext` reading the current
//!   span), so a consumer elsewhere can continue the poll's trace.
//!
//! The providers send from their own threads with a blocking HTTP client, so they are built
//! before the tokio runtime and shut down (which flushes them) after it.

use std::process::ExitCode;
use std::sync::Arc;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, Stream};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer as _, fmt};
use watukuy_core::telemetry::{HISTOGRAM_BUCKETS_MS, MetricsHooks, PollTrace, TraceContext};
use watukuy_core::{
    Engine, Event, FetchContext, HandlerContext, HandlerError, Poller, TickOptions, TickResult,
    clock::SystemClock, cursor,
};
use watukuy_store_sqlite::{SqliteOptions, SqliteStore};
use watukuy_testkit::{FakeApi, FakeApiOptions, fake_items};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Stamps events with the W3C traceparent of the current span: `watukuy.poll` when the engine
/// asks, so the traceparent a consumer reads names the poll span itself.
struct CurrentSpan;

impl TraceContext for CurrentSpan {
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

/// The view for watukuy's histograms (all milliseconds): unit `ms`, watukuy's buckets.
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

fn resource() -> Resource {
    let builder = Resource::builder();
    // The builder reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; name the service only
    // when the environment does not.
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("watukuy-otel-export").build()
    }
}

/// One tick: three items fetched, committed and delivered.
async fn run_engine() -> Result<TickResult, BoxError> {
    let api = FakeApi::new(FakeApiOptions::new(Arc::new(SystemClock)));
    api.seed(fake_items(3))?;
    let items = Poller::builder::<serde_json::Value>("items")
        .identity_field("id")
        .cursor(cursor::token(None))
        .fetch(move |ctx: FetchContext| {
            let api = api.clone();
            async move { api.fetch_token(&ctx).await }
        })
        .build()?;
    let engine = Engine::builder(Arc::new(SqliteStore::open(SqliteOptions::in_memory())?))
        .poller(items)
        .hooks(Arc::new(MetricsHooks::new()))
        .trace_context(Arc::new(CurrentSpan))
        .build()?;
    engine.on("items", |event: Event, _ctx: HandlerContext| async move {
        // The handler runs inside `watukuy.deliver`: this span lands under it.
        tracing::info_span!("handle_item", subject = %event.subject).in_scope(|| {
            println!(
                "{} {} (traceparent {})",
                event.event_type,
                event.subject,
                event.traceparent.as_deref().unwrap_or("-")
            );
        });
        Ok::<(), HandlerError>(())
    })?;
    Ok(engine.tick(TickOptions::default()).await?)
}

fn main() -> ExitCode {
    // The exporters' HTTP client is reqwest, built here (through watukuy-http's features) with
    // rustls and no default crypto provider: make ring the process default before building it.
    // An error means a provider is already installed, which is as good.
    drop(rustls::crypto::ring::default_provider().install_default());
    // The exporters: OTLP over HTTP/protobuf, configured by the OTEL_EXPORTER_OTLP_* variables.
    let exporters = SpanExporter::builder()
        .with_http()
        .build()
        .and_then(|spans| Ok((spans, MetricExporter::builder().with_http().build()?)));
    let (span_exporter, metric_exporter) = match exporters {
        Ok(exporters) => exporters,
        Err(error) => {
            eprintln!("the OTLP exporters could not be built: {error}");
            return ExitCode::FAILURE;
        }
    };
    let resource = resource();

    // Traces: a batch processor sends from its own thread.
    let tracer_provider = SdkTracerProvider::builder()
        .with_batch_exporter(span_exporter)
        .with_resource(resource.clone())
        .build();
    // Metrics: the `metrics` facade, bridged to a meter whose periodic reader sends from its
    // own thread (every 60 s, and once more at shutdown).
    let (meter_provider, recorder) = metrics_exporter_opentelemetry::Recorder::builder("watukuy")
        .with_meter_provider(|builder| {
            builder
                .with_periodic_exporter(metric_exporter)
                .with_resource(resource)
                .with_view(watukuy_histograms)
        })
        .build();
    if let Err(error) = metrics::set_global_recorder(recorder) {
        eprintln!("a metrics recorder is already installed: {error}");
        return ExitCode::FAILURE;
    }
    // The engine's spans to OpenTelemetry; its warnings to stderr.
    let installed = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("watukuy")))
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(LevelFilter::WARN),
        )
        .try_init();
    if let Err(error) = installed {
        eprintln!("a tracing subscriber is already installed: {error}");
        return ExitCode::FAILURE;
    }

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("no tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let ran = runtime.block_on(run_engine());
    drop(runtime);
    let code = match ran {
        Ok(tick) => {
            println!(
                "one tick: {} lane cycle(s), {} event(s) delivered",
                tick.polled.len(),
                tick.delivered
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("the engine failed: {error}");
            ExitCode::FAILURE
        }
    };

    // Send what is left and say whether it worked. The span processor's flush reports a failed
    // export (its shutdown does not); the meter provider's shutdown collects, exports and
    // reports. An unreachable collector is reported, not fatal: the exporter retries for a
    // second or two, then gives up.
    let sent = [
        ("traces", tracer_provider.force_flush()),
        ("metrics", meter_provider.shutdown()),
    ];
    for (signal, result) in sent {
        match result {
            Ok(()) => println!("{signal}: sent"),
            Err(error) => eprintln!("{signal}: not sent ({error})"),
        }
    }
    drop(tracer_provider.shutdown());
    code
}
