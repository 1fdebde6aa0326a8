//! Averages and medians of timed iterations.

use std::time::Duration;

/// The arithmetic mean; `None` for no values.
pub fn average(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The median (mean of the two middle values for an even count); `None` for no values.
/// NaNs sort last.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 })
}

/// Timed iterations of one operation that moves `bytes_per_iter` bytes each time.
///
/// The averages follow ucx-py: the **average bandwidth** is the total bytes over the total
/// time (`Σbytes / Σt`, not the mean of per-iteration rates), the **median bandwidth** is
/// the median of per-iteration rates; latencies are the mean and median of the times.
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
    }
}
