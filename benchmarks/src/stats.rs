//! Averages, medians and latency percentiles of timed iterations.
//!
//! Percentiles (p99, p99.9) come from an HDR histogram ([`latency_histogram`], the
//! `hdrhistogram` crate) of the times in whole nanoseconds, keeping
//! [`LATENCY_SIGNIFICANT_DIGITS`] significant digits: the value at quantile q is the
//! ⌈q·n⌉-th smallest time (nearest rank), read as the upper end of its histogram bucket
//! but never above the slowest time recorded: less than 1/1024 of it (under 0.1 %) above
//! the time recorded. The median stays the exact one ([`median`]).

use hdrhistogram::Histogram;
use std::time::Duration;

/// Significant decimal digits the latency histogram keeps (its buckets are narrower than
/// 1/1024 of the values they hold; below 2048 ns every nanosecond has its own).
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// An HDR histogram of `seconds`, recorded in whole nanoseconds (rounded; a negative or
/// NaN time counts as 0), sized to the largest of them.
pub fn latency_histogram(seconds: &[f64]) -> Histogram<u64> {
    // `as` saturates: NaN and negative values become 0, huge ones u64::MAX.
    let nanos: Vec<u64> = seconds.iter().map(|s| (s * 1e9).round() as u64).collect();
    let highest = nanos.iter().copied().max().unwrap_or(0).max(2);
    let mut histogram = Histogram::new_with_max(highest, LATENCY_SIGNIFICANT_DIGITS)
        .expect("bounds 1..=highest with highest >= 2 and 3 significant digits are valid");
    for n in nanos {
        histogram.saturating_record(n);
    }
    histogram
}

/// The arithmetic mean; `None` for no values.
pub fn average(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The median (mean of the two middle values for an even count); `None` for no values.
/// The ceiling crate's, which its floors use too.
pub use ferrylink_ceiling::timing::median;

/// Timed iterations of one operation that moves `bytes_per_iter` bytes each time.
///
/// The averages follow ucx-py: the **average bandwidth** is the total bytes over the total
/// time (`Σbytes / Σt`, not the mean of per-iteration rates), the **median bandwidth** is
/// the median of per-iteration rates; latencies are the mean and median of the times, and
/// the percentiles of their HDR histogram ([`Summary::latency_quantile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Bytes one iteration moves (a round trip of n bytes moves 2·n).
    pub bytes_per_iter: f64,
    /// Seconds each timed iteration took.
    pub seconds: Vec<f64>,
}

impl Summary {
    /// From durations.
    pub fn new(bytes_per_iter: f64, times: &[Duration]) -> Self {
        Self { bytes_per_iter, seconds: times.iter().map(Duration::as_secs_f64).collect() }
    }

    /// Σbytes / Σt in bytes per second (0 without iterations).
    pub fn bandwidth_avg(&self) -> f64 {
        let total: f64 = self.seconds.iter().sum();
        if total > 0.0 {
            self.bytes_per_iter * self.seconds.len() as f64 / total
        } else {
            0.0
        }
    }

    /// Median of per-iteration bandwidths in bytes per second.
    pub fn bandwidth_median(&self) -> f64 {
        median(&self.bandwidths()).unwrap_or(0.0)
    }

    /// Per-iteration bandwidths in bytes per second.
    pub fn bandwidths(&self) -> Vec<f64> {
        self.seconds.iter().map(|&t| if t > 0.0 { self.bytes_per_iter / t } else { f64::INFINITY }).collect()
    }

    /// Mean time per iteration in seconds.
    pub fn latency_avg(&self) -> f64 {
        average(&self.seconds).unwrap_or(0.0)
    }

    /// Median time per iteration in seconds.
    pub fn latency_median(&self) -> f64 {
        median(&self.seconds).unwrap_or(0.0)
    }

    /// The time per iteration at quantile `q` (0.99 for p99) in seconds, from the HDR
    /// histogram of the times (see the module documentation); 0 without iterations.
    pub fn latency_quantile(&self, q: f64) -> f64 {
        if self.seconds.is_empty() {
            return 0.0;
        }
        let slowest = self.seconds.iter().copied().fold(0.0, f64::max);
        (latency_histogram(&self.seconds).value_at_quantile(q) as f64 * 1e-9).min(slowest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_and_median() {
        assert_eq!(average(&[]), None);
        assert_eq!(median(&[]), None);
        assert_eq!(average(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(median(&[6.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn summary_uses_total_time_for_the_average() {
        let s = Summary::new(100.0, &[Duration::from_secs(1), Duration::from_secs(3)]);
        assert_eq!(s.bandwidth_avg(), 50.0); // 200 bytes in 4 s
        assert_eq!(s.bandwidths(), vec![100.0, 100.0 / 3.0]);
        assert!((s.bandwidth_median() - (100.0 + 100.0 / 3.0) / 2.0).abs() < 1e-9);
        assert_eq!(s.latency_avg(), 2.0);
        assert_eq!(s.latency_median(), 2.0);
        let empty = Summary::new(1.0, &[]);
        assert_eq!(empty.bandwidth_avg(), 0.0);
        assert_eq!(empty.latency_median(), 0.0);
        assert_eq!(empty.latency_quantile(0.99), 0.0);
    }

    /// `q`'s value read from the histogram lies at or above the exact nearest-rank value,
    /// by less than 1/1024 of it.
    fn assert_near_rank(summary: &Summary, q: f64, exact: f64) {
        let got = summary.latency_quantile(q);
        assert!(got >= exact && got < exact * (1.0 + 1.0 / 1024.0), "q {q}: {got} s, exact {exact} s");
    }

    #[test]
    fn percentiles_of_one_to_ten_thousand_microseconds() {
        let times: Vec<Duration> = (1..=10_000).map(Duration::from_micros).collect();
        let s = Summary::new(1.0, &times);
        assert_near_rank(&s, 0.5, 5_000e-6);
        assert_near_rank(&s, 0.99, 9_900e-6);
        assert_near_rank(&s, 0.999, 9_990e-6);
        assert_near_rank(&s, 1.0, 10_000e-6);
        // The histogram's bucket of 10 ms reaches above it; the slowest time caps it.
        assert_eq!(s.latency_quantile(1.0), 10_000e-6);
        // Below 2048 ns the histogram keeps every nanosecond.
        let small: Vec<Duration> = (1..=1000).map(Duration::from_nanos).collect();
        assert_eq!(Summary::new(1.0, &small).latency_quantile(0.99), 990e-9);
        assert_eq!(Summary::new(1.0, &small).latency_quantile(0.999), 999e-9);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        // 990 fast iterations and 10 slow ones: p99 is the 990th time (fast), p99.9 the
        // 999th (slow).
        let mut times = vec![Duration::from_micros(10); 990];
        times.extend([Duration::from_millis(3); 10]);
        let s = Summary::new(1.0, &times);
        assert_near_rank(&s, 0.99, 10e-6);
        assert_near_rank(&s, 0.999, 3e-3);
        // With fewer than 100 iterations p99 is the slowest one, as is p99.9 below 1000.
        let few = Summary::new(1.0, &[Duration::from_micros(5), Duration::from_micros(7), Duration::from_micros(6)]);
        assert_near_rank(&few, 0.99, 7e-6);
        assert_near_rank(&few, 0.999, 7e-6);
        assert_eq!(few.latency_median(), 6e-6);
    }

    #[test]
    fn the_histogram_takes_odd_times_without_panicking() {
        let h = latency_histogram(&[f64::NAN, -1.0, 0.0, 1e-9, 1e6]);
        assert_eq!(h.len(), 5);
        assert_eq!(h.value_at_quantile(0.6), 0, "NaN, negative and zero count as 0 ns");
        let (max, kept) = (h.max() as f64, 1e15);
        assert!(max >= kept && max < kept * (1.0 + 1.0 / 1024.0), "a time of 10^6 s is kept: {max} ns");
        assert_eq!(latency_histogram(&[]).len(), 0);
    }
}
