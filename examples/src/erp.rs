//! The quickstart's "ERP": an in-memory order book behind one keyset-paginated route, changing
//! by itself, and the poller that reads it. Shared by the `quickstart` and `kafka` examples.
//!
//! - [`serve_erp`] serves `GET /orders?since=<ts>&after=<id>` (bearer token `erp-demo-token`) on
//!   127.0.0.1, ordered by `updatedAt` then `id` (a keyset);
//! - [`run_erp`] creates orders and moves them through `open → paid → shipped → delivered` every
//!   1.5 s;
//! - [`poller`] asks for the changes since its cursor with `watukuy_http::HttpClient`; the cursor
//!   is `cursor::timestamp("updatedAt").tie_break("id").lag(1 ms)`: the lag holds back writes of
//!   the current millisecond, so a later write with the same timestamp and a smaller id cannot be
//!   skipped (docs/cursors.md).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use watukuy_core::clock::{Clock, SystemClock, format_rfc3339_ms};
use watukuy_core::cursor::{self, Cursor};
use watukuy_core::{FetchContext, Poller, PollerBuilder};
use watukuy_http::HttpClient;

/// The item type: what the ERP returns per order.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// `ord-1001`, `ord-1002`, ...
    pub id: String,
    /// `open`, `paid`, `shipped` or `delivered`.
    pub status: String,
    /// The order's total.
    pub total: u32,
    /// When the order last changed (RFC 3339, milliseconds, UTC).
    pub updated_at: String,
}

/// Page size of the ERP's listing.
pub const LIMIT: usize = 50;

// ---------------------------------------------------------------------------------------------
// The ERP: an in-memory order book behind one keyset-paginated route.
// ---------------------------------------------------------------------------------------------

/// The order book.
#[derive(Debug, Default)]
pub struct Erp {
    /// Every order, in creation order.
    pub orders: Vec<Order>,
    /// The last timestamp handed out (epoch ms): writes never go back in time.
    last_write_ms: i64,
}

/// The order book, shared by the route and the task changing it.
pub type ErpState = Arc<Mutex<Erp>>;

impl Erp {
    fn stamp(&mut self) -> String {
        let now = SystemClock.now_ms().max(self.last_write_ms);
        self.last_write_ms = now;
        format_rfc3339_ms(now)
    }

    /// Adds an open order; its id.
    pub fn create(&mut self, total: u32) -> String {
        let id = format!("ord-{}", 1001 + self.orders.len());
        let updated_at = self.stamp();
        self.orders.push(Order {
            id: id.clone(),
            status: "open".into(),
            total,
            updated_at,
        });
        id
    }

    /// Moves an order to its next status; `None` once it is delivered.
    pub fn advance(&mut self, index: usize) -> Option<(String, String)> {
        let next = match self.orders.get(index)?.status.as_str() {
            "open" => "paid",
            "paid" => "shipped",
            "shipped" => "delivered",
            _ => return None,
        };
        let updated_at = self.stamp();
        let order = &mut self.orders[index];
        order.status = next.into();
        order.updated_at = updated_at;
        Some((order.id.clone(), next.into()))
    }
}

#[derive(serde::Deserialize)]
struct Since {
    since: Option<String>,
    after: Option<String>,
}

/// `GET /orders?since=<ts>&after=<id>`: orders with `(updatedAt, id) > (since, after)` (or
/// `updatedAt >= since` without `after`), oldest first, at most [`LIMIT`]. Timestamps are all
/// written by [`format_rfc3339_ms`] (fixed width, UTC), so they compare as strings.
async fn list_orders(
    State(erp): State<ErpState>,
    headers: axum::http::HeaderMap,
    Query(q): Query<Since>,
) -> Result<Json<Vec<Order>>, StatusCode> {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer erp-demo-token") {
        return Err(StatusCode::UNAUTHORIZED);
    }
    let erp = erp.lock().unwrap_or_else(PoisonError::into_inner);
    let mut page: Vec<Order> = erp
        .orders
        .iter()
        .filter(|o| match (&q.since, &q.after) {
            (None, _) => true,
            (Some(since), None) => o.updated_at.as_str() >= since.as_str(),
            (Some(since), Some(after)) => {
                (o.updated_at.as_str(), o.id.as_str()) > (since.as_str(), after.as_str())
            }
        })
        .cloned()
        .collect();
    page.sort_by(|a, b| (&a.updated_at, &a.id).cmp(&(&b.updated_at, &b.id)));
    page.truncate(LIMIT);
    Ok(Json(page))
}

/// Changes the order book every 1.5 s, printing each change: a new order every third step, else a status change.
pub async fn run_erp(erp: ErpState) {
    let mut every = tokio::time::interval(Duration::from_millis(1_500));
    every.tick().await; // the first tick is immediate
    for step in 0_usize.. {
        every.tick().await;
        let mut erp = erp.lock().unwrap_or_else(PoisonError::into_inner);
        let change = if step % 3 == 2 || erp.orders.len() < 4 {
            let total = u32::try_from(25 + (step * 37) % 400).unwrap_or(99);
            let id = erp.create(total);
            format!("{id} created (total {total})")
        } else {
            // Walk the orders, skipping finished ones (and ord-1003, whose events stay held).
            let count = erp.orders.len();
            let moved = (0..count)
                .map(|i| (step + i) % count)
                .filter(|&i| erp.orders[i].id != "ord-1003")
                .collect::<Vec<_>>()
                .into_iter()
                .find_map(|i| erp.advance(i));
            match moved {
                Some((id, status)) => format!("{id} is now {status}"),
                None => continue,
            }
        };
        println!("  erp: {change}");
    }
}

/// Serves the route on a free port of 127.0.0.1; the base URL.
pub async fn serve_erp(erp: ErpState) -> Result<String, Box<dyn std::error::Error>> {
    let app = axum::Router::new()
        .route("/orders", axum::routing::get(list_orders))
        .with_state(erp);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

/// A poller named `name` of the ERP at `base`: identity, version, cursor and fetch set; the
/// caller adds its schedule and delivery options and builds it.
pub fn poller(name: &str, base: &str) -> Result<PollerBuilder<Order>, Box<dyn std::error::Error>> {
    let http = HttpClient::builder()
        .bearer_auth("erp-demo-token")
        .build()?;
    let url = format!("{base}/orders");
    Ok(Poller::builder::<Order>(name)
        .identity(|order: &Order| order.id.clone())
        .version(|order: &Order| order.updated_at.clone())
        .cursor(
            cursor::timestamp("updatedAt")
                .tie_break("id")
                .lag(Duration::from_millis(1)),
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
                    .send()
                    .await?;
                let page = response.items_page()?;
                let full = page.items.len() == LIMIT;
                Ok(page.has_more(full))
            }
        }))
}
