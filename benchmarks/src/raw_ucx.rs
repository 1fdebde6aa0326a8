//! The raw UCX reference of a round trip on the UCX lane ([`RawUcx`]): what UCX itself
//! takes for the same round trip, so that the lane's median can be read as a ratio
//! against it ([`RawUcx::ratio`]). `local-send-recv` measures it in the same run, by the
//! same two processes, with the UCX library the lane loaded (`local_send_recv::raw_ucx`).

use crate::size::format_seconds;
use crate::timing::TimedIterations;

/// Timed raw UCX round trips: a tag send of `n` bytes, received into a pre-posted buffer
/// and sent back, each side busy-progressing its own worker (the record's `raw_ucx_time_us`,
/// `raw_ucx_n_iter`); [`TimedIterations::ratio`] is the lane's median over its median.
pub type RawUcx = TimedIterations;

/// The raw UCX row: its median round trip, its mean, and how it was measured.
pub fn format_raw_ucx(r: &RawUcx) -> String {
    format!("{} (mean {}; {})", format_seconds(r.median_seconds), format_seconds(r.mean_seconds()), r.method)
}

/// A ratio against raw UCX with two decimals, `1.23x`; `n/a` without one.
pub fn format_ratio(ratio: Option<f64>) -> String {
    match ratio {
        Some(r) => format!("{r:.2}x"),
        None => "n/a".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_reference_keeps_median_mean_and_count() {
        let times = [10, 30, 20, 40].map(Duration::from_micros);
        let r = RawUcx::from_times(&times, "tag ping-pong".into());
        assert_eq!((r.n_iter, r.method.as_str()), (4, "tag ping-pong"));
        assert!((r.median_seconds - 25e-6).abs() < 1e-12, "{r:?}");
        assert!((r.total_seconds - 100e-6).abs() < 1e-12, "{r:?}");
        assert!((r.mean_seconds() - 25e-6).abs() < 1e-12, "{r:?}");
        assert_eq!(format_raw_ucx(&r), "25.00 us (mean 25.00 us; tag ping-pong)");
        let none = RawUcx::from_times(&[], "none".into());
        assert_eq!((none.n_iter, none.mean_seconds(), none.median_seconds), (0, 0.0, 0.0));
    }

    #[test]
    fn the_ratio_is_the_lane_median_over_the_raw_median() {
        let r = RawUcx::from_times(&[Duration::from_micros(20)], "x".into());
        assert!((r.ratio(30e-6).unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(format_ratio(r.ratio(30e-6)), "1.50x");
        assert_eq!(r.ratio(0.0), None);
        assert_eq!(r.ratio(f64::INFINITY), None);
        assert_eq!(RawUcx::from_times(&[], "x".into()).ratio(30e-6), None);
        assert_eq!(format_ratio(None), "n/a");
    }
}
