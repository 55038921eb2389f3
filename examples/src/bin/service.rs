//! A whole service's `main`: its poller and handler, and watukuy's command line for the rest.
//!
//! ```text
//! service tick                 # one pass (cron, serverless); exit 1 when a poll failed
//! service run --listen 127.0.0.1:8080
//!                              # the daemon, GET /health and the admin page; SIGTERM drains
//! service backfill --poller orders --from null --force
//!                              # re-read the history with progress; `--resume` after a kill
//! service inspect | pause | resume | trigger | parked | reset-cursor | replay | migrate
//! ```
//!
//! It polls `GET $ORDERS_API_URL/orders?since=…&after=…&limit=…` (a timestamp cursor on
//! `updatedAt`, ties broken by `id`) and appends each event it receives to the file
//! `$ORDERS_LEDGER` as one line, `<type> <subject> <lane> <event id>`: the projection a real
//! service would write to its database. The store is `--store`, `WATUKUY_STORE`, or
//! `sqlite:orders-service.db`. `examples/tests/service.rs` runs the built binary.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use watukuy_cli::Service;
use watukuy_core::schedule::ScheduleOptions;
use watukuy_core::{
    BoxError, Event, FetchContext, HandlerContext, HandlerError, Poller, cursor, cursor::Cursor,
};
use watukuy_http::HttpClient;

/// Items per page the service asks for.
const LIMIT: usize = 2;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    id: String,
    updated_at: String,
}

fn orders(api: String) -> Result<Poller, BoxError> {
    let http = HttpClient::builder().build()?;
    let url = format!("{}/orders", api.trim_end_matches('/'));
    Ok(Poller::builder::<Order>("orders")
        .identity(|order: &Order| order.id.clone())
        .version(|order: &Order| order.updated_at.clone())
        .cursor(cursor::timestamp("updatedAt").tie_break("id"))
        .schedule(
            ScheduleOptions::default()
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(10)),
        )
        .fetch(move |ctx: FetchContext| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let (since, after) = match &ctx.cursor {
                    Cursor::Timestamp { value, tie_break } => (value.clone(), tie_break.clone()),
                    _ => (None, None),
                };
                let response = http
                    .get(&ctx, url)
                    .query("since", since)
                    .query("after", after)
                    .query("limit", LIMIT)
                    .send()
                    .await?;
                let page = response.items_page()?;
                let full = page.items.len() == LIMIT;
                Ok(page.has_more(full))
            }
        })
        .build()?)
}

/// Appends `<type> <subject> <lane> <id>` to the ledger file.
fn record(path: &str, event: &Event) -> Result<(), HandlerError> {
    let line = format!(
        "{} {} {} {}\n",
        event.event_type,
        event.subject,
        event.lane.as_str(),
        event.id
    );
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .map_err(|error| HandlerError::transient(format!("writing {path}: {error}")))
}

fn main() -> ExitCode {
    Service::new("service", |builder| async move {
        let api = std::env::var("ORDERS_API_URL")
            .map_err(|_| "set ORDERS_API_URL to the orders API's base URL")?;
        let ledger = Arc::new(
            std::env::var("ORDERS_LEDGER").unwrap_or_else(|_| "orders-ledger.txt".to_owned()),
        );
        let engine = builder.poller(orders(api)?).build()?;
        engine.on("orders", move |event: Event, _ctx: HandlerContext| {
            let ledger = Arc::clone(&ledger);
            async move { record(&ledger, &event) }
        })?;
        Ok(engine)
    })
    .version(env!("CARGO_PKG_VERSION"))
    .default_store("sqlite:orders-service.db")
    .main()
}
