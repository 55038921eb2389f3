//! `RedisBudgetStore` against `MemoryBudgetStore`: the pinned examples of the token bucket (docs/operations.md), and the two
//! agreeing step for step on seeded sequences of takes and peeks (costs of 0, oversized costs,
//! time going backwards, capacities up to 2^53 token·ms), with the Redis bucket shared by two
//! connections as two processes would share it.

mod common;

use common::{Server, store_at, unique_prefix, with_server};
use watukuy_conformance::CaseError;
use watukuy_core::budget::{BucketPolicy, BudgetStore, MemoryBudgetStore, Take};
use watukuy_core::rng::SeededRng;
use watukuy_store_redis::{RedisBudgetStore, RedisOptions, RedisStore};

const T0: i64 = 1_767_225_600_000;

fn fail(message: impl Into<String>) -> CaseError {
    CaseError::failed(message)
}

/// Two budget stores on two connections and one prefix: one shared bucket per name.
async fn two_budget_stores(
    server: &Server,
    what: &str,
) -> Result<(RedisStore, RedisBudgetStore, RedisBudgetStore), CaseError> {
    let prefix = unique_prefix(what);
    let store = store_at(&server.url, RedisOptions::default().prefix(&prefix)).await?;
    let other =
        RedisBudgetStore::connect(&server.url, RedisOptions::default().prefix(&prefix)).await?;
    let budgets = store.budget_store();
    Ok((store, budgets, other))
}

const PINNED: BucketPolicy = BucketPolicy {
    requests: 10,
    per_ms: 1000,
    burst: 3,
};

#[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_examples_of_the_spec() {
    with_server("budget_pinned", |server| async move {
        let (store, budgets, _) = two_budget_stores(&server, "budget.pinned").await?;
        let take = |cost, now| {
            let budgets = budgets.clone();
            async move { budgets.take("api", cost, &PINNED, now).await }
        };
        for left in [2, 1, 0] {
            let got = take(1, 0).await?;
            if got != (Take::Granted { remaining: left }) {
                return Err(fail(format!("take: {got:?}, expected {left} left")));
            }
        }
        let expectations = [
            (1, 0, Take::Wait { retry_in_ms: 100 }),
            (1, 99, Take::Wait { retry_in_ms: 1 }),
            (1, 100, Take::Granted { remaining: 0 }),
        ];
        for (cost, now, expected) in expectations {
            let got = take(cost, now).await?;
            if got != expected {
                return Err(fail(format!(
                    "take({cost}) at {now}: {got:?} != {expected:?}"
                )));
            }
        }
        // Cost 5 with 3 tokens waits 200 ms.
        let got = budgets.take("other", 5, &PINNED, 0).await?;
        if got != (Take::Wait { retry_in_ms: 200 }) {
            return Err(fail(format!("cost 5: {got:?}")));
        }
        let peek = budgets.peek("other", &PINNED, 150).await?;
        if peek.to_bits() != 3.0_f64.to_bits() {
            return Err(fail(format!("peek caps at burst: {peek}")));
        }
        let peek = budgets.peek("unknown", &PINNED, 0).await?;
        if peek.to_bits() != 3.0_f64.to_bits() {
            return Err(fail(format!("an unknown budget is full: {peek}")));
        }
        // Bad policies are Config errors naming the option; so are numbers Lua cannot count.
        let zero = BucketPolicy {
            requests: 0,
            ..PINNED
        };
        let huge = BucketPolicy {
            burst: 1 << 53,
            ..PINNED
        };
        let bad = [
            ("zero requests", zero, "budgets.api.requests"),
            ("capacity above 2^53", huge, "budgets.api.burst"),
        ];
        for (what, policy, option) in bad {
            let err = budgets.take("api", 1, &policy, 0).await.err();
            if !err.as_ref().is_some_and(|e| e.to_string().contains(option)) {
                return Err(fail(format!("{what}: {err:?}")));
            }
        }
        store.purge().await?;
        Ok(())
    })
    .await;
}

/// One step of a seeded sequence.
#[derive(Debug)]
enum Step {
    Take { name: usize, cost: u64, now: i64 },
    Peek { name: usize, now: i64 },
}

/// A seeded sequence: time mostly moves forward (sometimes backwards), costs range from 0 to
/// past the burst, a few peeks in between.
fn sequence(rng: &SeededRng, policies: &[BucketPolicy], steps: usize) -> Vec<Step> {
    let mut now = T0;
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let name = usize::try_from(rng.int_in(0, i64::try_from(policies.len()).unwrap_or(1) - 1))
            .unwrap_or(0);
        let policy = policies[name];
        // Mostly small steps relative to the refill period; now and then a jump or a step back.
        let per = i64::try_from(policy.per_ms).unwrap_or(i64::MAX);
        now += if rng.chance(0.1) {
            -rng.int_in(0, per)
        } else if rng.chance(0.05) {
            rng.int_in(per, per.saturating_mul(5))
        } else {
            rng.int_in(
                0,
                (per / i64::try_from(policy.requests.max(1)).unwrap_or(1)).max(1) * 2,
            )
        };
        if rng.chance(0.1) {
            out.push(Step::Peek { name, now });
            continue;
        }
        // Costs up to a bit past the burst, capped where cost·per_ms stays within 2^53.
        let max_cost = ((1u64 << 53) / policy.per_ms).min(policy.burst + 2);
        let cost = if rng.chance(0.1) {
            0
        } else {
            u64::try_from(rng.int_in(1, i64::try_from(max_cost).unwrap_or(i64::MAX))).unwrap_or(1)
        };
        out.push(Step::Take { name, cost, now });
    }
    out
}

/// Runs the same steps on a fresh memory store and on the shared Redis bucket (alternating
/// between two connections) and compares every answer exactly.
async fn agree(
    redis: [&RedisBudgetStore; 2],
    names: &[String],
    policies: &[BucketPolicy],
    steps: &[Step],
) -> Result<usize, CaseError> {
    let memory = MemoryBudgetStore::new();
    let mut granted = 0;
    for (i, step) in steps.iter().enumerate() {
        let via = redis[i % 2];
        match *step {
            Step::Take { name, cost, now } => {
                let policy = &policies[name];
                let expected = memory.take(&names[name], cost, policy, now).await?;
                let got = via.take(&names[name], cost, policy, now).await?;
                if got != expected {
                    return Err(fail(format!(
                        "step {i} {step:?} with {policy:?}: redis {got:?}, memory {expected:?}"
                    )));
                }
                granted += usize::from(matches!(got, Take::Granted { .. }) && cost > 0);
            }
            Step::Peek { name, now } => {
                let policy = &policies[name];
                let expected = memory.peek(&names[name], policy, now).await?;
                let got = via.peek(&names[name], policy, now).await?;
                if got.to_bits() != expected.to_bits() {
                    return Err(fail(format!(
                        "step {i} {step:?} with {policy:?}: redis {got}, memory {expected}"
                    )));
                }
            }
        }
    }
    Ok(granted)
}

#[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_memory_buckets_agree_step_for_step() {
    with_server("budget_agreement", |server| async move {
        let policies = [
            PINNED,
            BucketPolicy {
                requests: 5,
                per_ms: 1000,
                burst: 5,
            },
            BucketPolicy {
                requests: 2,
                per_ms: 10_000,
                burst: 2,
            },
            BucketPolicy {
                requests: 7,
                per_ms: 333,
                burst: 1,
            },
            BucketPolicy {
                requests: 999_999_937,
                per_ms: 86_400_000,
                burst: 100_000_000,
            },
            // Exactly 2^53 token·ms of capacity, costs up to the whole bucket.
            BucketPolicy {
                requests: 3,
                per_ms: 1 << 26,
                burst: 1 << 27,
            },
            // More requests than a double holds exactly.
            BucketPolicy {
                requests: u64::MAX,
                per_ms: 1000,
                burst: 3,
            },
        ];
        for seed in [1_u32, 7, 42, 2026] {
            let (store, a, b) = two_budget_stores(&server, &format!("budget.seed{seed}")).await?;
            let names: Vec<String> = (0..policies.len()).map(|i| format!("api-{i}")).collect();
            let steps = sequence(&SeededRng::new(seed), &policies, 600);
            let granted = agree([&a, &b], &names, &policies, &steps).await?;
            if granted == 0 || granted == steps.len() {
                return Err(fail(format!(
                    "seed {seed}: {granted} of {} steps granted: the sequence exercises nothing",
                    steps.len()
                )));
            }
            store.purge().await?;
        }
        Ok(())
    })
    .await;
}
