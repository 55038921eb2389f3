//! The pure decisions of delivery: grouping by ordering key, what a failure leads to, and how the
//! load window widens. No I/O, no clock, no randomness of their own.

use std::collections::{HashMap, HashSet};

use super::consumer::HandlerErrorKind;
use super::options::{DeliveryOptions, PoisonAction, Redaction};
use crate::clock::duration_ms;
use crate::event::Event;
use crate::json::Json;
use crate::model::{AttemptRecord, FailureDetails, OutboxRow, ParkedError, SerializedError};

/// The rows of one ordering key within a slice, in sequence order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// The ordering key.
    pub key: String,
    /// The rows, in sequence order.
    pub rows: Vec<OutboxRow>,
}

/// Splits a slice (already in sequence order) into groups by ordering key, in order of first
/// appearance, leaving out keys that are held or blocked.
pub(crate) fn eligible_groups(
    rows: Vec<OutboxRow>,
    key_of: impl Fn(&OutboxRow) -> String,
    held: &HashSet<String>,
    blocked: &HashSet<String>,
) -> Vec<Group> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for row in rows {
        let key = key_of(&row);
        if held.contains(&key) || blocked.contains(&key) {
            continue;
        }
        match index.get(&key) {
            Some(&i) => groups[i].rows.push(row),
            None => {
                index.insert(key.clone(), groups.len());
                groups.push(Group {
                    key,
                    rows: vec![row],
                });
            }
        }
    }
    groups
}

/// The window for the next load when a slice had no eligible group: doubled (up to 16 × the batch
/// size) when the slice was full, since held keys may be hiding deliverable rows behind them;
/// `None` when widening cannot help.
pub(crate) fn widened_window(window: usize, batch_size: usize, slice_full: bool) -> Option<usize> {
    let max = batch_size.saturating_mul(16);
    (slice_full && window < max).then(|| window.saturating_mul(2).min(max))
}

/// When a drain's queued acks go to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushDue {
    /// Flush now.
    Now,
    /// Nothing to flush; wait until something changes.
    Idle,
    /// Flush at this time (epoch ms) unless something changes first.
    At(i64),
}

/// Whether `queued` acks are flushed now: when there are `max_events` of them, when every group
/// of the drain waits on them (nothing else can make progress), or when the oldest has waited
/// its delay (`deadline`, absent without a window).
pub(crate) fn flush_due(
    queued: usize,
    all_waiting: bool,
    max_events: usize,
    deadline: Option<i64>,
    now: i64,
) -> FlushDue {
    if queued == 0 {
        return FlushDue::Idle;
    }
    if queued >= max_events || all_waiting {
        return FlushDue::Now;
    }
    // Without a window `max_events` is 1, so nothing queued reaches this point.
    match deadline {
        Some(at) if at > now => FlushDue::At(at),
        _ => FlushDue::Now,
    }
}

/// What a failed attempt leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FailureDecision {
    /// Try again no earlier than `delay_ms` from now; the key waits.
    Retry {
        /// The delay before the next attempt.
        delay_ms: i64,
    },
    /// Park the event.
    Park {
        /// Hold back the rest of the ordering key.
        hold_key: bool,
        /// Stop the whole drain (poison `halt`).
        halt: bool,
    },
}

/// Decides what failed attempt `attempt` (1-based) leads to. `u` is a uniform draw in `[0, 1)`
/// for the full-jitter backoff.
///
/// A permanent failure parks at once; an exhausted attempt budget parks; a retry-after failure
/// waits exactly as told; any other failure waits a full-jitter backoff.
pub(crate) fn on_failure(
    attempt: u32,
    kind: &HandlerErrorKind,
    options: &DeliveryOptions,
    u: f64,
) -> FailureDecision {
    let exhausted = attempt >= options.attempts;
    if exhausted || matches!(kind, HandlerErrorKind::Permanent) {
        return FailureDecision::Park {
            hold_key: options.hold_key,
            halt: options.poison == PoisonAction::Halt,
        };
    }
    let delay_ms = match kind {
        HandlerErrorKind::RetryAfter(delay) => duration_ms(*delay),
        _ => options.backoff.full_jitter_ms(attempt, u),
    };
    FailureDecision::Retry { delay_ms }
}

/// The error of a parked row: the last error, with the row's earlier error (if any) and the last
/// one as history.
pub(crate) fn parked_error(
    previous: Option<&SerializedError>,
    last: SerializedError,
) -> ParkedError {
    let history: Vec<SerializedError> = previous
        .into_iter()
        .cloned()
        .chain([last.clone()])
        .collect();
    ParkedError {
        error: last,
        history: Some(history),
        issues: None,
        details: FailureDetails::default(),
    }
}

/// The attempt log of a parked row: the attempts this process remembers (oldest first, the
/// last one included), preceded by the row's stored last error when the previous attempt is not
/// among them (made before a restart or by another instance; its times are then unknown).
pub(crate) fn attempt_log(row: &OutboxRow, remembered: Vec<AttemptRecord>) -> Vec<AttemptRecord> {
    let previous = row.attempts;
    let known = remembered.iter().any(|r| r.attempt == previous);
    match (&row.last_error, known) {
        (Some(last_error), false) if previous > 0 => {
            let mut log = Vec::with_capacity(remembered.len() + 1);
            log.push(AttemptRecord {
                attempt: previous,
                started_at: None,
                failed_at: None,
                classification: None,
                retry_at: row.next_attempt_at,
                error: last_error.clone(),
            });
            log.extend(remembered);
            log
        }
        _ => remembered,
    }
}

/// The placeholder that replaces a redacted field.
pub(crate) const REDACTED: &str = "[redacted]";

/// Applies `redaction` to the copy of `event` stored on a parked row; returns what was kept out
/// (`"data"`/`"previous"`, or pointers such as `"/data/card/number"`), `None` when nothing was.
pub(crate) fn redact_event(event: &mut Event, redaction: &Redaction) -> Option<Vec<String>> {
    let mut redacted = Vec::new();
    match redaction {
        Redaction::None => {}
        Redaction::Payload => {
            if event.data.take().is_some() {
                redacted.push("data".to_owned());
            }
            if event.previous.take().is_some() {
                redacted.push("previous".to_owned());
            }
        }
        Redaction::Fields(pointers) => {
            for (name, slot) in [("data", &mut event.data), ("previous", &mut event.previous)] {
                let Some(json) = slot.as_ref() else { continue };
                let mut value = json.to_value();
                let mut changed = false;
                for pointer in pointers {
                    if let Some(field) = value.pointer_mut(pointer) {
                        *field = serde_json::Value::String(REDACTED.to_owned());
                        redacted.push(format!("/{name}{pointer}"));
                        changed = true;
                    }
                }
                if changed {
                    *slot = Some(Json::from_value(&value));
                }
            }
        }
    }
    (!redacted.is_empty()).then_some(redacted)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::event::{Event, EventType};
    use crate::rng::{Rng, SeededRng};

    fn row(seq: i64, subject: &str) -> OutboxRow {
        OutboxRow::pending(
            Event {
                sequence: seq,
                ..Event::new(format!("e{seq}"), EventType::Created, "t", subject)
            },
            0,
        )
    }

    #[test]
    fn groups_keep_first_appearance_and_sequence_order() {
        let rows = vec![
            row(1, "a"),
            row(2, "b"),
            row(3, "a"),
            row(4, "c"),
            row(5, "b"),
        ];
        let groups = eligible_groups(
            rows,
            |r| r.event.subject.to_string(),
            &HashSet::new(),
            &HashSet::new(),
        );
        let shape: Vec<(String, Vec<i64>)> = groups
            .into_iter()
            .map(|g| (g.key, g.rows.iter().map(|r| r.sequence).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                ("a".into(), vec![1, 3]),
                ("b".into(), vec![2, 5]),
                ("c".into(), vec![4])
            ]
        );
    }

    #[test]
    fn held_and_blocked_keys_are_left_out() {
        let rows = vec![row(1, "a"), row(2, "b"), row(3, "c")];
        let held: HashSet<String> = ["a".to_owned()].into();
        let blocked: HashSet<String> = ["c".to_owned()].into();
        let groups = eligible_groups(rows, |r| r.event.subject.to_string(), &held, &blocked);
        assert_eq!(
            groups.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(),
            vec!["b"]
        );
    }

    #[test]
    fn window_doubles_up_to_sixteen_batches_only_when_full() {
        assert_eq!(widened_window(100, 100, true), Some(200));
        assert_eq!(widened_window(800, 100, true), Some(1600));
        assert_eq!(widened_window(1600, 100, true), None);
        assert_eq!(widened_window(100, 100, false), None);
        let mut w = 3;
        let mut seen = vec![w];
        while let Some(next) = widened_window(w, 3, true) {
            w = next;
            seen.push(w);
        }
        assert_eq!(seen, vec![3, 6, 12, 24, 48]);
    }

    #[test]
    fn acks_flush_when_the_window_fills_everyone_waits_or_the_delay_passes() {
        // Without a window (max_events 1) anything queued goes at once.
        assert_eq!(flush_due(0, false, 1, None, 0), FlushDue::Idle);
        assert_eq!(flush_due(1, false, 1, None, 0), FlushDue::Now);
        // A window of 100, the oldest ack due at t=50.
        assert_eq!(flush_due(0, true, 100, Some(50), 0), FlushDue::Idle);
        assert_eq!(flush_due(99, false, 100, Some(50), 10), FlushDue::At(50));
        assert_eq!(flush_due(100, false, 100, Some(50), 10), FlushDue::Now);
        assert_eq!(flush_due(3, true, 100, Some(50), 10), FlushDue::Now);
        assert_eq!(flush_due(3, false, 100, Some(50), 50), FlushDue::Now);
    }

    #[test]
    fn retries_then_parks_with_a_pinned_delay_sequence() {
        let options = DeliveryOptions::default().attempts(4);
        let rng = SeededRng::new(7);
        let decisions: Vec<FailureDecision> = (1..=4)
            .map(|n| on_failure(n, &HandlerErrorKind::Transient, &options, rng.next_f64()))
            .collect();
        let again = SeededRng::new(7);
        let expected_delays: Vec<i64> = (1..=3)
            .map(|n| options.backoff.full_jitter_ms(n, again.next_f64()))
            .collect();
        assert_eq!(
            decisions,
            vec![
                FailureDecision::Retry {
                    delay_ms: expected_delays[0]
                },
                FailureDecision::Retry {
                    delay_ms: expected_delays[1]
                },
                FailureDecision::Retry {
                    delay_ms: expected_delays[2]
                },
                FailureDecision::Park {
                    hold_key: true,
                    halt: false
                },
            ]
        );
    }

    #[test]
    fn one_attempt_means_no_retry() {
        let options = DeliveryOptions::default().attempts(1).hold_key(false);
        assert_eq!(
            on_failure(1, &HandlerErrorKind::Transient, &options, 0.5),
            FailureDecision::Park {
                hold_key: false,
                halt: false
            }
        );
    }

    #[test]
    fn permanent_parks_at_once_and_halt_is_reported() {
        let options = DeliveryOptions::default().poison(PoisonAction::Halt);
        assert_eq!(
            on_failure(1, &HandlerErrorKind::Permanent, &options, 0.5),
            FailureDecision::Park {
                hold_key: true,
                halt: true
            }
        );
    }

    #[test]
    fn retry_after_waits_exactly_as_told() {
        let options = DeliveryOptions::default();
        let kind = HandlerErrorKind::RetryAfter(Duration::from_millis(1_234));
        assert_eq!(
            on_failure(2, &kind, &options, 0.9),
            FailureDecision::Retry { delay_ms: 1_234 }
        );
    }

    #[test]
    fn attempt_log_prepends_the_stored_error_only_when_unknown() {
        let mut r = row(1, "a");
        let rec = |attempt: u32| AttemptRecord {
            attempt,
            started_at: Some(10),
            failed_at: Some(20),
            classification: None,
            retry_at: None,
            error: SerializedError::new("HandlerError", "x"),
        };
        assert_eq!(attempt_log(&r, vec![rec(1)]), vec![rec(1)]);
        r.attempts = 2;
        r.last_error = Some(SerializedError::new("HandlerError", "before restart"));
        r.next_attempt_at = Some(99);
        let log = attempt_log(&r, vec![rec(3)]);
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].attempt, log[0].started_at, log[0].retry_at),
            (2, None, Some(99))
        );
        assert_eq!(log[0].error.message, "before restart");
        assert_eq!(attempt_log(&r, vec![rec(2), rec(3)]).len(), 2);
    }

    #[test]
    fn redaction_keeps_fields_or_payloads_out() {
        let mut e = row(1, "a").event;
        e.data =
            Some(Json::parse(r#"{"card":{"number":"4242","exp":"12/30"},"email":"a@b"}"#).unwrap());
        e.previous = Some(Json::parse(r#"{"email":"old@b"}"#).unwrap());
        let mut fields = e.clone();
        let what = redact_event(
            &mut fields,
            &Redaction::Fields(vec!["/card/number".into(), "/email".into(), "/nope".into()]),
        );
        assert_eq!(
            what,
            Some(vec![
                "/data/card/number".to_owned(),
                "/data/email".to_owned(),
                "/previous/email".to_owned()
            ])
        );
        let data = fields.data.unwrap().to_value();
        assert_eq!(data["card"]["number"], REDACTED);
        assert_eq!(data["card"]["exp"], "12/30");
        assert_eq!(fields.previous.unwrap().to_value()["email"], REDACTED);
        let mut whole = e.clone();
        assert_eq!(
            redact_event(&mut whole, &Redaction::Payload),
            Some(vec!["data".to_owned(), "previous".to_owned()])
        );
        assert!(whole.data.is_none() && whole.previous.is_none());
        let mut untouched = e.clone();
        assert_eq!(redact_event(&mut untouched, &Redaction::None), None);
        assert_eq!(untouched, e);
    }

    #[test]
    fn parked_error_history_ends_with_the_last_error() {
        let first = SerializedError::new("HandlerError", "one");
        let last = SerializedError::new("HandlerError", "two");
        let parked = parked_error(Some(&first), last.clone());
        assert_eq!(parked.error, last);
        assert_eq!(parked.history, Some(vec![first, last.clone()]));
        assert_eq!(parked_error(None, last.clone()).history, Some(vec![last]));
    }
}
