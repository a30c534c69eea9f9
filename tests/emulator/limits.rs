//! Slack's published Web API rate limits, as the emulator enforces them.
//!
//! Why this exists: a gateway that only looks right against an unlimited
//! fake learns Slack's limits in production, from `429`s. With limits on
//! ([`super::Emulator::start_with_limits`]), every write method draws from a
//! GCRA bucket shaped like Slack's published limit (`chat.postMessage`:
//! about one message per second per channel with a short burst; the other
//! methods per workspace at their tier) and a call past it is answered
//! `429 Too Many Requests` with `Retry-After` in whole seconds, as Slack
//! does. Bursts here are one larger than the gateway's own pacing allows,
//! the way Slack tolerates short bursts it does not publish.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// One limit: a call every `period` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub period: Duration,
    pub burst: u32,
}

impl Limit {
    const fn per_minute(n: u64, burst: u32) -> Limit {
        Limit {
            period: Duration::from_millis(60_000 / n),
            burst,
        }
    }
}

/// The limits per method; `chat.postMessage` is limited per channel.
#[derive(Debug, Clone)]
pub struct RateLimits {
    pub methods: HashMap<&'static str, Limit>,
}

/// Methods limited per channel rather than per workspace.
const PER_CHANNEL: &[&str] = &["chat.postMessage"];

impl RateLimits {
    /// Slack's published limits (Tier 2: 20+/min, Tier 3: 50+/min, Tier 4:
    /// 100+/min; `chat.postMessage` 1/s per channel).
    pub fn slack() -> RateLimits {
        let methods = [
            (
                "chat.postMessage",
                Limit {
                    period: Duration::from_secs(1),
                    burst: 3,
                },
            ),
            ("chat.update", Limit::per_minute(50, 4)),
            ("reactions.add", Limit::per_minute(50, 4)),
            ("reactions.remove", Limit::per_minute(20, 3)),
            ("chat.postEphemeral", Limit::per_minute(100, 4)),
            ("views.open", Limit::per_minute(100, 4)),
            ("files.getUploadURLExternal", Limit::per_minute(100, 4)),
            ("files.completeUploadExternal", Limit::per_minute(100, 4)),
        ];
        RateLimits {
            methods: methods.into_iter().collect(),
        }
    }

    /// Every period divided by `factor` (tests that cannot wait a second
    /// per message; the gateway is sped up by the same factor).
    pub fn faster(mut self, factor: u32) -> RateLimits {
        for limit in self.methods.values_mut() {
            limit.period /= factor.max(1);
        }
        self
    }
}

/// Accepted calls and `429`s of one method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub accepted: u64,
    pub limited: u64,
}

/// The buckets, filled on first use.
pub(super) struct Limiter {
    limits: RateLimits,
    buckets: HashMap<(String, String), DefaultDirectRateLimiter>,
}

impl Limiter {
    pub(super) fn new(limits: RateLimits) -> Limiter {
        Limiter {
            limits,
            buckets: HashMap::new(),
        }
    }

    /// Admits a call of `method` into `channel`, or says how many whole
    /// seconds to wait (Slack's `Retry-After`).
    pub(super) fn admit(&mut self, method: &str, channel: &str) -> Result<(), u64> {
        let Some(limit) = self.limits.methods.get(method).copied() else {
            return Ok(());
        };
        let scope = if PER_CHANNEL.contains(&method) {
            channel.to_owned()
        } else {
            String::new()
        };
        let bucket = self
            .buckets
            .entry((method.to_owned(), scope))
            .or_insert_with(|| {
                let burst = NonZeroU32::new(limit.burst.max(1)).unwrap_or(NonZeroU32::MIN);
                let quota = Quota::with_period(limit.period)
                    .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
                    .allow_burst(burst);
                RateLimiter::direct(quota)
            });
        bucket.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
    }
}
