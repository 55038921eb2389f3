//! Real time, resident memory and statistics.
//!
//! A benchmark measures real elapsed time, which the workspace's clippy configuration bans outside
//! `watukuy_core::clock` (so that *tests* never depend on wall time). This binary is not a test:
//! [`Stopwatch`] is the one place that reads the monotonic clock, with a local `allow`.

use std::time::{Duration, Instant};

/// A monotonic stopwatch over real time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    /// Starts now.
    // A benchmark measures real time: this is not a test, so the ban on ambient clocks (which
    // keeps tests deterministic) does not apply here.
    #[allow(clippy::disallowed_methods)]
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    /// Time since start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// Nanoseconds since start (saturating).
    pub(crate) fn nanos(&self) -> u64 {
        u64::try_from(self.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// `count / seconds`.
pub(crate) fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        as_f64(count) / secs
    }
}

/// A count as a float, for rates and ratios.
// Counts in this benchmark stay far below 2^52, so the conversion is exact.
#[allow(clippy::cast_precision_loss)]
pub(crate) fn as_f64(n: u64) -> f64 {
    n as f64
}

/// A `/proc/self/status` field in kB (`VmRSS`, `VmHWM`, ...), if readable (Linux only).
pub(crate) fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// The resident set size now, in kB (0 if unknown).
pub(crate) fn rss_kb() -> u64 {
    status_kb("VmRSS").unwrap_or(0)
}

/// The peak resident set size (`VmHWM`) in kB (0 if unknown).
pub(crate) fn peak_rss_kb() -> u64 {
    status_kb("VmHWM").unwrap_or(0)
}

/// Resets the peak RSS to the current RSS (`echo 5 > /proc/self/clear_refs`), so that the next
/// [`peak_rss_kb`] covers one phase only. Returns false where the kernel does not support it.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The median of `values` (0 for none).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        f64::midpoint(v[mid - 1], v[mid])
    }
}

/// The median of integer samples (the lower middle for an even count).
pub(crate) fn median_u64(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// The `p`-th percentile (nearest rank, `p` in 0..=100) of `samples`, which it sorts.
pub(crate) fn percentile(samples: &mut [u64], p: u32) -> u64 {
    if samples.is_empty() {
        return 0;
    }
    samples.sort_unstable();
    let n = samples.len();
    let rank = (n * usize::try_from(p).unwrap_or(100)).div_ceil(100);
    samples[rank.clamp(1, n) - 1]
}

/// Formats a rate as `12,345/s`.
pub(crate) fn fmt_rate(rate: f64) -> String {
    if rate <= 0.0 || !rate.is_finite() {
        return "—".to_owned();
    }
    format!("{}/s", group_digits(rate.round()))
}

/// `1234567` as `1,234,567`.
pub(crate) fn group_digits(value: f64) -> String {
    let text = format!("{value:.0}");
    let (sign, digits) = text
        .strip_prefix('-')
        .map_or(("", text.as_str()), |d| ("-", d));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// A ratio as a percentage, `—` when the reference is missing.
pub(crate) fn fmt_ratio(ours: f64, reference: f64) -> String {
    if reference <= 0.0 || ours <= 0.0 {
        "—".to_owned()
    } else {
        format!("{:.0} %", 100.0 * ours / reference)
    }
}

/// kB as MiB with one decimal.
pub(crate) fn fmt_mib(kb: u64) -> String {
    format!("{:.1} MiB", as_f64(kb) / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut v, 50), 50);
        assert_eq!(percentile(&mut v, 99), 99);
        assert_eq!(percentile(&mut v, 100), 100);
        assert_eq!(percentile(&mut [], 50), 0);
    }

    #[test]
    fn medians_and_formatting() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median(&[4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < f64::EPSILON);
        assert_eq!(median_u64(&[5, 1, 3, 2]), 2);
        assert_eq!(group_digits(1_234_567.0), "1,234,567");
        assert_eq!(group_digits(999.0), "999");
        assert_eq!(fmt_ratio(80.0, 100.0), "80 %");
    }

    #[test]
    fn status_fields_parse() {
        // On Linux both fields are present and non-zero.
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(rss_kb() > 0);
            assert!(peak_rss_kb() > 0);
        }
    }
}
