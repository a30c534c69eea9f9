//! Which session a `/intercom` command names: the words taken as a
//! session id, and the pick of the session itself.
//!
//! A word where an id goes is that id, right or wrong: a probe's `stop
//! b2b1…` (the `s-` forgotten) stopped the channel's latest session, and
//! `mode auto s-nonexist` put it in mode `auto`. Only a command given no id
//! acts on the channel's most recently active session.

use intercom_actors::model::SessionRecord;

use super::first_word;
use crate::slack::render;

/// True for a word that names a session (`s-` followed by hex digits).
pub fn looks_like_id(word: &str) -> bool {
    word.len() > 2 && word.starts_with("s-") && word[2..].chars().all(|c| c.is_ascii_hexdigit())
}

/// The session a command that takes only an id names: whatever was given
/// where the id goes, or `None` when nothing was. A word that is no live
/// session's id gets "no session", never another session: a probe's
/// `stop b2b1…` (the `s-` forgotten) stopped the channel's latest session,
/// and `mode auto s-nonexist` put it in mode `auto`. Ids are lowercase hex,
/// so `S-AB12` and a bare `ab12` name `s-ab12`.
pub(super) fn named_id(rest: &str) -> Option<String> {
    let given = rest.trim();
    if given.is_empty() {
        return None;
    }
    let lower = given.to_ascii_lowercase();
    if !lower.starts_with("s-") && lower.len() >= 4 && lower.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Some(format!("s-{lower}"));
    }
    Some(lower)
}

/// Splits off an optional leading session id: a word starting `s-` (any
/// case; a malformed one is still meant as an id, and refused as none), or
/// one of at least 8 hex digits (the `s-` forgotten). A probe's `steer
/// S-<id> hello` went to the channel's latest session.
pub(super) fn optional_id(rest: &str) -> (Option<String>, &str) {
    let (w, tail) = first_word(rest);
    let lower = w.to_ascii_lowercase();
    if lower.starts_with("s-") {
        (Some(lower), tail)
    } else if lower.len() >= 8 && lower.chars().all(|c| c.is_ascii_hexdigit()) {
        (Some(format!("s-{lower}")), tail)
    } else {
        (None, rest.trim())
    }
}

/// Picks the session a command acts on: the explicit id (a unique prefix
/// works too), else the most recently active live session in `channel`.
/// Returns the session and a hint naming the other candidates.
pub fn pick_session(
    live: &[SessionRecord],
    channel: &str,
    explicit: Option<&str>,
) -> Result<(SessionRecord, Option<String>), String> {
    if let Some(id) = explicit {
        // A prefix names one session only when it says enough: `s-` alone
        // stopped the channel's only session.
        if id.len() < "s-".len() + 2 {
            return Err(format!(
                "`{}` is too short to name a session; nothing was done. Give at least 2 characters after `s-` (`/intercom sessions` lists them).",
                render::escape(&render::truncate(id, 80))
            ));
        }
        let found: Vec<&SessionRecord> = live.iter().filter(|s| s.id.0.starts_with(id)).collect();
        return match found.as_slice() {
            [one] => Ok(((*one).clone(), None)),
            [] => Err(format!(
                "No live session `{}`; nothing was done. List them with `/intercom sessions`.",
                render::escape(&render::truncate(id, 80))
            )),
            _ => Err(format!(
                "`{}` matches {} sessions; give more of the id.",
                render::escape(&render::truncate(id, 80)),
                found.len()
            )),
        };
    }
    let mut here: Vec<&SessionRecord> = live
        .iter()
        .filter(|s| s.channel_id.as_deref() == Some(channel))
        .collect();
    here.sort_by_key(|s| std::cmp::Reverse(s.last_activity_at));
    let Some(first) = here.first() else {
        return Err(
            "No live session in this channel. Start one with `/intercom start <prompt>`, or name one: `/intercom sessions` lists them."
                .into(),
        );
    };
    let hint = (here.len() > 1).then(|| {
        let others: Vec<String> = here[1..]
            .iter()
            .take(5)
            .map(|s| format!("`{}` ({})", s.id, render::escape(&render::truncate(&s.title, 40))))
            .collect();
        format!(
            "Acted on `{}`, the most recently active session here. Others: {}. Name one to pick it, e.g. `/intercom status {}`.",
            first.id,
            others.join(", "),
            here[1].id
        )
    });
    Ok(((*first).clone(), hint))
}
