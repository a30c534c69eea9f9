//! Start admission: at most `limits.max_concurrent_starts` sessions spawn
//! and handshake at once; later starts wait their turn, in order.
//!
//! Why this exists: starting an agent is the most CPU-hungry thing the
//! server asks of the machine (a process to exec, a runtime to boot, for
//! Node-based agents about a CPU-second each, then the handshake). Five
//! hundred starts at once took the cores the running sessions' decisions
//! needed (issue 13: a start burst must not raise the decision p99 by more
//! than 2x). Admitted starts run exactly as before; a waiting start has no
//! process and no row yet, and is answered when its own start finished.
//! The supervisor owns this state and changes it only in its handler.

use std::collections::VecDeque;

use ractor::RpcReplyPort;

use super::{StartRequest, SupervisorError};
use crate::model::SessionRecord;

/// Where a started session's answer goes.
pub(super) type StartReply = RpcReplyPort<Result<SessionRecord, SupervisorError>>;

/// A start waiting to be admitted.
pub(super) struct WaitingStart {
    pub(super) req: StartRequest,
    pub(super) reply: StartReply,
}

/// Starts in flight and the queue behind them.
#[derive(Default)]
pub(super) struct Admission {
    starting: usize,
    waiting: VecDeque<WaitingStart>,
}

impl Admission {
    /// Takes a start: `Some` when it may run now (it then counts as in
    /// flight until [`Admission::finished`]), `None` when it was queued.
    pub(super) fn admit(&mut self, start: WaitingStart, limit: usize) -> Option<WaitingStart> {
        if self.starting < limit.max(1) && self.waiting.is_empty() {
            self.starting += 1;
            return Some(start);
        }
        self.waiting.push_back(start);
        None
    }

    /// A start in flight finished (ready or failed): the next waiting one,
    /// if any, may run now (and counts as in flight).
    pub(super) fn finished(&mut self, limit: usize) -> Option<WaitingStart> {
        self.starting = self.starting.saturating_sub(1);
        if self.starting < limit.max(1) {
            let next = self.waiting.pop_front()?;
            self.starting += 1;
            return Some(next);
        }
        None
    }

    /// Starts waiting to be admitted (they count against `max_sessions`).
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Every waiting start, taken out (to be refused at shutdown).
    pub(super) fn drain(&mut self) -> Vec<WaitingStart> {
        self.waiting.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::settings::AgentProfile;

    fn start(
        prompt: &str,
    ) -> (
        WaitingStart,
        ractor::concurrency::OneshotReceiver<Result<SessionRecord, SupervisorError>>,
    ) {
        let (tx, rx) = ractor::concurrency::oneshot();
        let req = StartRequest {
            workspace: "ws".into(),
            cwd: PathBuf::from("/tmp"),
            channel_id: None,
            profile: AgentProfile {
                id: "a".into(),
                command: "true".into(),
                args: vec![],
                env: vec![],
                protocol: crate::model::Protocol::Acp,
                framing: crate::model::Framing::Ndjson,
                auth_method: None,
            },
            prompt: prompt.into(),
            owner: "U1".into(),
            mode: None,
        };
        (
            WaitingStart {
                req,
                reply: tx.into(),
            },
            rx,
        )
    }

    #[test]
    fn starts_past_the_limit_wait_and_run_in_order() {
        let mut a = Admission::default();
        let (s1, _r1) = start("one");
        let (s2, _r2) = start("two");
        let (s3, _r3) = start("three");
        assert!(a.admit(s1, 2).is_some());
        assert!(a.admit(s2, 2).is_some());
        assert!(a.admit(s3, 2).is_none(), "a third waits");
        assert_eq!(a.waiting(), 1);
        let next = a.finished(2).expect("the waiting start runs");
        assert_eq!(next.req.prompt, "three");
        assert!(a.finished(2).is_none());
        assert!(a.finished(2).is_none());
        // Nothing in flight: the next start runs at once.
        let (s4, _r4) = start("four");
        assert!(a.admit(s4, 2).is_some());
    }

    #[test]
    fn a_new_start_does_not_overtake_a_waiting_one() {
        let mut a = Admission::default();
        let (s1, _r1) = start("one");
        let (s2, _r2) = start("two");
        assert!(a.admit(s1, 1).is_some());
        assert!(a.admit(s2, 1).is_none());
        // The limit was raised meanwhile (a config reload): still in order.
        let (s3, _r3) = start("three");
        assert!(a.admit(s3, 5).is_none());
        assert_eq!(a.finished(5).expect("next").req.prompt, "two");
        assert_eq!(a.drain().len(), 1);
    }
}
