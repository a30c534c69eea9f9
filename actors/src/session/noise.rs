//! Warnings about what the agent sent wrong, rate-limited per session.
//!
//! Why this exists: a line the server skips (malformed JSON, an update it
//! cannot parse, a response to an id it never sent) is worth a log line, so
//! an operator can see why an agent misbehaves. But the agent decides how
//! many such lines there are: one that writes garbage in a loop made 29,000
//! warnings a second, about 21 MB/s of log, enough to fill the disk. So the
//! first [`PER_WINDOW`] warnings of each [`WINDOW`] are logged; the rest are
//! counted, and the next warning logged says how many were left out.
//!
//! The text logged is the agent's, so it is also made safe for a log line
//! ([`log_safe`]): control characters (ESC, CR, BEL, ...) and disguising
//! formatting ([`crate::text::disguises`]: bidi controls, zero-width
//! characters) are written escaped, so an agent cannot forge or hide log
//! lines.

use std::time::{Duration, Instant};

/// How long a window of warnings lasts.
const WINDOW: Duration = Duration::from_secs(10);

/// Warnings logged per window; the rest are counted.
const PER_WINDOW: u32 = 10;

/// The rate limit of one session's warnings about its agent.
#[derive(Debug)]
pub(super) struct NoiseLog {
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

/// What to do with one warning.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Log it; `left_out` warnings were not logged since the last one that was.
    Log { left_out: u64 },
    /// Count it, log nothing.
    Suppress,
}

impl NoiseLog {
    pub(super) fn new(now: Instant) -> Self {
        NoiseLog {
            window_start: now,
            logged: 0,
            suppressed: 0,
        }
    }

    /// Whether a warning at `now` is logged.
    pub(super) fn admit(&mut self, now: Instant) -> Verdict {
        if now.duration_since(self.window_start) >= WINDOW {
            self.window_start = now;
            self.logged = 0;
        }
        if self.logged >= PER_WINDOW {
            self.suppressed = self.suppressed.saturating_add(1);
            return Verdict::Suppress;
        }
        self.logged += 1;
        Verdict::Log {
            left_out: std::mem::take(&mut self.suppressed),
        }
    }
}

pub(crate) use crate::text::log_safe;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warnings_of_a_window_are_logged_and_the_rest_counted() {
        let t0 = Instant::now();
        let mut log = NoiseLog::new(t0);
        for _ in 0..PER_WINDOW {
            assert_eq!(log.admit(t0), Verdict::Log { left_out: 0 });
        }
        for _ in 0..1000 {
            assert_eq!(log.admit(t0 + Duration::from_secs(1)), Verdict::Suppress);
        }
        // The next window logs again and says how many were left out.
        assert_eq!(log.admit(t0 + WINDOW), Verdict::Log { left_out: 1000 });
        assert_eq!(log.admit(t0 + WINDOW), Verdict::Log { left_out: 0 });
    }

    #[test]
    fn a_flood_logs_a_bounded_number_of_lines() {
        let t0 = Instant::now();
        let mut log = NoiseLog::new(t0);
        // 29,000 warnings a second for a minute.
        let logged = (0..29_000u64 * 60)
            .filter(|i| {
                let at = t0 + Duration::from_micros(i * 1_000_000 / 29_000);
                matches!(log.admit(at), Verdict::Log { .. })
            })
            .count();
        assert_eq!(logged, 6 * PER_WINDOW as usize);
    }
}
