//! Ephemeral answers, each user in turn.
//!
//! Why this exists: `chat.postEphemeral` is limited per workspace (Tier 4,
//! about 100 a minute), and every user's answers draw from that one bucket.
//! Sent as they came, one user who fires a hundred `/intercom status` in a
//! row put a minute of answers in front of everyone else's. Here the
//! answers wait in one queue per user and go out in turn: after one answer
//! to a user, every other waiting user's next answer goes before that
//! user's next. A user has one answer on its way at a time, so theirs
//! arrive in the order they were given; at most [`IN_FLIGHT`] calls run at
//! once, each still drawing from the method's bucket.
//!
//! A user's queue keeps the newest [`PER_USER`] answers: when a flood goes
//! past that, its oldest waiting answer is dropped, and logged. An
//! ephemeral answer is not durable anyway (Slack shows it to one user,
//! once, and it is worthless when stale), and nothing the operator decides
//! travels this way: buttons, outcomes and thread posts go through the
//! durable lanes.
//!
//! The queues are the state of one task, fed by a channel: the gateway
//! actor hands answers over and never waits for them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use governor::DefaultDirectRateLimiter;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::immediate::{Gate, immediate};
use crate::slack_port::{MessageBody, SlackApi};

/// Calls at once: enough that one slow answer does not hold the others,
/// few enough that the turn order decides who goes next.
const IN_FLIGHT: usize = 2;

/// Answers one user may have waiting; older ones of a flood are dropped.
pub(super) const PER_USER: usize = 20;

/// One ephemeral answer.
#[derive(Debug)]
pub(super) struct Ephemeral {
    pub channel: String,
    pub user: String,
    pub thread_ts: Option<String>,
    /// A slash command's `response_url`: tried first.
    pub response_url: Option<String>,
    pub body: MessageBody,
}

/// The waiting answers, one queue per user, and whose turn is next.
#[derive(Default)]
struct Turns {
    /// Users with an answer waiting and none on its way, next first (each
    /// at most once).
    order: VecDeque<String>,
    waiting: HashMap<String, VecDeque<Ephemeral>>,
    /// Users with an answer on its way: their next waits for it.
    sending: HashSet<String>,
}

impl Turns {
    /// Queues `answer` behind its user's; answers the oldest one dropped
    /// when that user already had [`PER_USER`] waiting.
    fn push(&mut self, answer: Ephemeral) -> Option<Ephemeral> {
        let queue = self.waiting.entry(answer.user.clone()).or_default();
        if queue.is_empty() && !self.sending.contains(&answer.user) {
            self.order.push_back(answer.user.clone());
        }
        queue.push_back(answer);
        (queue.len() > PER_USER)
            .then(|| queue.pop_front())
            .flatten()
    }

    /// The next answer to send: the oldest of the user whose turn it is.
    /// That user is out of the line until [`Turns::sent`].
    fn next(&mut self) -> Option<Ephemeral> {
        let user = self.order.pop_front()?;
        let queue = self.waiting.get_mut(&user)?;
        let answer = queue.pop_front();
        if queue.is_empty() {
            self.waiting.remove(&user);
        }
        self.sending.insert(user);
        answer
    }

    /// `user`'s answer on its way is done with: they go to the back of the
    /// line if more of theirs wait.
    fn sent(&mut self, user: &str) {
        self.sending.remove(user);
        if self.waiting.contains_key(user) {
            self.order.push_back(user.to_owned());
        }
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// Where the gateway hands ephemeral answers over.
pub(super) struct EphemeralLane {
    tx: mpsc::UnboundedSender<Ephemeral>,
}

impl EphemeralLane {
    /// Starts the task that sends the answers through `api`, each drawing
    /// from `limiter` (`None`: unpaced). It ends once the lane is dropped
    /// and what waited was sent.
    pub(super) fn start(
        api: Arc<dyn SlackApi>,
        limiter: Option<Arc<DefaultDirectRateLimiter>>,
    ) -> EphemeralLane {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, api, limiter));
        EphemeralLane { tx }
    }

    /// Queues `answer` for its user's turn.
    pub(super) fn send(&self, answer: Ephemeral) {
        if let Err(e) = self.tx.send(answer) {
            let user = crate::text::log_safe(&e.0.user);
            tracing::warn!(%user, "ephemeral message not delivered: the sender has stopped");
        }
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Ephemeral>,
    api: Arc<dyn SlackApi>,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
) {
    let mut turns = Turns::default();
    let mut sending = JoinSet::new();
    let mut open = true;
    loop {
        while sending.len() < IN_FLIGHT {
            let Some(answer) = turns.next() else { break };
            sending.spawn(deliver(api.clone(), limiter.clone(), answer));
        }
        if !open && sending.is_empty() && turns.is_empty() {
            return;
        }
        tokio::select! {
            received = rx.recv(), if open => match received {
                Some(answer) => {
                    if let Some(old) = turns.push(answer) {
                        let user = crate::text::log_safe(&old.user);
                        tracing::warn!(%user, "ephemeral answer dropped: more than {PER_USER} waited for this user");
                    }
                }
                None => open = false,
            },
            Some(done) = sending.join_next(), if !sending.is_empty() => match done {
                Ok(user) => turns.sent(&user),
                // A send that panicked: its user's next goes on (the panic
                // is tokio's to report).
                Err(e) => tracing::error!("an ephemeral send failed: {e}"),
            },
            else => return,
        }
    }
}

/// Sends one answer: waits for a token, retries a few times. Answers whose
/// it was.
async fn deliver(
    api: Arc<dyn SlackApi>,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    answer: Ephemeral,
) -> String {
    let gate = Gate {
        pause: None,
        limiter,
    };
    let Ephemeral {
        channel,
        user,
        thread_ts,
        response_url,
        body,
    } = answer;
    // A command's answer goes back through its response_url, which reaches
    // the user wherever they typed it (a DM, a channel without the bot,
    // where `chat.postEphemeral` is refused); the ephemeral post is the
    // fallback (the URL expired, or is not Slack's).
    if let Some(url) = &response_url {
        match api.respond(url, &body).await {
            Ok(()) => return user,
            Err(e) => tracing::debug!("command answer not sent through its response_url: {e}"),
        }
    }
    let sent = immediate(gate, || {
        api.post_ephemeral(&channel, &user, thread_ts.as_deref(), &body)
    })
    .await;
    if let Err(e) = sent {
        let user = crate::text::log_safe(&user);
        tracing::warn!(%channel, %user, "ephemeral message not delivered: {e}");
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(user: &str, text: &str) -> Ephemeral {
        Ephemeral {
            channel: "C1".into(),
            user: user.into(),
            response_url: None,
            thread_ts: None,
            body: MessageBody::text(text),
        }
    }

    /// Sends one at a time, each done before the next.
    fn drain(turns: &mut Turns) -> Vec<String> {
        std::iter::from_fn(|| {
            let a = turns.next()?;
            turns.sent(&a.user);
            Some(format!("{}:{}", a.user, a.body.text))
        })
        .collect()
    }

    #[test]
    fn users_take_turns_and_each_keeps_their_order() {
        let mut turns = Turns::default();
        for i in 0..4 {
            assert!(turns.push(answer("U_FLOOD", &i.to_string())).is_none());
        }
        turns.push(answer("U_OTHER", "a"));
        turns.push(answer("U_THIRD", "x"));
        turns.push(answer("U_OTHER", "b"));
        assert_eq!(
            drain(&mut turns),
            [
                "U_FLOOD:0",
                "U_OTHER:a",
                "U_THIRD:x",
                "U_FLOOD:1",
                "U_OTHER:b",
                "U_FLOOD:2",
                "U_FLOOD:3"
            ]
        );
        assert!(turns.is_empty());
    }

    #[test]
    fn a_flood_keeps_its_newest_answers_and_others_are_untouched() {
        let mut turns = Turns::default();
        turns.push(answer("U_OTHER", "mine"));
        let mut dropped = Vec::new();
        for i in 0..PER_USER + 5 {
            if let Some(old) = turns.push(answer("U_FLOOD", &i.to_string())) {
                dropped.push(old.body.text);
            }
        }
        assert_eq!(dropped, ["0", "1", "2", "3", "4"]);
        let sent = drain(&mut turns);
        assert_eq!(sent.len(), PER_USER + 1);
        assert_eq!(sent[0], "U_OTHER:mine");
        assert_eq!(sent[1], "U_FLOOD:5");
        assert_eq!(sent[PER_USER], format!("U_FLOOD:{}", PER_USER + 4));
    }

    #[test]
    fn a_user_has_one_answer_on_its_way_at_a_time() {
        let mut turns = Turns::default();
        turns.push(answer("U_A", "1"));
        turns.push(answer("U_A", "2"));
        let first = turns.next().expect("one");
        assert_eq!(first.body.text, "1");
        // The second waits for the first, even with room to send.
        assert!(turns.next().is_none());
        assert!(!turns.is_empty());
        turns.push(answer("U_B", "1"));
        assert_eq!(turns.next().map(|a| a.user), Some("U_B".into()));
        turns.sent("U_A");
        assert_eq!(turns.next().map(|a| a.body.text), Some("2".into()));
    }

    #[test]
    fn a_user_who_comes_back_joins_the_end_of_the_line() {
        let mut turns = Turns::default();
        turns.push(answer("U_A", "1"));
        turns.push(answer("U_B", "1"));
        assert_eq!(drain(&mut turns), ["U_A:1", "U_B:1"]);
        turns.push(answer("U_B", "2"));
        turns.push(answer("U_A", "2"));
        assert_eq!(drain(&mut turns), ["U_B:2", "U_A:2"]);
    }
}
