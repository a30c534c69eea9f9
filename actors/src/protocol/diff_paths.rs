//! Every file a diff can change, read the way patch tools read it.
//!
//! Why this exists: an intercom agent applies its own diff once the
//! clearance is approved, so the rules must judge each file the diff's
//! headers make `git apply` or `patch` write, not only the `---`/`+++`
//! pairs. A probe had these approved by mode `auto-edits` behind an
//! innocent `file_path`: a `diff --git` rename into `.git/hooks/pre-commit`,
//! a `copy to .envrc`, a `Binary files ... differ` header, and `---`/`+++`
//! separated from their path by a tab.

/// The files `diff` names, in order, each once: `diff --git` paths,
/// `rename`/`copy` `from`/`to`, `Binary files A and B differ`, `Index:`,
/// unified (`---`/`+++`) and context (`***`/`---`) header pairs. `a/` and
/// `b/` prefixes are dropped, git's quoted paths unquoted, `/dev/null`
/// skipped.
pub fn named_in(diff: &str) -> Vec<String> {
    // GNU patch reads an indented patch (it strips the indent), so every
    // header is looked for after leading blanks too.
    let lines: Vec<&str> = diff.lines().map(str::trim_start).collect();
    let mut out: Vec<String> = Vec::new();
    let mut add = |raw: &str| {
        let path = strip_side(&unquote(raw.trim()));
        if !path.is_empty() && path != "/dev/null" && !out.contains(&path) {
            out.push(path);
        }
    };
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            for p in git_pair(rest) {
                add(&p);
            }
        } else if let Some(p) = ["rename from ", "rename to ", "copy from ", "copy to "]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        {
            add(p);
        } else if let Some(pair) = line
            .strip_prefix("Binary files ")
            .and_then(|r| r.strip_suffix(" differ"))
            .and_then(|r| r.split_once(" and "))
        {
            add(pair.0);
            add(pair.1);
        } else if let Some(p) = line.strip_prefix("Index: ") {
            add(p);
        } else if let (Some(old), Some(next)) = (header(line, "---"), lines.get(i + 1))
            && let Some(new) = header(next, "+++")
        {
            add(old);
            add(new);
        } else if let (Some(new), Some(next)) = (header(line, "+++"), lines.get(i + 1))
            && let Some(old) = header(next, "---")
        {
            // GNU patch takes the pair in either order.
            add(old);
            add(new);
        } else if let (Some(old), Some(next)) = (header(line, "***"), lines.get(i + 1))
            && let Some(new) = header(next, "---")
        {
            add(old);
            add(new);
        }
    }
    out
}

/// The path of a `---`/`+++`/`***` header line: the marker, a space or a
/// tab, the path, then an optional tab and timestamp.
fn header<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(marker)?;
    let rest = rest.strip_prefix([' ', '\t'])?;
    // A quoted path may hold a tab; an unquoted one ends at the first.
    if rest.starts_with('"') {
        return Some(rest);
    }
    Some(rest.split('\t').next().unwrap_or(rest))
}

/// The two paths of `diff --git a/x b/y`, quoted or not. Unquoted names
/// with spaces are split where ` b/` begins the second.
fn git_pair(rest: &str) -> Vec<String> {
    if let Some(stripped) = rest.strip_prefix('"')
        && let Some(end) = closing_quote(stripped)
    {
        let first = format!("\"{}\"", &stripped[..end]);
        let second = stripped[end + 1..].trim();
        return vec![first, second.to_owned()];
    }
    match rest.find(" b/").or_else(|| rest.find(" \"b/")) {
        Some(at) => vec![rest[..at].to_owned(), rest[at + 1..].to_owned()],
        None => rest.split_whitespace().map(str::to_owned).collect(),
    }
}

/// Index of the quote that closes a quoted name (`\"` escapes one).
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

/// Git's C-style quoting undone: `"a/x\ty"` is `a/x<TAB>y`. Octal escapes
/// are bytes of UTF-8, decoded lossily. An unquoted name is returned as is.
fn unquote(name: &str) -> String {
    let Some(inner) = name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) else {
        return name.to_owned();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0; 4];
            bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('t') => bytes.push(b'\t'),
            Some('n') => bytes.push(b'\n'),
            Some('r') => bytes.push(b'\r'),
            Some(d @ '0'..='7') => {
                let mut value = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(v) => {
                            value = value * 8 + v;
                            chars.next();
                        }
                        None => break,
                    }
                }
                bytes.push((value & 0xff) as u8);
            }
            Some(other) => {
                let mut buf = [0; 4];
                bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
            }
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `a/x` and `b/x` as `x`.
fn strip_side(path: &str) -> String {
    path.strip_prefix("a/")
        .or_else(|| path.strip_prefix("b/"))
        .unwrap_or(path)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_headers_name_what_they_write() {
        let diff = "diff --git a/src/ok.rs b/.git/hooks/pre-commit\n\
                    similarity index 100%\n\
                    rename from src/ok.rs\n\
                    rename to .git/hooks/pre-commit\n\
                    diff --git a/src/ok.rs b/.envrc\n\
                    copy from src/ok.rs\n\
                    copy to .envrc\n\
                    diff --git \"a/we ird\" \"b/.git/hooks/post\\tmerge\"\n\
                    Binary files /dev/null and b/.git/hooks/post-merge differ\n";
        assert_eq!(
            named_in(diff),
            vec![
                "src/ok.rs",
                ".git/hooks/pre-commit",
                ".envrc",
                "we ird",
                ".git/hooks/post\tmerge",
                ".git/hooks/post-merge"
            ]
        );
    }

    /// GNU patch applies these; a probe had each write `.envrc` past
    /// auto-edits (git apply refuses them).
    #[test]
    fn indented_headers_and_a_pair_in_reverse_order_count() {
        let diff = " --- a/.envrc\n +++ b/.envrc\n @@ -0,0 +1 @@\n +x\n\
                    \t+++ b/.git/config\n\t--- a/.git/config\n\
                    \t diff --git a/x b/.vscode/tasks.json\n";
        assert_eq!(
            named_in(diff),
            vec![".envrc", ".git/config", "x", ".vscode/tasks.json"]
        );
    }

    #[test]
    fn unified_and_context_headers_with_a_tab_or_a_space() {
        let diff = "---\ta/x.rs\t2026-01-01\n+++\tb/.git/config\n@@ -1 +1 @@\n-a\n+b\n\
                    *** a/y.txt\n--- b/.vscode/tasks.json\n\
                    Index: notes.md\n\
                    --- sql comment removed, not a header\n";
        assert_eq!(
            named_in(diff),
            vec![
                "x.rs",
                ".git/config",
                "y.txt",
                ".vscode/tasks.json",
                "notes.md"
            ]
        );
    }
}
