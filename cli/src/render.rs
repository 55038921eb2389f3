//! Text output: tables, times and durations a person reads.

use watukuy_core::store::{Circuit, ParkedRow, SerializedError};

use crate::ops::{KeyInspect as PollerInspect, Report};

/// Epoch milliseconds as RFC 3339 UTC (`2026-01-01T00:00:00.000Z`).
pub(crate) fn time(ms: i64) -> String {
    watukuy_core::cursor::format_timestamp(ms, "").unwrap_or_else(|| format!("{ms} ms"))
}

/// A duration for people: `850ms`, `12.5s`, `3m05s`, `2h10m`, `4d03h`.
pub(crate) fn duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let (s, m, h, d) = (ms / 1000, ms / 60_000, ms / 3_600_000, ms / 86_400_000);
    let text = if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{s}.{}s", (ms % 1000) / 100)
    } else if ms < 3_600_000 {
        format!("{m}m{:02}s", s % 60)
    } else if ms < 86_400_000 {
        format!("{h}h{:02}m", m % 60)
    } else {
        format!("{d}d{:02}h", h % 24)
    };
    format!("{sign}{text}")
}

/// `in 5.0s`, `12.0s ago` or `now`.
pub(crate) fn relative(at: i64, now: i64) -> String {
    match at.saturating_sub(now) {
        0 => "now".to_owned(),
        d if d > 0 => format!("in {}", duration(d)),
        d => format!("{} ago", duration(d.saturating_neg())),
    }
}

/// Columns padded to their widest cell, two spaces apart, no trailing blanks.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(cell);
            let pad = widths[i].saturating_sub(cell.chars().count());
            out.extend(std::iter::repeat_n(' ', pad));
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// At most `max` characters, with `…` when cut; newlines become spaces.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `CODE: message` (or `Name: message`).
pub(crate) fn error(error: &SerializedError) -> String {
    let label = error.code.as_deref().unwrap_or(&error.name);
    match error.status {
        Some(status) => format!("{label} {status}: {}", error.message),
        None => format!("{label}: {}", error.message),
    }
}

fn key_label(p: &PollerInspect) -> String {
    if p.partition.is_empty() {
        p.poller.clone()
    } else {
        format!("{}/{}", p.poller, p.partition)
    }
}

fn circuit(c: Circuit) -> &'static str {
    match c {
        Circuit::Closed => "closed",
        Circuit::Open => "OPEN",
        Circuit::HalfOpen => "half-open",
    }
}

/// What the key is doing, in one word or three.
fn state(p: &PollerInspect, now: i64) -> String {
    if p.paused {
        return "paused".to_owned();
    }
    if let Some(lease) = &p.lease {
        if lease.expires_at > now {
            return format!("running ({})", lease.owner);
        }
        return format!("lease expired ({})", lease.owner);
    }
    if p.schedule.throttled_until.is_some_and(|t| t > now) {
        return "throttled".to_owned();
    }
    "idle".to_owned()
}

/// The readable `inspect` report: a table, the cursors, and what needs attention.
pub(crate) fn report(report: &Report) -> String {
    let now = report.generated_at;
    let mut out = format!("store {}  at {}\n\n", report.store, time(now));
    if report.pollers.is_empty() {
        out.push_str("no pollers in this store yet (they appear after their first run)\n");
        return out;
    }
    let rows: Vec<Vec<String>> = report
        .pollers
        .iter()
        .map(|p| {
            let s = &p.schedule;
            vec![
                p.poller.clone(),
                if p.partition.is_empty() {
                    "-".to_owned()
                } else {
                    p.partition.clone()
                },
                state(p, now),
                circuit(s.circuit).to_owned(),
                s.consecutive_failures.to_string(),
                p.lag_ms.map_or_else(|| "-".to_owned(), duration),
                p.outbox_pending.to_string(),
                p.parked.to_string(),
                p.items.to_string(),
                s.next_due_at
                    .map_or_else(|| "now".to_owned(), |at| relative(at, now)),
                s.last_poll_at
                    .map_or_else(|| "never".to_owned(), |at| relative(at, now)),
                s.last_error
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |e| cut(&error(e), 60)),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "POLLER",
            "PARTITION",
            "STATE",
            "CIRCUIT",
            "FAILURES",
            "LAG",
            "OUTBOX",
            "PARKED",
            "ITEMS",
            "NEXT DUE",
            "LAST POLL",
            "LAST ERROR",
        ],
        &rows,
    ));
    out.push_str("\ncursors\n");
    for p in &report.pollers {
        let c = &p.cursors;
        let lanes = [
            ("live", &c.live),
            ("reconcile", &c.reconcile),
            ("backfill", &c.backfill),
            ("replay", &c.replay),
        ];
        let shown: Vec<String> = lanes
            .iter()
            .filter_map(|(lane, v)| v.as_ref().map(|v| format!("{lane}={v}")))
            .collect();
        let shown = if shown.is_empty() {
            "(initial)".to_owned()
        } else {
            shown.join("  ")
        };
        out.push_str(&format!("  {}: {shown}\n", key_label(p)));
    }
    let notes = attention(report);
    if !notes.is_empty() {
        out.push_str("\nneeds attention (see docs/runbook.md)\n");
        for note in notes {
            out.push_str(&format!("  {note}\n"));
        }
    }
    out
}

/// The runbook's symptoms, as found in the report.
fn attention(report: &Report) -> Vec<String> {
    let now = report.generated_at;
    let mut notes = Vec::new();
    for p in &report.pollers {
        let key = key_label(p);
        let s = &p.schedule;
        match s.circuit {
            Circuit::Closed => {}
            Circuit::Open | Circuit::HalfOpen => notes.push(format!(
                "{key}: circuit {} since {} after {} failures; next probe {} (runbook: circuit open)",
                circuit(s.circuit),
                s.circuit_opened_at.map_or_else(|| "?".to_owned(), time),
                s.consecutive_failures,
                s.next_due_at.map_or_else(|| "now".to_owned(), |at| relative(at, now)),
            )),
        }
        if s.circuit == Circuit::Closed && s.consecutive_failures > 0 {
            notes.push(format!(
                "{key}: {} consecutive failures, backing off (runbook: circuit open)",
                s.consecutive_failures
            ));
        }
        if let Some(e) = &s.last_error
            && e.code.as_deref() == Some("CONFIG")
        {
            notes.push(format!(
                "{key}: configuration error, no retry fixes it: {} (runbook: circuit open)",
                cut(&e.message, 100)
            ));
        }
        if let Some(poll) = s.last_poll.as_ref().filter(|poll| poll.quarantined > 0) {
            notes.push(format!(
                "{key}: the last {} cycle quarantined {} of {} items as invalid; when it is all \
                 of them, suspect the item type (e.g. numeric ids into a String field) \
                 (runbook: parked > 0)",
                poll.lane.as_str(),
                poll.quarantined,
                poll.items
            ));
        }
        if p.parked > 0 {
            notes.push(format!(
                "{key}: {} parked; `watukuy parked ls --poller {}{}` (runbook: parked > 0)",
                p.parked,
                p.poller,
                if p.partition.is_empty() {
                    String::new()
                } else {
                    format!(" --partition {}", p.partition)
                }
            ));
        }
        if let Some(lease) = &p.lease
            && lease.expires_at <= now
        {
            notes.push(format!(
                "{key}: lease of {} expired {} and was not released (runbook: lease lost)",
                lease.owner,
                relative(lease.expires_at, now)
            ));
        }
        if let Some(until) = s.throttled_until
            && until > now
        {
            notes.push(format!(
                "{key}: throttled by the API (Retry-After) until {} (runbook: lag growing)",
                time(until)
            ));
        }
        if p.paused && p.outbox_pending > 0 {
            notes.push(format!(
                "{key}: paused with {} events waiting in the outbox (runbook: outbox growing)",
                p.outbox_pending
            ));
        }
    }
    notes
}

/// Parked rows as a table.
pub(crate) fn parked(rows: &[ParkedRow], now: i64) -> String {
    if rows.is_empty() {
        return "no parked rows\n".to_owned();
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.kind.as_str().to_owned(),
                r.event.as_ref().map_or_else(
                    || "-".to_owned(),
                    |e| format!("{} {}", e.event_type, cut(&e.subject, 40)),
                ),
                r.attempts.to_string(),
                relative(r.parked_at, now),
                cut(&error(&r.error.error), 70),
            ]
        })
        .collect();
    table(
        &["ID", "KIND", "EVENT", "ATTEMPTS", "PARKED", "ERROR"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_500), "12.5s");
        assert_eq!(duration(185_000), "3m05s");
        assert_eq!(duration(7_800_000), "2h10m");
        assert_eq!(duration(356_400_000), "4d03h");
        assert_eq!(duration(-1_500), "-1.5s");
        assert_eq!(relative(10, 10), "now");
        assert_eq!(relative(5_010, 10), "in 5.0s");
        assert_eq!(relative(10, 12_010), "12.0s ago");
    }

    #[test]
    fn tables_align() {
        let out = table(
            &["A", "BB"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["é".into(), "22".into()],
            ],
        );
        assert_eq!(out, "A    BB\nxyz  1\né    22\n");
        assert_eq!(cut("a\nb", 10), "a b");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(time(1_767_225_600_000), "2026-01-01T00:00:00.000Z");
    }
}
