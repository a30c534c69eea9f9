//! Pacing: the gateway stays under Slack's published rate limits instead of
//! learning them from `429`s.
//!
//! Why this exists: Slack answers `429 Too Many Requests` past its limits,
//! and a gateway that only backs off after a `429` spends most of a busy
//! channel's budget on refused calls (the issue measured 1,319 refusals for
//! 222 accepted calls). Each Web API method gets a GCRA token bucket
//! (`governor`) configured with Slack's published rate: `chat.postMessage`
//! about one message per second *per channel* with a short burst, the other
//! methods per workspace at their tier (Tier 2: 20+/min, Tier 3: 50+/min,
//! Tier 4: 100+/min). A call is only started when its bucket has a token; a
//! `429` that still comes pauses that bucket for its `Retry-After`.
//!
//! Chatter (anything but a decision) also draws from a second, slower
//! bucket of the same method and channel (`chatter_share_pct` of the rate),
//! so a channel saturated with chatter still has a token in hand when a
//! request's buttons or outcome arrive, instead of a second's wait.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// A Slack Web API method the gateway calls (uploads count as one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `chat.postMessage` (limited per channel).
    PostMessage,
    /// `chat.update` (Tier 3).
    Update,
    /// `reactions.add` (Tier 3).
    ReactionsAdd,
    /// `reactions.remove` (Tier 2).
    ReactionsRemove,
    /// `files.getUploadURLExternal` + `files.completeUploadExternal` (Tier 4 each).
    Upload,
    /// `chat.postEphemeral` (Tier 4).
    PostEphemeral,
    /// `views.open` (Tier 4).
    ViewsOpen,
}

/// One rate: on average one call every `period`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Time to earn one call back.
    pub period: Duration,
    /// Calls that may go at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Rate {
    /// `n` calls a minute, `burst` at once.
    pub const fn per_minute(n: u64, burst: u32) -> Rate {
        Rate {
            period: Duration::from_millis(60_000 / n),
            burst,
        }
    }

    fn limiter(self) -> Option<DefaultDirectRateLimiter> {
        let burst = NonZeroU32::new(self.burst.max(1))?;
        let quota = Quota::with_period(self.period)?.allow_burst(burst);
        Some(RateLimiter::direct(quota))
    }
}

/// What the gateway paces itself to, and how long a status line settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacingPolicy {
    /// `chat.postMessage`, per channel; `None`: unpaced.
    pub post_message: Option<Rate>,
    /// `chat.update`.
    pub update: Option<Rate>,
    /// `reactions.add`.
    pub reactions_add: Option<Rate>,
    /// `reactions.remove`.
    pub reactions_remove: Option<Rate>,
    /// A snippet upload (two Tier 4 calls).
    pub upload: Option<Rate>,
    /// `chat.postEphemeral`.
    pub ephemeral: Option<Rate>,
    /// `views.open`.
    pub views: Option<Rate>,
    /// A status-line update waits this long for a newer one to replace it
    /// (a request opened and decided within it costs no status update).
    pub status_settle: Duration,
    /// ... but is never held longer than this after the first change.
    pub status_hold_max: Duration,
    /// The share of each rate chatter may use (percent, 1-100; 100: no
    /// reserve for decisions).
    pub chatter_share_pct: u32,
}

impl Default for PacingPolicy {
    fn default() -> Self {
        PacingPolicy::slack()
    }
}

impl PacingPolicy {
    /// Slack's published limits (api.slack.com/apis/rate-limits), with
    /// bursts kept below what Slack tolerates.
    pub fn slack() -> PacingPolicy {
        PacingPolicy {
            post_message: Some(Rate {
                period: Duration::from_secs(1),
                burst: 2,
            }),
            update: Some(Rate::per_minute(50, 3)),
            reactions_add: Some(Rate::per_minute(50, 3)),
            reactions_remove: Some(Rate::per_minute(20, 2)),
            upload: Some(Rate::per_minute(50, 2)),
            ephemeral: Some(Rate::per_minute(100, 3)),
            views: Some(Rate::per_minute(100, 3)),
            status_settle: Duration::from_millis(1500),
            status_hold_max: Duration::from_secs(5),
            chatter_share_pct: 80,
        }
    }

    /// No pacing and no settling (tests that count exact call sequences).
    pub fn unpaced() -> PacingPolicy {
        PacingPolicy {
            post_message: None,
            update: None,
            reactions_add: None,
            reactions_remove: None,
            upload: None,
            ephemeral: None,
            views: None,
            status_settle: Duration::ZERO,
            status_hold_max: Duration::ZERO,
            chatter_share_pct: 100,
        }
    }

    /// The same policy with every period and delay divided by `factor`
    /// (tests and benches that cannot wait a second per message).
    pub fn faster(mut self, factor: u32) -> PacingPolicy {
        let factor = factor.max(1);
        for rate in [
            &mut self.post_message,
            &mut self.update,
            &mut self.reactions_add,
            &mut self.reactions_remove,
            &mut self.upload,
            &mut self.ephemeral,
            &mut self.views,
        ]
        .into_iter()
        .flatten()
        {
            rate.period /= factor;
        }
        self.status_settle /= factor;
        self.status_hold_max /= factor;
        self
    }

    /// The rate of `method`.
    pub fn rate(&self, method: Method) -> Option<Rate> {
        match method {
            Method::PostMessage => self.post_message,
            Method::Update => self.update,
            Method::ReactionsAdd => self.reactions_add,
            Method::ReactionsRemove => self.reactions_remove,
            Method::Upload => self.upload,
            Method::PostEphemeral => self.ephemeral,
            Method::ViewsOpen => self.views,
        }
    }
}

/// One token bucket: a method, and for `chat.postMessage` the channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// The method.
    pub method: Method,
    /// The channel, for per-channel limits only.
    pub channel: Option<String>,
    /// The chatter share of this method's bucket (see the module doc).
    pub chatter_share: bool,
}

impl Bucket {
    /// The bucket a call of `method` into `channel` draws from.
    pub fn of(method: Method, channel: &str) -> Bucket {
        let channel = (method == Method::PostMessage).then(|| channel.to_owned());
        Bucket {
            method,
            channel,
            chatter_share: false,
        }
    }

    fn share(&self) -> Bucket {
        Bucket {
            chatter_share: true,
            ..self.clone()
        }
    }
}

/// The gateway's buckets and the pauses `429`s imposed. Owned by the
/// gateway actor; limiters are handed (shared, lock-free) to the tasks that
/// send non-durable calls.
pub struct Pacer {
    policy: PacingPolicy,
    limiters: HashMap<Bucket, Arc<DefaultDirectRateLimiter>>,
    paused: HashMap<Bucket, Instant>,
}

impl Pacer {
    /// Buckets for `policy`, all full.
    pub fn new(policy: PacingPolicy) -> Pacer {
        Pacer {
            policy,
            limiters: HashMap::new(),
            paused: HashMap::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &PacingPolicy {
        &self.policy
    }

    /// The limiter of `bucket`; `None` when the method is unpaced.
    pub fn limiter(&mut self, bucket: &Bucket) -> Option<Arc<DefaultDirectRateLimiter>> {
        if let Some(l) = self.limiters.get(bucket) {
            return Some(l.clone());
        }
        let mut rate = self.policy.rate(bucket.method)?;
        if bucket.chatter_share {
            let pct = self.policy.chatter_share_pct.clamp(1, 100);
            rate = Rate {
                period: rate.period * 100 / pct,
                burst: 1,
            };
        }
        let limiter = Arc::new(rate.limiter()?);
        self.limiters.insert(bucket.clone(), limiter.clone());
        Some(limiter)
    }

    /// Until when `bucket` is paused by a `429`, if it is.
    pub fn paused_until(&mut self, bucket: &Bucket, now: Instant) -> Option<Instant> {
        match self.paused.get(bucket) {
            Some(until) if *until > now => Some(*until),
            Some(_) => {
                self.paused.remove(bucket);
                None
            }
            None => None,
        }
    }

    /// Takes one call from `bucket` now, or says when to try again.
    pub fn try_take(&mut self, bucket: &Bucket, now: Instant) -> Result<(), Instant> {
        if let Some(until) = self.paused_until(bucket, now) {
            return Err(until);
        }
        let Some(limiter) = self.limiter(bucket) else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| {
            let clock = DefaultClock::default();
            now + not_until.wait_time_from(clock.now())
        })
    }

    /// Like [`Pacer::try_take`] for chatter: it must also fit the chatter
    /// share of the bucket, which leaves the rest of the rate to decisions.
    pub fn try_take_chatter(&mut self, bucket: &Bucket, now: Instant) -> Result<(), Instant> {
        if self.policy.chatter_share_pct < 100 {
            self.try_take(&bucket.share(), now)?;
        }
        self.try_take(bucket, now)
    }

    /// Slack said `429`: nothing more from `bucket` until `until`.
    pub fn pause(&mut self, bucket: &Bucket, until: Instant) {
        let at = self.paused.entry(bucket.clone()).or_insert(until);
        *at = (*at).max(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_are_paced_per_channel_and_tiers_per_workspace() {
        assert_eq!(
            Bucket::of(Method::PostMessage, "C1"),
            Bucket {
                method: Method::PostMessage,
                channel: Some("C1".into()),
                chatter_share: false,
            }
        );
        assert_eq!(
            Bucket::of(Method::Update, "C1"),
            Bucket::of(Method::Update, "C2")
        );
    }

    #[test]
    fn a_bucket_allows_its_burst_then_says_when() {
        let mut pacer = Pacer::new(PacingPolicy::slack());
        let b = Bucket::of(Method::PostMessage, "C1");
        let now = Instant::now();
        assert!(pacer.try_take(&b, now).is_ok());
        assert!(pacer.try_take(&b, now).is_ok());
        let again = pacer.try_take(&b, now).expect_err("burst of 2 spent");
        assert!(again > now && again <= now + Duration::from_secs(1));
        // Another channel has its own budget.
        assert!(
            pacer
                .try_take(&Bucket::of(Method::PostMessage, "C2"), now)
                .is_ok()
        );
    }

    #[test]
    fn chatter_leaves_a_token_for_a_decision() {
        let policy = PacingPolicy {
            post_message: Some(Rate {
                period: Duration::from_secs(1),
                burst: 2,
            }),
            chatter_share_pct: 50,
            ..PacingPolicy::unpaced()
        };
        let mut pacer = Pacer::new(policy);
        let b = Bucket::of(Method::PostMessage, "C1");
        let now = Instant::now();
        assert!(pacer.try_take_chatter(&b, now).is_ok());
        // Chatter has used its share; the channel still has a token ...
        assert!(pacer.try_take_chatter(&b, now).is_err());
        // ... which a decision takes at once.
        assert!(pacer.try_take(&b, now).is_ok());
        assert!(pacer.try_take(&b, now).is_err());
    }

    #[test]
    fn a_pause_holds_the_bucket_and_only_that_bucket() {
        let mut pacer = Pacer::new(PacingPolicy::unpaced());
        let b = Bucket::of(Method::Update, "C1");
        let now = Instant::now();
        pacer.pause(&b, now + Duration::from_secs(3));
        assert_eq!(pacer.try_take(&b, now), Err(now + Duration::from_secs(3)));
        assert!(
            pacer
                .try_take(&Bucket::of(Method::PostMessage, "C1"), now)
                .is_ok()
        );
        assert!(pacer.try_take(&b, now + Duration::from_secs(4)).is_ok());
    }

    #[test]
    fn faster_divides_periods_and_settling() {
        let p = PacingPolicy::slack().faster(10);
        assert_eq!(
            p.post_message.map(|r| r.period),
            Some(Duration::from_millis(100))
        );
        assert_eq!(p.status_settle, Duration::from_millis(150));
        assert!(PacingPolicy::unpaced().rate(Method::Update).is_none());
    }
}
