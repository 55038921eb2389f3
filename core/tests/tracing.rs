//! Trace context: the deliver span is the parent of the handler's own spans, and every event
//! carries the W3C traceparent of the poll cycle that observed it (also recorded on the
//! `watukuy.poll` span), so consumers can link their work to the poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use watukuy_core::telemetry::is_traceparent;
use watukuy_core::{Event, HandlerContext, HandlerError, store::Store};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World};

/// A span as the layer saw it: name, parent name and fields.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, Seen>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|p| p.name().to_owned());
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            parent,
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

#[tokio::test]
async fn the_handler_runs_under_the_deliver_span_and_events_carry_the_poll_traceparent() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let world = World::new(3, 10).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = world
        .engine(
            store,
            "node-a",
            world.poller(StrategyKind::Timestamp).build().unwrap(),
            1,
        )
        .unwrap();
    let received: Arc<Mutex<Vec<Event>>> = Arc::default();
    engine
        .on(POLLER, {
            let received = Arc::clone(&received);
            move |event: Event, _ctx: HandlerContext| {
                let received = Arc::clone(&received);
                async move {
                    let work = tracing::info_span!("user.work", subject = %event.subject);
                    let _entered = work.enter();
                    received.lock().unwrap().push(event);
                    Ok::<(), HandlerError>(())
                }
            }
        })
        .unwrap();
    world.tick(&engine).await.unwrap();

    let events = received.lock().unwrap().clone();
    assert_eq!(events.len(), 3);
    let seen: Vec<Seen> = spans.0.lock().unwrap().values().cloned().collect();
    let user: Vec<&Seen> = seen.iter().filter(|s| s.name == "user.work").collect();
    assert_eq!(user.len(), 3);
    assert!(
        user.iter()
            .all(|s| s.parent.as_deref() == Some("watukuy.deliver")),
        "{user:?}"
    );

    let polls: Vec<&Seen> = seen.iter().filter(|s| s.name == "watukuy.poll").collect();
    assert_eq!(polls.len(), 1, "{polls:?}");
    let poll_traceparent = polls[0]
        .fields
        .get("traceparent")
        .cloned()
        .unwrap_or_default();
    assert!(is_traceparent(&poll_traceparent), "{poll_traceparent:?}");
    for event in &events {
        assert_eq!(
            event.traceparent.as_deref(),
            Some(poll_traceparent.as_str()),
            "captured at commit"
        );
    }
    let delivers: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.name == "watukuy.deliver")
        .collect();
    assert_eq!(delivers.len(), 3);
    for deliver in delivers {
        assert_eq!(
            deliver.fields.get("traceparent"),
            Some(&poll_traceparent),
            "the delivery links to the poll"
        );
        assert_eq!(
            deliver.fields.get("poller").map(String::as_str),
            Some(POLLER)
        );
        assert_eq!(deliver.parent.as_deref(), Some("watukuy.poll"));
    }
    // The CloudEvent form carries it as the distributed-tracing extension.
    assert_eq!(
        events[0].to_cloud_event().traceparent.as_deref(),
        events[0].traceparent.as_deref()
    );
}
