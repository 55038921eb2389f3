//! Shared test helpers: sample events, handler contexts, free ports.
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use watukuy_core::delivery::{Handler, HandlerErrorKind};
use watukuy_core::store::{ParkedQuery, Store};
use watukuy_core::{
    DeliveryOptions, Engine, Event, EventType, HandlerContext, HandlerError, Partition, json::Json,
};
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, StrategyKind, World, key};

/// An event of poller `poller` with the given id suffix (ids are 64 hex characters).
pub fn event(poller: &str, n: u32, event_type: EventType) -> Event {
    let mut event = Event::new(format!("{n:064x}"), event_type, poller, format!("item-{n}"));
    event.time = "2026-01-01T00:00:00.000Z".into();
    event.sequence = i64::from(n);
    event.data = Some(Json::parse(&format!(r#"{{"id":"item-{n}","total":{n}}}"#)).unwrap());
    event.attempt = 1;
    event
}

/// A fresh context for attempt 1 (not cancelled).
/// Delivers `event` to `sink`, which must fail with an error of `kind` and leave the event
/// unacknowledged; returns the error.
pub async fn fails_as(sink: &impl Handler, event: Event, kind: HandlerErrorKind) -> HandlerError {
    let context = ctx();
    let error = sink.handle(event, context.clone()).await.unwrap_err();
    assert_eq!(error.kind(), &kind, "{error}");
    assert!(context.ack(), "a failed delivery is not acknowledged");
    error
}

pub fn ctx() -> HandlerContext {
    HandlerContext::new(1, Partition::new(""), CancellationToken::new())
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A name unique to this test process (brokers are shared with other developers and runs).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", std::process::id())
}

/// The URL of a broker from the environment variable `var`; unset or empty, the test fails saying
/// which variable names the `broker` (a test that needs it never passes without it).
pub fn broker_url(var: &str, broker: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| panic!("{var} is not set, so the {broker} sink cannot be tested"))
}

/// Serves `app` on a free port of 127.0.0.1 for the rest of the test; its `http://` base URL.
pub async fn spawn_server(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A TCP relay from a local port to a broker: the broker as the sink sees it. Before it starts
/// nothing listens on the port (connection refused); stopping it cuts every live connection, as a
/// broker crash would; starting it again on the same port is the broker coming back.
pub struct Relay {
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    pub async fn start(port: u16, upstream: String) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let connections = Arc::new(Mutex::new(Vec::new()));
        let tracked = Arc::clone(&connections);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream.as_str()).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tracked.lock().unwrap().push(relay);
            }
        });
        Self {
            accept,
            connections,
        }
    }

    /// Stops listening and cuts every relayed connection (their sockets are closed once the
    /// aborted tasks have finished, which this waits for).
    pub async fn stop(self) {
        self.accept.abort();
        let _ = self.accept.await;
        let connections: Vec<_> = std::mem::take(&mut *self.connections.lock().unwrap());
        for connection in connections {
            connection.abort();
            let _ = connection.await;
        }
    }
}

/// An engine run of three events into a sink whose destination goes away and comes back
/// ([`Outage::through`]); each sink's outage test then reads the destination.
pub struct Outage {
    world: World,
    store: Arc<dyn Store>,
    engine: Engine,
}

impl Outage {
    /// An engine on a memory store polling three items, `sink` attached, retrying up to 1,000
    /// times (so nothing parks while the destination is away).
    pub fn new(sink: impl Handler + 'static) -> Self {
        let world = World::new(3, 10).unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let poller = world
            .poller(StrategyKind::Timestamp)
            .delivery(DeliveryOptions::default().attempts(1_000))
            .build()
            .unwrap();
        let engine = world
            .engine(Arc::clone(&store), "node-a", poller, 7)
            .unwrap();
        engine.on(POLLER, sink).unwrap();
        Self {
            world,
            store,
            engine,
        }
    }

    /// The outage: cuts `relay` (the destination as the sink reaches it), ticks while it is
    /// away, starts it again on `port` to `upstream`, and delivers everything. Returns the
    /// relay, up.
    pub async fn through(&self, relay: Relay, port: u16, upstream: String) -> Relay {
        relay.stop().await;
        self.tick_while_down().await;
        let relay = Relay::start(port, upstream).await;
        self.deliver_all().await;
        relay
    }

    /// One tick with the destination away: the cycle commits, every delivery fails
    /// transiently, the three events stay in the outbox.
    async fn tick_while_down(&self) {
        let result = self.world.tick(&self.engine).await.unwrap();
        assert_eq!(result.delivered, 0, "{result:?}");
        assert_eq!(self.store.counts(&key()).await.unwrap().pending, 3);
    }

    /// With the destination back: ticks (a minute apart, on the world's clock) until the
    /// retries delivered all three; the outbox is empty and nothing is parked.
    async fn deliver_all(&self) {
        let mut delivered = 0;
        for _ in 0..50 {
            self.world.advance(std::time::Duration::from_secs(60));
            delivered += self.world.tick(&self.engine).await.unwrap().delivered;
            if delivered >= 3 {
                break;
            }
        }
        assert_eq!(delivered, 3);
        assert_eq!(self.store.counts(&key()).await.unwrap().pending, 0);
        let parked = self
            .engine
            .list_parked(POLLER, None, ParkedQuery::default())
            .await
            .unwrap();
        assert!(parked.is_empty(), "{parked:?}");
    }
}
