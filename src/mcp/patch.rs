//! Applying an approved change: unified diffs, whole files, atomic writes.
//!
//! `check_clearance` carries either a unified diff or the complete new
//! content of `file_path`; `check_diff` applies it once approved. This module
//! tells the two apart ([`Change::parse`]), applies hunks strictly (every
//! context and removed line must match; a hunk may only move by an offset, as
//! `patch` does, never with fuzz), hashes file content for the
//! changed-since-approval check; the files are read and written through the
//! workspace handle (`intercom_actors::workspace_fs`: beneath the workspace,
//! temporary file plus rename, never a server file).
//!
//! A small applier instead of a crate: the rules we need (strict context,
//! error messages that name the hunk, CRLF files keep their line endings,
//! `\ No newline at end of file`, several files in one diff) are short to
//! state and easy to test here, and it keeps the dependency tree small.

/// Why a change could not be parsed or applied. Messages name the hunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// A `@@ ... @@` line that does not parse.
    #[error("hunk {hunk}: malformed header {header:?} (expected `@@ -a,b +c,d @@`)")]
    BadHeader {
        /// 1-based hunk number.
        hunk: usize,
        /// The line.
        header: String,
    },
    /// The hunk body has fewer or more lines than its header says.
    #[error("hunk {hunk} ({header}): {problem}")]
    BadBody {
        /// 1-based hunk number.
        hunk: usize,
        /// Its header.
        header: String,
        /// What is wrong.
        problem: String,
    },
    /// A `---` line without its `+++` line.
    #[error("file header {0:?} is not followed by a `+++` line")]
    BadFileHeader(String),
    /// The hunk's context or removed lines are not in the file.
    #[error(
        "hunk {hunk} ({header}) does not apply: expected line {line} to be {expected:?}, found {found:?}"
    )]
    Mismatch {
        /// 1-based hunk number.
        hunk: usize,
        /// Its header.
        header: String,
        /// 1-based line in the original file where it was expected.
        line: usize,
        /// The line the hunk expects.
        expected: String,
        /// What the file has there (`<end of file>` past the end).
        found: String,
    },
    /// The hunks overlap or are out of order.
    #[error("hunk {hunk} ({header}) overlaps the previous hunk or is out of order")]
    Overlap {
        /// 1-based hunk number.
        hunk: usize,
        /// Its header.
        header: String,
    },
    /// Finding where the hunks match took more than the search may (a
    /// hunk far from its stated line in a big file).
    #[error(
        "hunk {hunk} ({header}) does not match near its stated line within the search bound; give line numbers that match the file"
    )]
    SearchBound {
        /// 1-based hunk number.
        hunk: usize,
        /// Its header.
        header: String,
    },
    /// The diff deletes a file (not supported).
    #[error("the diff deletes {0}; deleting files is not supported, only writing them")]
    Deletion(String),
    /// The diff has no hunks.
    #[error("the diff contains no hunks")]
    Empty,
    /// A header a diff viewer shows (a rename, a mode change, a deletion)
    /// that applying the diff would not do: what the operator approved
    /// must be what is written.
    #[error(
        "the diff says {0:?}, which is not applied (only file contents are written, never renames, copies, deletions or modes): send the change without it"
    )]
    Unapplied(String),
    /// A file name in git's quoted form with escapes (`"caf\303\251.txt"`):
    /// shown as written, it would not name the file written.
    #[error(
        "the diff names {0} in quotes with escapes, which is not read: name the file as it is, without quotes"
    )]
    QuotedName(String),
}

/// One line of a hunk body, with its line terminator (unless the diff said
/// `\ No newline at end of file`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum HunkLine {
    Context(String),
    Remove(String),
    Add(String),
}

/// One `@@ -a,b +c,d @@` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// 1-based hunk number within its file.
    number: usize,
    /// The header line, for messages.
    header: String,
    old_start: usize,
    new_start: usize,
    lines: Vec<HunkLine>,
}

/// The hunks for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The target from the `+++` line (`a/`/`b/` stripped), when there was one.
    pub path: Option<String>,
    /// `--- /dev/null`: the file is created.
    pub creates: bool,
    /// The hunks, in order.
    pub hunks: Vec<Hunk>,
}

/// What an approved change consists of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The complete new content of the target file.
    Whole(String),
    /// A unified diff for one or more files.
    Diff(Vec<FilePatch>),
}

const PREAMBLE: &[&str] = &[
    "diff ",
    "index ",
    "Index: ",
    "====",
    "new file mode",
    "deleted file mode",
    "old mode",
    "new mode",
    "similarity index",
    "dissimilarity index",
    "rename from",
    "rename to",
    "copy from",
    "copy to",
];

fn is_preamble(line: &str) -> bool {
    PREAMBLE.iter().any(|p| line.starts_with(p))
}

fn trim_eol(line: &str) -> &str {
    line.strip_suffix('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .unwrap_or(line)
}

/// Git extended headers that say what applying the diff would not do.
/// (`new file mode 100644` and `index` lines are what git writes for a
/// plain creation or edit, and stay.)
const UNAPPLIED: &[&str] = &[
    "deleted file mode",
    "old mode",
    "new mode",
    "rename from",
    "rename to",
    "copy from",
    "copy to",
    "similarity index",
    "dissimilarity index",
];

/// Refuses a preamble line that promises what is not applied.
fn applied_preamble(line: &str) -> Result<(), PatchError> {
    let unapplied = UNAPPLIED.iter().any(|p| line.starts_with(p))
        || line
            .strip_prefix("new file mode ")
            .is_some_and(|mode| trim_eol(mode) != "100644");
    if unapplied {
        return Err(PatchError::Unapplied(trim_eol(line).to_owned()));
    }
    Ok(())
}

/// The path named by a `---`/`+++` line: `None` for `/dev/null`; the
/// timestamp (after a tab) and the `a/`/`b/` prefix are dropped. A quoted
/// name with escapes is refused (its bytes are not decoded).
fn header_path(rest: &str) -> Result<Option<String>, PatchError> {
    let raw = trim_eol(rest);
    let raw = raw.split('\t').next().unwrap_or(raw).trim();
    let unquoted = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"'));
    if unquoted.is_some_and(|u| u.contains('\\')) {
        return Err(PatchError::QuotedName(raw.to_owned()));
    }
    let raw = unquoted.unwrap_or(raw);
    if raw == "/dev/null" {
        return Ok(None);
    }
    let stripped = raw
        .strip_prefix("a/")
        .or_else(|| raw.strip_prefix("b/"))
        .unwrap_or(raw);
    Ok(Some(stripped.to_owned()))
}

/// Parses `-a,b` / `+c,d` ranges (the count defaults to 1).
fn parse_range(s: &str, sign: char) -> Option<(usize, usize)> {
    let s = s.strip_prefix(sign)?;
    let (start, len) = match s.split_once(',') {
        Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
        None => (s.parse().ok()?, 1),
    };
    Some((start, len))
}

fn parse_header(line: &str, number: usize) -> Result<(usize, usize, usize, usize), PatchError> {
    let bad = || PatchError::BadHeader {
        hunk: number,
        header: trim_eol(line).to_owned(),
    };
    let body = trim_eol(line).strip_prefix("@@ ").ok_or_else(bad)?;
    let (ranges, _) = body.split_once(" @@").ok_or_else(bad)?;
    let mut parts = ranges.split_whitespace();
    let (old_start, old_len) = parts
        .next()
        .and_then(|p| parse_range(p, '-'))
        .ok_or_else(bad)?;
    let (new_start, new_len) = parts
        .next()
        .and_then(|p| parse_range(p, '+'))
        .ok_or_else(bad)?;
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((old_start, old_len, new_start, new_len))
}

impl Change {
    /// Tells a unified diff from whole-file content and parses it.
    ///
    /// Text is a diff when its first line that is not diff preamble
    /// (`diff --git`, `index`, mode lines) is a `--- ` line followed by a
    /// `+++ ` line, or a `@@ -` hunk header. Anything else is the complete
    /// new content of the file.
    pub fn parse(text: &str) -> Result<Change, PatchError> {
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let first = lines.iter().position(|l| !is_preamble(l));
        let Some(first) = first else {
            return Ok(Change::Whole(text.to_owned()));
        };
        let looks_like_diff = (lines[first].starts_with("--- ")
            && lines.get(first + 1).is_some_and(|l| l.starts_with("+++ ")))
            || lines[first].starts_with("@@ -");
        if !looks_like_diff {
            return Ok(Change::Whole(text.to_owned()));
        }
        for line in &lines[..first] {
            applied_preamble(line)?;
        }
        parse_diff(&lines[first..]).map(Change::Diff)
    }
}

/// The 1-based line where `text` has anything a diff viewer takes for a
/// diff's start: a `diff --git` (`--cc`, `--combined`) line, a `Binary
/// files … differ` line, a `--- ` line followed by a `+++ ` line, or a hunk
/// header (`@@ -`, a combined diff's `@@@`). A probe's
/// whole content hid its first lines behind each of these in the console's
/// diff view.
pub fn diff_headers_at(text: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .position(|(i, l)| {
            l.starts_with("diff --git ")
                || l.starts_with("diff --cc ")
                || l.starts_with("diff --combined ")
                || (l.starts_with("Binary files ") && l.ends_with(" differ"))
                || l.starts_with("@@ -")
                || l.starts_with("@@@ ")
                || (l.starts_with("--- ")
                    && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")))
        })
        .map(|i| i + 1)
}

fn parse_diff(lines: &[&str]) -> Result<Vec<FilePatch>, PatchError> {
    let mut files: Vec<FilePatch> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(old) = line.strip_prefix("--- ") {
            let Some(new) = lines.get(i + 1).and_then(|l| l.strip_prefix("+++ ")) else {
                return Err(PatchError::BadFileHeader(trim_eol(line).to_owned()));
            };
            let old_path = header_path(old)?;
            let new_path = header_path(new)?;
            if new_path.is_none() {
                let what = old_path.unwrap_or_else(|| "a file".into());
                return Err(PatchError::Deletion(what));
            }
            files.push(FilePatch {
                path: new_path,
                creates: old_path.is_none(),
                hunks: Vec::new(),
            });
            i += 2;
        } else if line.starts_with("@@") {
            if files.is_empty() {
                // Bare hunks: the target is the request's file_path.
                files.push(FilePatch {
                    path: None,
                    creates: false,
                    hunks: Vec::new(),
                });
            }
            let file = files.last_mut().ok_or(PatchError::Empty)?;
            let number = file.hunks.len() + 1;
            let (hunk, used) = parse_hunk(&lines[i..], number)?;
            file.hunks.push(hunk);
            i += used;
        } else if is_preamble(line) {
            applied_preamble(line)?;
            i += 1;
        } else if trim_eol(line).is_empty() {
            i += 1;
        } else {
            // Commentary between files (e.g. `git format-patch` text) is ignored.
            i += 1;
        }
    }
    if files.is_empty() || files.iter().any(|f| f.hunks.is_empty()) {
        return Err(PatchError::Empty);
    }
    Ok(files)
}

/// Parses one hunk starting at its header; returns it and the lines used.
fn parse_hunk(lines: &[&str], number: usize) -> Result<(Hunk, usize), PatchError> {
    let header_line = lines[0];
    let header = trim_eol(header_line).to_owned();
    let (old_start, old_len, new_start, new_len) = parse_header(header_line, number)?;
    let body_err = |problem: String| PatchError::BadBody {
        hunk: number,
        header: header.clone(),
        problem,
    };
    let (mut old_seen, mut new_seen) = (0usize, 0usize);
    let mut body: Vec<HunkLine> = Vec::new();
    let mut i = 1;
    while old_seen < old_len || new_seen < new_len {
        let Some(line) = lines.get(i) else {
            return Err(body_err(format!(
                "the diff ends after {old_seen} of {old_len} old and {new_seen} of {new_len} new lines"
            )));
        };
        let (tag, text) = match line.chars().next() {
            Some(c @ (' ' | '-' | '+')) => (c, &line[1..]),
            // Some tools strip the space of an empty context line.
            Some('\n') | Some('\r') => (' ', *line),
            Some('\\') => {
                if !marker_may_stand(&body, old_seen == old_len, new_seen == new_len) {
                    return Err(body_err(format!(
                        "`{}` stands before the end of its side of the hunk: it may only follow the last old or new line",
                        trim_eol(line)
                    )));
                }
                no_newline(&mut body);
                i += 1;
                continue;
            }
            _ => {
                return Err(body_err(format!(
                    "line {:?} is not a context, `-` or `+` line, but the header promises {} old and {} new lines (found {old_seen} and {new_seen})",
                    trim_eol(line),
                    old_len,
                    new_len
                )));
            }
        };
        let (old, new) = push_line(&mut body, tag, text);
        old_seen += old;
        new_seen += new;
        if old_seen > old_len || new_seen > new_len {
            return Err(body_err(format!(
                "more lines than the header's {old_len} old / {new_len} new"
            )));
        }
        i += 1;
    }
    // A trailing `\ No newline at end of file` belongs to the last line.
    if lines.get(i).is_some_and(|l| l.starts_with('\\')) {
        no_newline(&mut body);
        i += 1;
    }
    // A line of the hunk's kind past its counts would be shown and not
    // applied (a probe's added `require_admin(req)` was never written).
    if let Some(line) = lines.get(i)
        && past_the_counts(line)
    {
        return Err(body_err(format!(
            "line {:?} follows the hunk after its header's {old_len} old and {new_len} new lines: fix the counts",
            trim_eol(line)
        )));
    }
    Ok((
        Hunk {
            number,
            header,
            old_start,
            new_start,
            lines: body,
        },
        i,
    ))
}

/// Whether a `\ No newline at end of file` marker may stand after `body`:
/// it ends its side of the file, so after a removed line only added lines
/// may follow (`old_done`), after any other line nothing (both done).
/// Anywhere else it would join two lines the operator saw apart (a probe's
/// `+echo cleaning; r` then `+m -rf ...` wrote `rm -rf`).
fn marker_may_stand(body: &[HunkLine], old_done: bool, new_done: bool) -> bool {
    match body.last() {
        Some(HunkLine::Remove(_)) => old_done,
        Some(_) => old_done && new_done,
        None => false,
    }
}

/// Adds one body line (`tag` is ' ', '-' or '+'); returns how many old and
/// new lines it counts for.
fn push_line(body: &mut Vec<HunkLine>, tag: char, text: &str) -> (usize, usize) {
    let (line, counts) = match tag {
        ' ' => (HunkLine::Context(text.to_owned()), (1, 1)),
        '-' => (HunkLine::Remove(text.to_owned()), (1, 0)),
        _ => (HunkLine::Add(text.to_owned()), (0, 1)),
    };
    body.push(line);
    counts
}

/// A context, `+` or `-` line, not a file header (`--- `, `+++ `) nor a
/// blank line: one that reads as part of the hunk before it.
fn past_the_counts(line: &str) -> bool {
    let text = trim_eol(line);
    match text.chars().next() {
        Some('+') => !text.starts_with("+++ "),
        Some('-') => !text.starts_with("--- "),
        Some(' ') => !text.trim().is_empty(),
        _ => false,
    }
}

fn no_newline(body: &mut [HunkLine]) {
    if let Some(last) = body.last_mut() {
        let text = match last {
            HunkLine::Context(t) | HunkLine::Remove(t) | HunkLine::Add(t) => t,
        };
        if let Some(t) = text.strip_suffix('\n') {
            *text = t.strip_suffix('\r').unwrap_or(t).to_owned();
        }
    }
}

impl Hunk {
    fn old_lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().filter_map(|l| match l {
            HunkLine::Context(t) | HunkLine::Remove(t) => Some(t.as_str()),
            HunkLine::Add(_) => None,
        })
    }

    fn old_len(&self) -> usize {
        self.old_lines().count()
    }

    fn first_mismatch(&self, file: &[&str], at: usize) -> PatchError {
        for (k, want) in self.old_lines().enumerate() {
            let have = file.get(at + k);
            if !have.is_some_and(|h| same_line(want, h)) {
                return PatchError::Mismatch {
                    hunk: self.number,
                    header: self.header.clone(),
                    line: at + k + 1,
                    expected: trim_eol(want).to_owned(),
                    found: have
                        .map(|h| trim_eol(h).to_owned())
                        .unwrap_or_else(|| "<end of file>".into()),
                };
            }
        }
        PatchError::Overlap {
            hunk: self.number,
            header: self.header.clone(),
        }
    }
}

/// Lines are equal when their text is; `\n` vs `\r\n` does not matter, but
/// a missing final newline does only in that it is not compared.
fn same_line(want: &str, have: &str) -> bool {
    trim_eol(want) == trim_eol(have)
}

/// Applies `hunks` to `original`. Each hunk must match exactly at its
/// stated line or, like `patch`, at the nearest offset after the previous
/// hunk; the error names the first hunk that does not.
pub fn apply(original: &str, hunks: &[Hunk]) -> Result<String, PatchError> {
    let file: Vec<&str> = original.split_inclusive('\n').collect();
    let crlf = file.first().is_some_and(|l| l.ends_with("\r\n"));
    let mut out = String::with_capacity(original.len());
    let mut cursor = 0usize; // next unconsumed line of `file`
    // Line comparisons the whole patch may make while looking for where
    // its hunks match: a probe's 150 hunks, each searched across a 1.3M
    // line file, held a runtime worker for 27 s.
    let mut budget = file.len().saturating_mul(8).saturating_add(1 << 20);
    for hunk in hunks {
        // `-0,0` means "before the first line".
        let stated = if hunk.old_len() == 0 {
            hunk.old_start
        } else {
            hunk.old_start.saturating_sub(1)
        };
        let at = match find_position(hunk, &file, cursor, stated, &mut budget) {
            Found::At(at) => at,
            Found::OutOfBudget => {
                return Err(PatchError::SearchBound {
                    hunk: hunk.number,
                    header: hunk.header.clone(),
                });
            }
            Found::Nowhere if stated < cursor => {
                return Err(PatchError::Overlap {
                    hunk: hunk.number,
                    header: hunk.header.clone(),
                });
            }
            Found::Nowhere => return Err(hunk.first_mismatch(&file, stated.min(file.len()))),
        };
        for line in &file[cursor..at] {
            out.push_str(line);
        }
        let mut k = at;
        for line in &hunk.lines {
            match line {
                HunkLine::Context(_) => {
                    out.push_str(file[k]);
                    k += 1;
                }
                HunkLine::Remove(_) => k += 1,
                HunkLine::Add(text) => {
                    if crlf && text.ends_with('\n') && !text.ends_with("\r\n") {
                        out.push_str(&text[..text.len() - 1]);
                        out.push_str("\r\n");
                    } else {
                        out.push_str(text);
                    }
                }
            }
        }
        cursor = k;
    }
    for line in &file[cursor..] {
        out.push_str(line);
    }
    Ok(out)
}

/// Where a hunk matches.
enum Found {
    At(usize),
    Nowhere,
    OutOfBudget,
}

/// The line where `hunk` applies: its stated line if it matches there,
/// else the nearest matching line at or after `cursor` (of two equally
/// near, the earlier). Lines are tried outward from the stated one, so the
/// search ends at the first match; `budget` counts the line comparisons
/// left for the whole patch.
fn find_position(
    hunk: &Hunk,
    file: &[&str],
    cursor: usize,
    stated: usize,
    budget: &mut usize,
) -> Found {
    let old: Vec<&str> = hunk.old_lines().collect();
    let Some(max) = file.len().checked_sub(old.len()) else {
        return Found::Nowhere;
    };
    if cursor > max {
        return Found::Nowhere;
    }
    let stated = stated.clamp(cursor, max);
    for d in 0..=(max - cursor) {
        let below = stated.checked_sub(d).filter(|at| *at >= cursor);
        let above = stated.checked_add(d).filter(|at| d > 0 && *at <= max);
        if below.is_none() && above.is_none() {
            break;
        }
        for at in [below, above].into_iter().flatten() {
            match matches_at(&old, file, at, budget) {
                Some(true) => return Found::At(at),
                Some(false) => {}
                None => return Found::OutOfBudget,
            }
        }
    }
    Found::Nowhere
}

/// Whether the hunk's `old` lines match `file` at `at` (line endings
/// aside); `None` once `budget` comparisons are spent.
fn matches_at(old: &[&str], file: &[&str], at: usize, budget: &mut usize) -> Option<bool> {
    let Some(have) = at.checked_add(old.len()).and_then(|end| file.get(at..end)) else {
        return Some(false);
    };
    for (want, have) in old.iter().zip(have) {
        *budget = budget.checked_sub(1)?;
        if !same_line(want, have) {
            return Some(false);
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(text: &str) -> Vec<FilePatch> {
        match Change::parse(text).expect("parses") {
            Change::Diff(files) => files,
            Change::Whole(_) => panic!("not recognised as a diff"),
        }
    }

    const ORIGINAL: &str = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n";

    #[test]
    fn whole_content_is_not_mistaken_for_a_diff() {
        for text in [
            "fn main() {}\n",
            "---\ntitle: front matter\n---\n",
            "",
            "--- not a header without a plus line\n",
        ] {
            assert_eq!(
                Change::parse(text).expect("parse"),
                Change::Whole(text.into())
            );
        }
    }

    #[test]
    fn a_git_diff_with_two_hunks_applies() {
        let files = diff(
            "diff --git a/n.txt b/n.txt\nindex 1..2 100644\n--- a/n.txt\n+++ b/n.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n@@ -8,3 +8,4 @@ section\n eight\n nine\n+nine and a half\n ten\n",
        );
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path.as_deref(), Some("n.txt"));
        let out = apply(ORIGINAL, &files[0].hunks).expect("applies");
        assert_eq!(
            out,
            "one\nTWO\nthree\nfour\nfive\nsix\nseven\neight\nnine\nnine and a half\nten\n"
        );
    }

    #[test]
    fn hunks_may_move_by_an_offset_but_not_change_context() {
        let files = diff("@@ -2,2 +2,2 @@\n three\n-four\n+FOUR\n");
        // Stated at line 2, found at line 3.
        let out = apply(ORIGINAL, &files[0].hunks).expect("offset");
        assert!(out.contains("three\nFOUR\nfive"), "{out}");
        let files = diff("@@ -1,2 +1,2 @@\n one\n-zwei\n+TWO\n");
        let err = apply(ORIGINAL, &files[0].hunks).expect_err("mismatch");
        assert_eq!(
            err,
            PatchError::Mismatch {
                hunk: 1,
                header: "@@ -1,2 +1,2 @@".into(),
                line: 2,
                expected: "zwei".into(),
                found: "two".into(),
            }
        );
        assert!(err.to_string().starts_with("hunk 1 (@@ -1,2 +1,2 @@)"));
    }

    /// A probe's 150 hunks, each stated one line off in a 1.3M line file,
    /// were each searched across the whole file: 27 s on a runtime worker.
    /// The search ends at the nearest match, and a patch has a bounded
    /// number of comparisons in all.
    #[test]
    fn the_search_for_a_moved_hunk_ends_at_the_nearest_match_and_is_bounded() {
        let big = format!("A\n{}", "x\n".repeat(200_000));
        let text: String = (0..150).map(|_| "@@ -1,1 +1,2 @@\n x\n+y\n").collect();
        let files = diff(&text);
        let out = apply(&big, &files[0].hunks).expect("each hunk one line below");
        assert_eq!(out.matches("y\n").count(), 150);
        // A match far from the stated line costs comparisons from the
        // patch's budget; past it the patch is refused, saying why.
        let far = format!("{}x\n", "z\n".repeat(300_000));
        let file: Vec<&str> = far.split_inclusive('\n').collect();
        let files = diff("@@ -1,1 +1,2 @@\n x\n+y\n");
        let hunk = &files[0].hunks[0];
        let mut plenty = usize::MAX;
        assert!(matches!(
            find_position(hunk, &file, 0, 0, &mut plenty),
            Found::At(300_000)
        ));
        let mut little = 1_000;
        assert!(matches!(
            find_position(hunk, &file, 0, 0, &mut little),
            Found::OutOfBudget
        ));
    }

    /// A probe's `@@ -18446744073709551615,2 ...` panicked with an overflow.
    #[test]
    fn an_absurd_line_number_is_a_mismatch_not_a_panic() {
        let files =
            diff("@@ -18446744073709551615,2 +18446744073709551615,2 @@\n one\n-two\n+TWO\n");
        let out = apply(ORIGINAL, &files[0].hunks).expect("found at the nearest match");
        assert!(out.contains("one\nTWO\n"), "{out}");
    }

    #[test]
    fn creation_and_missing_final_newline() {
        let files = diff(
            "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n\\ No newline at end of file\n",
        );
        assert!(files[0].creates);
        assert_eq!(apply("", &files[0].hunks).expect("create"), "hello\nworld");
        let files = diff("@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n");
        assert_eq!(apply("a", &files[0].hunks).expect("apply"), "b\n");
    }

    /// What the operator reads is what is applied: a newline marker in the
    /// middle of a side would join two shown lines into one (`r` + `m -rf`
    /// became `rm -rf`), and lines past the header's counts would be shown
    /// and never written. Both are refused.
    #[test]
    fn a_diff_that_would_apply_other_than_it_reads_is_refused() {
        let joined = "@@ -1,1 +1,3 @@\n #!/bin/sh\n+echo cleaning; r\n\\ No newline at end of file\n+m -rf \"$HOME\"/.ssh\n";
        let err = Change::parse(joined).expect_err("refused").to_string();
        assert!(err.contains("before the end of its side"), "{err}");
        let beyond = "@@ -1,2 +1,2 @@\n def handler(req):\n-    return serve(req)\n+    return serve(req)  # TODO\n+    require_admin(req)\n";
        let err = Change::parse(beyond).expect_err("refused").to_string();
        assert!(err.contains("fix the counts"), "{err}");
        let removed = "@@ -1,2 +1,1 @@\n a\n-b\n-backdoor stays\n";
        assert!(Change::parse(removed).is_err());
        // Two files, a blank line between them: still fine.
        let two =
            "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-c\n+d\n";
        assert_eq!(diff(two).len(), 2);
    }

    #[test]
    fn crlf_files_keep_their_line_endings() {
        let files = diff("@@ -1,2 +1,3 @@\n a\n+new\n b\n");
        assert_eq!(
            apply("a\r\nb\r\n", &files[0].hunks).expect("apply"),
            "a\r\nnew\r\nb\r\n"
        );
    }

    #[test]
    fn several_files_and_malformed_diffs() {
        let files = diff(
            "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-1\n+2\n--- a/dir/y\n+++ b/dir/y\n@@ -1 +1,2 @@\n y\n+z\n",
        );
        let paths: Vec<_> = files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(paths, vec![Some("x".into()), Some("dir/y".into())]);
        assert!(matches!(
            Change::parse("@@ -1,3 +1,3 @@\n a\n-b\n"),
            Err(PatchError::BadBody { hunk: 1, .. })
        ));
        assert!(matches!(
            Change::parse("@@ -x +1 @@\n a\n"),
            Err(PatchError::BadHeader { hunk: 1, .. })
        ));
        assert!(matches!(
            Change::parse("--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"),
            Err(PatchError::Deletion(_))
        ));
    }

    /// What a diff viewer shows but applying would not do is refused
    /// (probe AA: `deleted file mode` with a hunk was applied as an edit,
    /// a rename was approved and could never be applied, a mode was shown
    /// and not set, and an octal-quoted name was not decoded).
    #[test]
    fn headers_that_would_not_be_applied_are_refused() {
        let hunk = "--- a/ra.txt\n+++ b/rb.txt\n@@ -1 +1 @@\n-a\n+b\n";
        for header in [
            "deleted file mode 100644",
            "rename from ra.txt",
            "copy from ra.txt",
            "old mode 100644",
            "new file mode 100755",
            "similarity index 90%",
        ] {
            let text = format!("diff --git a/ra.txt b/rb.txt\n{header}\n{hunk}");
            assert!(
                matches!(Change::parse(&text), Err(PatchError::Unapplied(ref h)) if h == header),
                "{header}: {:?}",
                Change::parse(&text)
            );
            // In a second file's preamble too.
            let two = format!(
                "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\ndiff --git a/y b/y\n{header}\n{hunk}"
            );
            assert!(
                matches!(Change::parse(&two), Err(PatchError::Unapplied(_))),
                "{header}"
            );
        }
        // What git writes for a plain creation or edit stays accepted.
        let created = "diff --git a/n.txt b/n.txt\nnew file mode 100644\nindex 0000000..1234567\n--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+n\n";
        assert!(matches!(Change::parse(created), Ok(Change::Diff(_))));
        let quoted =
            "--- \"a/caf\\303\\251.txt\"\n+++ \"b/caf\\303\\251.txt\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(
            matches!(Change::parse(quoted), Err(PatchError::QuotedName(_))),
            "{:?}",
            Change::parse(quoted)
        );
        let plain_quoted = "--- \"a/my file.txt\"\n+++ \"b/my file.txt\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(matches!(Change::parse(plain_quoted), Ok(Change::Diff(_))));
    }

    #[test]
    fn out_of_order_hunks_are_refused() {
        let files = diff("@@ -5,1 +5,1 @@\n-five\n+FIVE\n@@ -1,1 +1,1 @@\n-one\n+ONE\n");
        assert!(matches!(
            apply(ORIGINAL, &files[0].hunks),
            Err(PatchError::Overlap { hunk: 2, .. })
        ));
    }
}
