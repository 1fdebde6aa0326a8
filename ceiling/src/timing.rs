//! The timing loop of the `serialize` and `spill` benchmarks: untimed set-up, the timed
//! operation, untimed clean-up, warm-up iterations first.

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
