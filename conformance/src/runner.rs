//! Running cases: one at a time for `#[test]`s, or all of them into a [`Report`].

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::harness::{CaseContext, CaseError, CaseResult, Env, Harness};

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its module (`setup`, `leases`, ..., `guarantees`).
    pub module: &'static str,
    /// Its name.
    pub name: &'static str,
    /// Runs it.
    pub run: fn(Env) -> BoxFuture<'static, CaseResult>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}::{}", self.module, self.name)
    }
}

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The store kept the contract.
    Passed,
    /// The case did not apply.
    Skipped(String),
    /// The store broke the contract.
    Failed(String),
}

/// Runs one case on a fresh store from `harness`; the store's cleanup runs only if it passed.
pub async fn run_case(harness: Arc<dyn Harness>, case: Case) -> Outcome {
    let ctx = CaseContext {
        module: case.module,
        name: case.name,
    };
    let fresh = match harness.fresh(ctx).await {
        Ok(fresh) => fresh,
        Err(CaseError::Skipped(reason)) => return Outcome::Skipped(reason),
        Err(CaseError::Failed(message)) => {
            return Outcome::Failed(format!("could not get a fresh store: {message}"));
        }
    };
    let env = Env::new(&fresh, harness, ctx);
    let result = AssertUnwindSafe((case.run)(env)).catch_unwind().await;
    match result {
        Ok(Ok(())) => {
            fresh.cleanup().await;
            Outcome::Passed
        }
        Ok(Err(CaseError::Skipped(reason))) => {
            fresh.cleanup().await;
            Outcome::Skipped(reason)
        }
        Ok(Err(CaseError::Failed(message))) => Outcome::Failed(message),
        Err(panic) => Outcome::Failed(format!(
            "the case panicked: {}",
            panic_message(panic.as_ref())
        )),
    }
}

/// The outcome of every case.
#[derive(Clone, Debug)]
pub struct Report {
    /// The harness's name.
    pub harness: String,
    /// Every case with its outcome, in suite order.
    pub outcomes: Vec<(Case, Outcome)>,
}

impl Report {
    /// Cases that failed, as `module::name` with the message.
    pub fn failures(&self) -> Vec<(String, String)> {
        self.outcomes
            .iter()
            .filter_map(|(case, outcome)| match outcome {
                Outcome::Failed(message) => {
                    Some((format!("{}::{}", case.module, case.name), message.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The outcome of the case named `module::name`.
    pub fn outcome(&self, path: &str) -> Option<&Outcome> {
        self.outcomes
            .iter()
            .find(|(case, _)| format!("{}::{}", case.module, case.name) == path)
            .map(|(_, outcome)| outcome)
    }

    /// How many cases passed.
    pub fn passed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|(_, o)| *o == Outcome::Passed)
            .count()
    }

    /// How many cases were skipped.
    pub fn skipped(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Skipped(_)))
            .count()
    }

    /// True when no case failed.
    pub fn is_ok(&self) -> bool {
        self.failures().is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failures = self.failures();
        writeln!(
            f,
            "{}: {} passed, {} skipped, {} failed",
            self.harness,
            self.passed(),
            self.skipped(),
            failures.len()
        )?;
        for (path, message) in failures {
            writeln!(f, "  FAILED {path}: {message}")?;
        }
        Ok(())
    }
}

/// Runs every case of the suite against `harness`, never stopping at the first failure.
pub async fn run_all(harness: impl Harness) -> Report {
    let harness: Arc<dyn Harness> = Arc::new(harness);
    let mut outcomes = Vec::new();
    for case in crate::all_cases() {
        let outcome = run_case(Arc::clone(&harness), case).await;
        outcomes.push((case, outcome));
    }
    Report {
        harness: harness.name(),
        outcomes,
    }
}

/// Runs one case as a `#[test]`: a failure panics. A case that does not apply to the store
/// (`CaseError::Skipped`, e.g. a missing capability) is printed and passes, as libtest cannot
/// skip at run time; a missing backend is a failure ([`crate::backend_url`]), and a test left
/// out for one is marked ignored when it is compiled (see [`crate::store_tests!`]).
pub fn run_test(harness: impl Harness, case: Case) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"));
    let harness: Arc<dyn Harness> = Arc::new(harness);
    let name = harness.name();
    match runtime.block_on(run_case(harness, case)) {
        Outcome::Passed => {}
        Outcome::Skipped(reason) => {
            eprintln!("[{name}] {}::{} SKIPPED: {reason}", case.module, case.name)
        }
        Outcome::Failed(message) => {
            panic!("[{name}] {}::{} FAILED: {message}", case.module, case.name)
        }
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
