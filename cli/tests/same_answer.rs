//! One request, one answer: retrying and discarding parked rows through the engine
//! (`Engine::retry_parked`), the command line (`watukuy parked retry`, parsed and run on the
//! store) and the admin page (with an engine, and with the store alone) gives the same count,
//! or the same error code and message, for every request. All of them go through
//! `watukuy_core::ops`; this test is what keeps a fourth home from growing back.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, header};
use clap::Parser as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;
use watukuy_admin::{AdminState, Mode, router};
use watukuy_cli::Session;
use watukuy_cli::args::Cli;
use watukuy_core::ops;
use watukuy_core::store::Store;
use watukuy_store_memory::MemoryStore;
use watukuy_testkit::world::{POLLER, Parked, World, key};

/// An answer, whoever gave it: a count, or an error's code and message.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Count(u64),
    Error { code: String, message: String },
}

impl From<watukuy_core::Error> for Answer {
    fn from(error: watukuy_core::Error) -> Self {
        Answer::Error {
            code: error.code().as_str().to_owned(),
            message: error.to_string(),
        }
    }
}

/// A memory store holding the rows `World::park` parks: item-001 and item-003 poison, item-004
/// quarantined.
async fn parked() -> Parked {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    World::new(4, 10).unwrap().park(store).await.unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Verb {
    Retry,
    Discard,
}

impl Verb {
    fn word(self) -> &'static str {
        match self {
            Verb::Retry => "retry",
            Verb::Discard => "discard",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Surface {
    Engine,
    CommandLine,
    AdminWithEngine,
    AdminWithStore,
}

async fn ask(p: &Parked, surface: Surface, verb: Verb, poller: &str, ids: &[String]) -> Answer {
    match surface {
        Surface::Engine => {
            let result = match verb {
                Verb::Retry => p.engine.retry_parked(poller, None, ids).await,
                Verb::Discard => p.engine.discard_parked(poller, None, ids).await,
            };
            result.map_or_else(Answer::from, Answer::Count)
        }
        Surface::CommandLine => {
            let joined = ids.join(",");
            let argv = [
                "watukuy",
                "parked",
                verb.word(),
                "--poller",
                poller,
                "--ids",
                &joined,
                "--json",
            ];
            let cli = Cli::try_parse_from(argv).unwrap();
            let session = Session::new(Arc::clone(&p.store), "memory");
            match watukuy_cli::command(&session, &cli.command).await {
                Ok(output) => {
                    let field = match verb {
                        Verb::Retry => "retried",
                        Verb::Discard => "discarded",
                    };
                    Answer::Count(output.json[field].as_u64().unwrap())
                }
                Err(error) => Answer::Error {
                    code: error.code,
                    message: error.message,
                },
            }
        }
        Surface::AdminWithEngine | Surface::AdminWithStore => {
            let state = match surface {
                Surface::AdminWithEngine => AdminState::new(p.engine.clone(), Arc::clone(&p.store)),
                _ => AdminState::from_store(Arc::clone(&p.store)),
            };
            let app = router(state.mode(Mode::ReadWrite));
            let request = Request::post(format!("/api/pollers/{poller}/parked/{}", verb.word()))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({ "ids": ids }).to_string()))
                .unwrap();
            let response = app.oneshot(request).await.unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            match body.get("error") {
                Some(error) => Answer::Error {
                    code: error["code"].as_str().unwrap().to_owned(),
                    message: error["message"].as_str().unwrap().to_owned(),
                },
                None => Answer::Count(
                    body[match verb {
                        Verb::Retry => "retried",
                        Verb::Discard => "discarded",
                    }]
                    .as_u64()
                    .unwrap(),
                ),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_gives_the_same_answer_to_the_same_request() {
    let surfaces = [
        Surface::Engine,
        Surface::CommandLine,
        Surface::AdminWithEngine,
        Surface::AdminWithStore,
    ];
    // Each request on a store of its own (per surface), after the ones before it: the answers
    // to a sequence, failures and successes, must match step by step.
    let mut answers: Vec<Vec<(String, Answer)>> = Vec::new();
    for surface in surfaces {
        let p = parked().await;
        let unknown = vec!["evt-unknown".to_owned()];
        let steps: Vec<(&str, Verb, &str, Vec<String>)> = vec![
            ("retry an unknown id", Verb::Retry, POLLER, unknown.clone()),
            (
                "discard an unknown id",
                Verb::Discard,
                POLLER,
                unknown.clone(),
            ),
            (
                "retry the quarantined item",
                Verb::Retry,
                POLLER,
                vec![p.invalid.clone()],
            ),
            (
                "retry a poison row with an unknown id",
                Verb::Retry,
                POLLER,
                vec![p.poison[0].clone(), unknown[0].clone()],
            ),
            (
                "retry on an unknown poller",
                Verb::Retry,
                "nope",
                vec![p.poison[0].clone()],
            ),
            (
                "retry a poison row",
                Verb::Retry,
                POLLER,
                vec![p.poison[0].clone()],
            ),
            (
                "retry it again",
                Verb::Retry,
                POLLER,
                vec![p.poison[0].clone()],
            ),
            (
                "discard the other and the quarantined item",
                Verb::Discard,
                POLLER,
                vec![p.poison[1].clone(), p.invalid.clone()],
            ),
        ];
        let mut these = Vec::new();
        for (what, verb, poller, ids) in steps {
            these.push((what.to_owned(), ask(&p, surface, verb, poller, &ids).await));
        }
        let left = ops::list_parked(&*p.store, &key(), &ops::ParkedSelection::all())
            .await
            .unwrap();
        assert!(left.is_empty(), "{surface:?} left {left:#?}");
        answers.push(these);
    }
    // The answers themselves: what a user reads.
    let engine = &answers[0];
    let codes: Vec<(&str, Option<&str>)> = engine
        .iter()
        .map(|(what, answer)| {
            (
                what.as_str(),
                match answer {
                    Answer::Error { code, .. } => Some(code.as_str()),
                    Answer::Count(_) => None,
                },
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            ("retry an unknown id", Some("NOT_FOUND")),
            ("discard an unknown id", Some("NOT_FOUND")),
            ("retry the quarantined item", Some("CONFIG")),
            ("retry a poison row with an unknown id", Some("NOT_FOUND")),
            ("retry on an unknown poller", Some("UNKNOWN_POLLER")),
            ("retry a poison row", None),
            ("retry it again", Some("NOT_FOUND")),
            ("discard the other and the quarantined item", None),
        ]
    );
    assert_eq!(engine[5].1, Answer::Count(1));
    assert_eq!(engine[7].1, Answer::Count(2));
    for (surface, these) in surfaces.iter().zip(&answers).skip(1) {
        for ((what, expected), (_, answer)) in engine.iter().zip(these) {
            assert_eq!(answer, expected, "{surface:?}: {what}");
        }
    }
}
