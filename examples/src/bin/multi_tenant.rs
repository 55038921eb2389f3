//! Multi-tenant polling: one poller, one partition per tenant, each tenant's API credentials in
//! its `Partition::data` (never stored).
//!
//! Run it with `cargo run -p watukuy-examples --bin multi_tenant`.
//!
//! A local axum server stands in for three tenants' invoice APIs at
//! `GET /tenants/{tenant}/invoices`, each checking its own bearer token. The partition list comes
//! from a small tenant registry; `initech`'s token there is wrong at first, so only that tenant
//! fails (401) while the others are polled. The token is rotated in the registry, the list is
//! refreshed with `engine.partitions(..)`, and `initech` catches up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use watukuy_core::{
    BoxError, Engine, Event, FetchContext, HandlerContext, HandlerError, Partition, Poller,
    TickOptions, cursor,
};
use watukuy_http::HttpClient;
use watukuy_store_memory::MemoryStore;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Invoice {
    id: String,
    amount: u32,
    status: String,
}

/// The tenants' APIs: invoices and the token each tenant's API accepts.
#[derive(Default)]
struct Apis {
    invoices: BTreeMap<String, Vec<Invoice>>,
    tokens: BTreeMap<String, String>,
}

type ApisState = Arc<Mutex<Apis>>;

async fn list_invoices(
    State(apis): State<ApisState>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Vec<Invoice>>, StatusCode> {
    let apis = apis.lock().unwrap_or_else(PoisonError::into_inner);
    let expected = apis.tokens.get(&tenant).ok_or(StatusCode::NOT_FOUND)?;
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given != Some(expected.as_str()) {
        println!("  api[{tenant}]: 401 (wrong token)");
        return Err(StatusCode::UNAUTHORIZED);
    }
    Ok(Json(
        apis.invoices.get(&tenant).cloned().unwrap_or_default(),
    ))
}

fn invoice(id: &str, amount: u32, status: &str) -> Invoice {
    Invoice {
        id: id.into(),
        amount,
        status: status.into(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Three tenants' APIs, each with its own token.
    let apis: ApisState = Arc::default();
    {
        let mut apis = apis.lock().unwrap_or_else(PoisonError::into_inner);
        for (tenant, token, invoices) in [
            ("acme", "acme-secret", vec![invoice("inv-1", 100, "open")]),
            (
                "globex",
                "globex-secret",
                vec![invoice("inv-1", 250, "open"), invoice("inv-2", 40, "paid")],
            ),
            (
                "initech",
                "initech-new-secret",
                vec![invoice("inv-7", 999, "open")],
            ),
        ] {
            apis.tokens.insert(tenant.into(), token.into());
            apis.invoices.insert(tenant.into(), invoices);
        }
    }
    let app = axum::Router::new()
        .route(
            "/tenants/{tenant}/invoices",
            axum::routing::get(list_invoices),
        )
        .with_state(Arc::clone(&apis));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Our tenant registry: which tenants to poll, with their credentials (initech's is stale).
    let registry: Arc<Mutex<BTreeMap<String, String>>> = Arc::new(Mutex::new(
        [
            ("acme", "acme-secret"),
            ("globex", "globex-secret"),
            ("initech", "initech-old-secret"),
        ]
        .into_iter()
        .map(|(t, s)| (t.to_owned(), s.to_owned()))
        .collect(),
    ));

    let http = HttpClient::builder().build()?;
    let invoices = Poller::builder::<Invoice>("invoices")
        .identity(|invoice: &Invoice| invoice.id.clone())
        .cursor(cursor::snapshot_diff())
        .partitions(
            {
                let registry = Arc::clone(&registry);
                move || {
                    let list: Vec<Partition> = registry
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .iter()
                        .map(|(tenant, token)| Partition {
                            key: tenant.clone(),
                            // Only in memory: handed to fetch and the handler, never stored.
                            data: Some(Arc::new(serde_json::json!({ "token": token }))),
                        })
                        .collect();
                    async move { Ok::<_, BoxError>(list) }
                }
            },
            Duration::from_secs(300),
        )
        .fetch(move |ctx: FetchContext| {
            let (http, base) = (http.clone(), base.clone());
            async move {
                let token = ctx
                    .partition
                    .data
                    .as_deref()
                    .and_then(|data| data["token"].as_str())
                    .ok_or("tenant without a token")?
                    .to_owned();
                let url = format!("{base}/tenants/{}/invoices", ctx.partition.key);
                let response = http.get(&ctx, url).bearer_auth(token).send().await?;
                Ok::<_, BoxError>(response.items_page()?)
            }
        })
        .build()?;

    let engine = Engine::builder(Arc::new(MemoryStore::new()))
        .poller(invoices)
        .build()?;
    engine.migrate().await?;
    engine.on("invoices", |event: Event, ctx: HandlerContext| async move {
        let invoice: Option<Invoice> = event.data_as()?;
        println!(
            "  [{}] {} {} -> {}",
            ctx.partition.key,
            event.event_type.as_str(),
            event.subject,
            invoice.map_or_else(|| "-".into(), |i| format!("{} {}", i.status, i.amount)),
        );
        Ok::<(), HandlerError>(())
    })?;

    let tick = |label: &'static str| {
        let engine = &engine;
        async move {
            println!("{label}");
            let result = engine.tick(TickOptions::default()).await?;
            for polled in &result.polled {
                if let Some(error) = &polled.error {
                    println!("  [{}] cycle failed: {}", polled.partition, error.message);
                }
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        }
    };

    println!("partitions: {:?}", engine.partitions("invoices").await?);
    tick("1. first poll of every tenant (initech's token is stale)").await?;

    println!("2. acme's inv-1 is paid; only acme is polled again");
    apis.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .invoices
        .insert("acme".into(), vec![invoice("inv-1", 100, "paid")]);
    engine.trigger("invoices", Some("acme")).await?;
    tick("   tick").await?;

    println!("3. initech's token is rotated in the registry; the list is refreshed now");
    registry
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert("initech".into(), "initech-new-secret".into());
    engine.partitions("invoices").await?;
    engine.trigger("invoices", Some("initech")).await?;
    tick("   tick").await?;

    let report = engine.inspect().await?;
    for key in &report.pollers {
        println!(
            "inspect: {}/{}: {} items, {} delivered, last error: {}",
            key.poller,
            key.partition,
            key.items,
            key.delivery.applied,
            key.schedule
                .last_error
                .as_ref()
                .map_or("-", |e| e.message.as_str()),
        );
    }
    Ok(())
}
