//! The timing loop of the `serialize` and `spill` benchmarks: untimed set-up, the timed
//! operation, untimed clean-up, warm-up iterations first; the median; and
//! [`TimedIterations`], what a reference measurement (a floor, raw UCX) keeps.

use std::time::{Duration, Instant};

/// Runs `n_warmup + n_iter` iterations of `prepare(i)` (untimed) → `op` (timed) →
/// `after(i, result)` (untimed) and returns the durations of the last `n_iter` ops. The
/// first error stops the loop.
pub fn measure<P, T, E>(
    n_warmup: usize,
    n_iter: usize,
    mut prepare: impl FnMut(usize) -> Result<P, E>,
    mut op: impl FnMut(P) -> Result<T, E>,
    mut after: impl FnMut(usize, T) -> Result<(), E>,
) -> Result<Vec<Duration>, E> {
    let mut times = Vec::with_capacity(n_iter);
    for i in 0..n_warmup + n_iter {
        let input = prepare(i)?;
        let start = Instant::now();
        let out = op(input)?;
        let elapsed = start.elapsed();
        after(i, out)?;
        if i >= n_warmup {
            times.push(elapsed);
        }
    }
    Ok(times)
}

/// The timed iterations of a reference a round trip is judged against (the floor, raw
/// UCX's round trip): what was timed, their total, count and median, kept so that a reader
/// of the JSON record can recompute what is derived from them.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedIterations {
    /// What was timed, for the table and the JSON record.
    pub method: String,
    /// Σt of the timed iterations in seconds.
    pub total_seconds: f64,
    /// The timed iterations.
    pub n_iter: usize,
    /// The median time of one iteration in seconds.
    pub median_seconds: f64,
}

impl TimedIterations {
    /// The iterations `times`, timed by `method`.
    pub fn from_times(times: &[Duration], method: String) -> Self {
        let seconds: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
        let median_seconds = median(&seconds).unwrap_or(0.0);
        TimedIterations { method, total_seconds: seconds.iter().sum(), n_iter: seconds.len(), median_seconds }
    }

    /// The mean time of one iteration in seconds (0 without iterations).
    pub fn mean_seconds(&self) -> f64 {
        if self.n_iter == 0 {
            0.0
        } else {
            self.total_seconds / self.n_iter as f64
        }
    }

    /// `this / round trip`, both mean times (a fraction; 1 is a round trip as fast as this):
    /// a floor's efficiency, which is the round trip's average bandwidth over the floor's
    /// 2·n/t. `None` when either time is not positive.
    pub fn efficiency(&self, round_trip_mean_seconds: f64) -> Option<f64> {
        let this = self.mean_seconds();
        (this > 0.0 && round_trip_mean_seconds > 0.0 && round_trip_mean_seconds.is_finite())
            .then(|| this / round_trip_mean_seconds)
    }

    /// `round trip / this`, both medians: how many of these a round trip takes (raw UCX's
    /// ratio: 1 is the lane at raw UCX's speed). `None` when either median is not positive.
    pub fn ratio(&self, round_trip_median_seconds: f64) -> Option<f64> {
        let this = self.median_seconds;
        (this > 0.0 && round_trip_median_seconds > 0.0 && round_trip_median_seconds.is_finite())
            .then(|| round_trip_median_seconds / this)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_only_the_operation_after_warmup() {
        let mut seen = Vec::new();
        let times = measure::<usize, usize, ()>(
            2,
            3,
            |i| Ok(i * 10),
            |x| Ok(x + 1),
            |i, out| {
                seen.push((i, out));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(times.len(), 3);
        assert_eq!(seen, vec![(0, 1), (1, 11), (2, 21), (3, 31), (4, 41)]);
        let err = measure::<(), (), &str>(0, 5, |_| Ok(()), |_| Err("boom"), |_, _| Ok(()));
        assert_eq!(err, Err("boom"));
    }
}
