//! How much an agent may make the server write between two prompts.
//!
//! Text has its own cap (`limits.max_turn_text_bytes`) and tool-call diffs
//! theirs (`updates::TOOL_BYTES_PER_TURN`); this bounds everything else an
//! agent makes the session write and show: tool-call lines, status lines
//! and broadcasts, thoughts, plans, usage, notices about its own mode
//! switches. Each one is a transcript write and an event the journal
//! keeps. A probe's agent wrote 45,000 tool calls in 15 s (28 MB a second
//! into the database) and, with tiny ones, pushed every other session's
//! events out of the journal in 35 s; the stall detector never fired, since
//! the agent was busy. Past the budget the session keeps and shows none of
//! these until the next prompt (or instruction), and says so once. What
//! needs the operator (requests) is never held back by it. The stall
//! policy's nudges are counted here too, for the same reason: an agent
//! must not reset what bounds it by writing a line or being restarted.

use super::SessionState;
use crate::ports::NoticeLevel;

/// Writes the agent may cause between two prompts.
pub(super) const WRITES_PER_TURN: usize = 20_000;

/// Bytes those writes may carry between two prompts (eight transcript
/// pages).
pub(super) const BYTES_PER_TURN: usize = 8 * crate::transcript::MAX_PAGE_BYTES;

/// Requests the agent may leave undecided between two prompts (or
/// operator decisions): each is stored with its diff (64 KiB of it once
/// closed undecided), and a probe's client opened and dropped 1,000
/// clearances of 900 KB a minute, each closed at once, so the pending cap
/// never applied. A decided request (by a rule or a mode too) is given
/// back. Counted apart from the chatter: an agent that flooded its
/// transcript still reaches the operator with its next request.
pub(super) const REQUESTS_PER_TURN: usize = 1_000;

/// Requests the agent may withdraw (`$/cancel_request`) between two
/// prompts. Each withdrawal frees a place among the waiting requests, so
/// without a bound an agent opening and withdrawing in a loop put a
/// probe's 1,000 requests before the operator instead of the 32 that may
/// wait at once. Past it, a withdrawal is ignored: the request waits.
pub(super) const WITHDRAWALS_PER_TURN: usize = 32;

/// What the agent made the session write since the last prompt.
///
/// It outlives the agent's process: a restart the server made (after a
/// crash, or when the agent ignored a cancel) carries it to the next one
/// ([`super::SessionExit::Crashed`], [`super::StartMode::Restart`]). A
/// probe's agent flooded, hung, was restarted by the stall policy with a
/// fresh budget and flooded again: 570 MB into the database in 150 s with
/// nobody acting. Only an operator's prompt, instruction or decision
/// renews it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TurnBudget {
    writes: usize,
    bytes: usize,
    spent: bool,
    requests: usize,
    withdrawals: usize,
    /// Nudges the stall policy sent. Agent activity clears a stall alert
    /// but not these: a probe's agent wrote a line after each nudge (or
    /// its restart) and hung again, and was nudged and restarted for ever,
    /// never marked stalled.
    nudges: u32,
}

/// What [`TurnBudget::spend`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spend {
    /// Within the budget: write it.
    Kept,
    /// This write passed the budget: drop it, and say so.
    JustSpent,
    /// The budget was already spent: drop it.
    Spent,
}

impl TurnBudget {
    /// Counts one write of `bytes`.
    pub(super) fn spend(&mut self, bytes: usize) -> Spend {
        if self.spent {
            return Spend::Spent;
        }
        if self.writes >= WRITES_PER_TURN || self.bytes.saturating_add(bytes) > BYTES_PER_TURN {
            self.spent = true;
            return Spend::JustSpent;
        }
        self.writes += 1;
        self.bytes += bytes;
        Spend::Kept
    }

    /// Counts one request opened; false past [`REQUESTS_PER_TURN`].
    pub(super) fn take_request(&mut self) -> bool {
        if self.requests >= REQUESTS_PER_TURN {
            return false;
        }
        self.requests += 1;
        true
    }

    /// Nudges the stall policy sent since the last prompt.
    pub(super) fn nudges(&self) -> u32 {
        self.nudges
    }

    /// Counts one nudge of the stall policy.
    pub(super) fn count_nudge(&mut self) {
        self.nudges = self.nudges.saturating_add(1);
    }

    /// Counts one withdrawal; false past [`WITHDRAWALS_PER_TURN`].
    pub(super) fn take_withdrawal(&mut self) -> bool {
        if self.withdrawals >= WITHDRAWALS_PER_TURN {
            return false;
        }
        self.withdrawals += 1;
        true
    }

    /// Gives back one request counted by [`Self::take_request`] (it was
    /// decided).
    pub(super) fn refund_request(&mut self) {
        self.requests = self.requests.saturating_sub(1);
    }

    /// A new prompt: a new budget.
    pub(super) fn renew(&mut self) {
        *self = TurnBudget::default();
    }
}

impl SessionState {
    /// Whether a write of `bytes` the agent caused is kept and shown; the
    /// first one past the turn's budget leaves a notice.
    pub(super) async fn agent_may_write(&mut self, bytes: usize) -> bool {
        match self.budget.spend(bytes) {
            Spend::Kept => true,
            Spend::Spent => false,
            Spend::JustSpent => {
                tracing::warn!(
                    session = %self.record.id,
                    "the agent passed its transcript budget for this turn; its further entries are dropped until the next prompt"
                );
                let text = format!(
                    "The agent wrote more than {WRITES_PER_TURN} entries or {} MiB to the transcript since the last prompt. Its further tool calls, status lines, thoughts, plans and notes are neither kept nor shown until the next prompt; its requests still reach you.",
                    BYTES_PER_TURN >> 20
                );
                self.emit_notice(NoticeLevel::Warning, &text).await;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_writes_and_bytes_and_renews_with_a_prompt() {
        let mut b = TurnBudget::default();
        for _ in 0..WRITES_PER_TURN {
            assert_eq!(b.spend(1), Spend::Kept);
        }
        assert_eq!(b.spend(1), Spend::JustSpent);
        assert_eq!(b.spend(1), Spend::Spent);
        b.renew();
        assert_eq!(b.spend(BYTES_PER_TURN), Spend::Kept);
        assert_eq!(b.spend(1), Spend::JustSpent);
        b.renew();
        // One write bigger than the whole budget is refused at once.
        assert_eq!(b.spend(usize::MAX), Spend::JustSpent);
        // Requests are counted apart: a spent budget still takes them.
        assert!(b.take_request());
        for _ in 1..REQUESTS_PER_TURN {
            assert!(b.take_request());
        }
        assert!(!b.take_request());
        // A decided one is given back.
        b.refund_request();
        assert!(b.take_request());
        assert!(!b.take_request());
        b.renew();
        assert!(b.take_request());
    }

    #[test]
    fn withdrawals_are_bounded_until_the_next_prompt() {
        let mut b = TurnBudget::default();
        for _ in 0..WITHDRAWALS_PER_TURN {
            assert!(b.take_withdrawal());
        }
        assert!(!b.take_withdrawal());
        b.renew();
        assert!(b.take_withdrawal());
    }
}
