//! Agent strings as a Slack message may show them, whatever the agent put
//! in them: a title stays on its line and cannot close the bold around it,
//! a path keeps its file name however long it is, a list of files says how
//! many it leaves out, and a code block cannot be closed from inside.
//!
//! Why this exists: mrkdwn has no escape for `*`, line breaks or backtick
//! fences, so a title `Write x*\n:white_check_mark: *Allow once* by @owner`
//! drew what read as an outcome line above live buttons, and a line of
//! three backticks in a diff ended its code block and let the rest of the
//! diff render as formatted text (a probe's fake "Allowed automatically by
//! rule" line).

use intercom_actors::text::{breaks_a_line, disguises};

use super::{escape, truncate};

/// A title or a name on one line: line breaks and other control characters
/// as spaces, disguising characters (bidi overrides, zero-width) as escapes,
/// `*` as `∗` (it would close the bold the title is shown in), cut to `max`
/// characters, then escaped for mrkdwn.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '*' => out.push('∗'),
            c if breaks_a_line(c) => out.push(' '),
            c if disguises(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    escape(&truncate(&out, max))
}

/// A value someone else chose (a button's value, a modal's metadata, an id
/// typed in a command) shown in an inline code span: on one line and cut as
/// [`one_line`], with backticks as `ˋ` so the span cannot be closed early.
pub fn code_span(text: &str, max: usize) -> String {
    format!("`{}`", one_line(&text.replace('`', "ˋ"), max))
}

/// A title for a field Slack shows as plain text (a snippet's title): on
/// one line and cut like [`one_line`], but not escaped for mrkdwn (Slack
/// would show `&amp;` as it is).
pub fn plain_line(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if breaks_a_line(c) { ' ' } else { c })
        .filter(|c| !disguises(*c))
        .collect();
    truncate(&line, max)
}

/// Lines joined under `budget` bytes; past it, the lines left out are
/// counted (`…and 12 more steps`) rather than cut off without a word.
pub fn lines_within(lines: &[String], budget: usize, what: &str) -> String {
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let more = format!("\n…and {} more {what}", lines.len() - i);
        if out.len() + 1 + l.len() + more.len() > budget {
            out.push_str(&more);
            return out;
        }
        if i > 0 {
            out.push('\n');
        }
        out.push_str(l);
    }
    out
}

/// A path cut in its middle, so its file name (where it ends) stays in
/// view: `src/src/…/deploy-prod.sh`. At most `max` characters.
pub fn path(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max || max < 8 {
        return one_line(text, max);
    }
    let tail = (max / 2).min(chars.len());
    let head = max.saturating_sub(tail + 1);
    let shown: String = chars[..head]
        .iter()
        .chain(['…'].iter())
        .chain(chars[chars.len() - tail..].iter())
        .collect();
    one_line(&shown, max + 1)
}

/// A request's `Files:` line: each path as code, cut in its middle so
/// that, escaped, it takes at most its share of `budget` bytes (escaping
/// can make a path five times longer: `&` is `&amp;`), at most `most` of
/// them, then how many more there are. A probe's nine paths of `&`s
/// pushed a tenth, `.git/hooks/pre-commit`, out of the block, with the
/// count of the rest.
pub fn files_line(paths: &[String], per_path: usize, most: usize, budget: usize) -> String {
    // "Files: ", the separators and " and 9999 more".
    let share = budget.saturating_sub(40) / most.max(1) - 4;
    let items: Vec<String> = paths
        .iter()
        .take(most)
        .map(|p| format!("`{}`", path_within(&p.replace('`', "ˋ"), per_path, share)))
        .collect();
    let mut line = format!("Files: {}", items.join(", "));
    if paths.len() > items.len() {
        line.push_str(&format!(" and {} more", paths.len() - items.len()));
    }
    line
}

/// [`path`] at most `max` characters and, escaped, at most `bytes` bytes.
fn path_within(text: &str, max: usize, bytes: usize) -> String {
    let mut chars = max;
    loop {
        let shown = path(text, chars);
        if shown.len() <= bytes || chars <= 8 {
            return shown;
        }
        chars = (chars * 3 / 4).max(8);
    }
}

/// Escaped text as a block quote: every line starts with `> `, which the
/// escaped text itself cannot write (its own `>` is `&gt;`).
pub fn quoted(escaped: &str) -> String {
    escaped
        .trim_end_matches('\n')
        .split('\n')
        .map(|l| format!("> {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with its disguising characters (bidi overrides, zero-width
/// spaces) written as escapes: agent text reached the thread with a U+202E
/// that turned `exe.gnp` into what reads as `png.exe`. Joiners stay (they
/// are part of emoji and of Persian).
pub fn undisguised(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(disguises) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if disguises(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` in a code block that it cannot close: runs of three or more
/// backticks inside are written as `⟨3 backticks⟩`, then escaped.
pub fn code_block(text: &str) -> String {
    format!("```{}```", escape(&unfenced(text)))
}

/// Runs of three or more backticks written as their count.
fn unfenced(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '`' {
            out.push(c);
            continue;
        }
        let mut run = 1;
        while chars.next_if_eq(&'`').is_some() {
            run += 1;
        }
        if run >= 3 {
            out.push_str(&format!("⟨{run} backticks⟩"));
        } else {
            out.extend(std::iter::repeat_n('`', run));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_stays_on_its_line_and_cannot_close_its_bold() {
        let t = one_line(
            "Write notes.txt*\n:white_check_mark: *Allow once* by @owner\u{202e}",
            300,
        );
        assert!(!t.contains('\n') && !t.contains('*'), "{t}");
        assert!(t.contains("\\u{202e}"), "{t}");
        assert_eq!(one_line("a <b> & c", 300), "a &lt;b&gt; &amp; c");
    }

    #[test]
    fn a_long_path_keeps_its_file_name() {
        let long = format!("{}deploy-prod.sh", "src/".repeat(60));
        let shown = path(&long, 200);
        assert!(shown.ends_with("deploy-prod.sh"), "{shown}");
        assert!(
            shown.contains('…') && shown.chars().count() <= 200,
            "{shown}"
        );
        assert_eq!(path("src/main.rs", 200), "src/main.rs");
    }

    #[test]
    fn escaped_paths_leave_room_for_every_file_and_the_count_of_the_rest() {
        let mut paths: Vec<String> = (0..9).map(|i| format!("{}{i}", "&".repeat(190))).collect();
        paths.push(".git/hooks/pre-commit".into());
        paths.push("last".into());
        let line = files_line(&paths, 200, 10, 2900);
        assert!(line.len() <= 2900, "{}", line.len());
        assert!(line.contains("`.git/hooks/pre-commit`"), "{line}");
        assert!(line.ends_with(" and 1 more"), "{line}");
        assert!(line.contains("&amp;8`"), "each path keeps its end: {line}");
    }

    #[test]
    fn a_long_list_says_how_many_lines_it_leaves_out() {
        let lines: Vec<String> = (0..40)
            .map(|i| format!("step {i} {}", "x".repeat(150)))
            .collect();
        let text = lines_within(&lines, 2900, "steps");
        assert!(text.len() <= 2900, "{}", text.len());
        let shown = text.lines().filter(|l| l.starts_with("step")).count();
        assert!(
            text.ends_with(&format!("…and {} more steps", 40 - shown)),
            "{text}"
        );
        assert_eq!(lines_within(&lines[..2], 2900, "steps").lines().count(), 2);
    }

    #[test]
    fn every_line_of_agent_text_is_quoted() {
        let q = quoted("hi\n&gt; not a quote of ours\n\n:information_source: Rule r-1 created");
        assert!(q.lines().all(|l| l.starts_with("> ")), "{q}");
        assert_eq!(q.lines().count(), 4, "{q}");
    }

    /// A forged button value is quoted back to whoever sent it: a backtick
    /// in it cannot end the code span and format the rest.
    #[test]
    fn a_code_span_cannot_be_closed_from_inside() {
        let shown = code_span("s-1:x` <!channel> *bold*\nline", 80);
        assert_eq!(shown.matches('`').count(), 2, "{shown}");
        assert!(shown.starts_with('`') && shown.ends_with('`'), "{shown}");
        assert!(!shown.contains('<') && !shown.contains('\n'), "{shown}");
    }

    #[test]
    fn a_snippet_title_is_one_plain_line() {
        assert_eq!(plain_line("a & b\nc\u{202e}", 100), "a & b c");
    }

    #[test]
    fn a_fence_inside_cannot_close_the_code_block() {
        let block = code_block("+ok\n```\n*Allowed automatically by rule*\n```\n+x `y` ``z``");
        assert_eq!(block.matches("```").count(), 2, "{block}");
        assert!(
            block.contains("⟨3 backticks⟩") && block.contains("``z``"),
            "{block}"
        );
    }
}
