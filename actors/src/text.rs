//! Which characters can make text read other than it is.
//!
//! Agent text reaches the operator's terminal (`ctl`), the server's log
//! and approval buttons. Each escapes or drops control characters, and the
//! invisible formatting below, before it shows agent text: one definition,
//! so that a character one of them knows to be dangerous is known to all.

use std::borrow::Cow;

pub mod command;

/// Invisible formatting that can make text read other than it is: bidi
/// marks, embeddings, overrides and isolates (`U+202A`–`U+202E`,
/// `U+2066`–`U+2069`), zero-width and soft-hyphen characters, the line and
/// paragraph separators, the invisible operators and deprecated format
/// characters (`U+2060`–`U+206F`, with the unassigned `U+2065`), the
/// byte-order mark, interlinear annotations and tag characters (hidden
/// ASCII). The zero-width (non-)joiners are not in
/// it: emoji and several scripts need them. Control characters are not in
/// it either (`char::is_control`), since callers treat them apart.
pub fn disguises(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

/// `text` cut to at most `max` bytes on a character boundary, saying how
/// long it was: for agent text the operator is shown (a path, a title) whose
/// length the agent decides.
pub fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..cut], text.len())
}

/// `text` with every control character (newlines too: a log line is one
/// line) and every disguising character written as an escape (`\u{1b}`), so what an
/// agent sent cannot move the cursor, end the line or reorder it.
pub fn log_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Agent text for one line of a log or a notice: cut to `max` bytes
/// ([`shorten`]), then escaped ([`log_safe`]).
pub fn one_line(text: &str, max: usize) -> String {
    log_safe(&shorten(text, max)).into_owned()
}

/// Characters that change how a terminal or a log viewer shows a line.
fn needs_escape(c: char) -> bool {
    c.is_control() || disguises(c)
}

/// A control character, or a Unicode line or paragraph separator: anything
/// some viewer breaks a line at or acts on, which a file name must not
/// carry into a diff header (a probe's `x\u{2028}+++ b/evil.sh`).
pub fn breaks_a_line(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorten_cuts_on_a_character_boundary_and_says_the_length() {
        assert_eq!(shorten("short", 10), "short");
        assert_eq!(shorten("abcdef", 3), "abc… (6 bytes in all)");
        assert_eq!(shorten("ééé", 3), "é… (6 bytes in all)");
    }

    #[test]
    fn bidi_zero_width_and_tags_disguise_joiners_and_letters_do_not() {
        for c in [
            '\u{202e}',
            '\u{2066}',
            '\u{200b}',
            '\u{feff}',
            '\u{e0041}',
            '\u{ad}',
        ] {
            assert!(disguises(c), "{c:?}");
        }
        for c in ['a', 'é', '\u{200d}', '\u{200c}', '\n', '\u{1b}'] {
            assert!(!disguises(c), "{c:?}");
        }
    }

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        let hostile = "ok\x1b[2J\rINFO operator approved\x07\u{202e}gnp.exe\u{9b}";
        let safe = log_safe(hostile);
        assert!(!safe.chars().any(needs_escape), "{safe:?}");
        assert!(safe.contains("\\u{1b}[2J"), "{safe}");
        assert!(safe.contains("\\u{d}INFO operator approved"), "{safe}");
        assert!(safe.contains("\\u{202e}gnp.exe"), "{safe}");
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        assert!(matches!(
            log_safe("plain text, ünïcode ✓"),
            Cow::Borrowed(_)
        ));
    }
}
