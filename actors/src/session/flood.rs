//! Flood detection: inbound frames counted per one-second window.
//!
//! While an agent sends more than `limits.inbound_messages_per_sec`, its
//! updates are coalesced (never dropped). That is worth one warning per
//! burst, with the observed rate, not one per message and not silence: a
//! burst lasts until a window ends at or under the limit.

use std::time::{Duration, Instant};

/// The counting window.
const WINDOW: Duration = Duration::from_secs(1);

/// Frames in the current window and whether this burst was reported.
#[derive(Debug)]
pub(super) struct FloodMeter {
    window_start: Instant,
    count: u32,
    warned: bool,
}

impl FloodMeter {
    pub(super) fn new(now: Instant) -> Self {
        FloodMeter {
            window_start: now,
            count: 0,
            warned: false,
        }
    }

    /// Counts one frame. Returns the observed rate (frames per second) the
    /// first time a burst goes over `limit` (0 = no limit).
    pub(super) fn count(&mut self, now: Instant, limit: u32) -> Option<u32> {
        if now.duration_since(self.window_start) >= WINDOW {
            if self.count <= limit {
                self.warned = false; // the burst is over
            }
            self.window_start = now;
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        if limit == 0 || self.count <= limit || self.warned {
            return None;
        }
        self.warned = true;
        let elapsed = now.duration_since(self.window_start).as_secs_f64();
        let rate = f64::from(self.count) / elapsed.max(0.001);
        Some(rate.min(f64::from(u32::MAX)) as u32)
    }

    /// True while the current window is over `limit`.
    pub(super) fn flooded(&self, limit: u32) -> bool {
        limit > 0 && self.count > limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_burst_with_the_observed_rate() {
        let t0 = Instant::now();
        let mut m = FloodMeter::new(t0);
        let mut warnings = vec![];
        // Burst one: 10 frames in 100 ms against a limit of 5, then a second
        // window still over the limit (the same burst).
        for i in 0..10u32 {
            if let Some(r) = m.count(t0 + Duration::from_millis(u64::from(i) * 10), 5) {
                warnings.push(r);
            }
        }
        assert!(m.flooded(5));
        for i in 0..10u32 {
            let at = t0 + Duration::from_millis(1000 + u64::from(i) * 10);
            if let Some(r) = m.count(at, 5) {
                warnings.push(r);
            }
        }
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0] >= 100, "6 frames in 50 ms: {warnings:?}");
        // A quiet window ends the burst; the next one is reported again.
        m.count(t0 + Duration::from_millis(2500), 5);
        assert!(!m.flooded(5));
        let mut again = 0;
        for i in 0..10u32 {
            let at = t0 + Duration::from_millis(3600 + u64::from(i));
            again += usize::from(m.count(at, 5).is_some());
        }
        assert_eq!(again, 1);
    }

    #[test]
    fn no_limit_never_floods() {
        let t0 = Instant::now();
        let mut m = FloodMeter::new(t0);
        for _ in 0..10_000 {
            assert_eq!(m.count(t0, 0), None);
        }
        assert!(!m.flooded(0));
    }
}
