//! `check_clearance`'s parts that need no session: what the argument
//! `diff` changes (refused when it would apply other than it reads), the
//! files it writes, and what the call answers once the request is closed.

use super::*;

/// The change a clearance asks for: a unified diff, or a file's whole new
/// content. Refused before anything is built or read when it names too many
/// files, is not a valid diff, or is whole content with diff headers inside.
pub(super) fn clearance_change(diff: &str, file_path: &str) -> Result<Change, Fail> {
    // Counted before anything is built or read: a probe's diff naming
    // 60,000 files cost 55 MB and 60,000 reads per call before the
    // request was refused for its paths.
    let named = diff.lines().filter(|l| l.starts_with("+++ ")).count();
    if named > MAX_REQUEST_PATHS {
        return Err(Fail::Params(format!(
            "argument `diff` names {named} files; a request names at most {MAX_REQUEST_PATHS}: split the change"
        )));
    }
    let change = Change::parse(diff).map_err(|e| {
        Fail::Params(format!(
            "argument `diff` looks like a unified diff but is not a valid one: {e}"
        ))
    })?;
    // Whole content that carries diff headers further down reads as a
    // diff to the operator but would be written verbatim: a probe's
    // leading blank line turned a harmless-looking diff of deploy.sh
    // into deploy.sh's whole new content.
    if let (Change::Whole(_), Some(line)) = (&change, patch::diff_headers_at(diff))
        && !(file_path.ends_with(".patch") || file_path.ends_with(".diff"))
    {
        return Err(Fail::Params(format!(
            "argument `diff` is not a diff from its first line but has diff headers at line {line}: start it with its `---`/`+++` lines (or `diff --git`), or send the file's whole content without diff headers"
        )));
    }
    Ok(change)
}

/// Waits for the operator's decision, the expiry, the request closing
/// undecided, or the client cancelling the call (an error: the guard then
/// closes the request as cancelled).
pub(super) async fn clearance_answer(
    rx: &mut oneshot::Receiver<McpAnswer>,
    guard: &mut RequestGuard,
    timeout: Duration,
    call_ended: &tokio_util::sync::CancellationToken,
) -> Result<Option<McpAnswer>, Fail> {
    let answer = match wait_for(rx, timeout, call_ended).await {
        Waited::Answer(a) => Some(a),
        Waited::Closed => None,
        Waited::TimedOut => {
            guard.close(RequestStatus::Expired);
            // A decision may have won the race with the expiry.
            match tokio::time::timeout(ACTOR_TIMEOUT, &mut *rx).await {
                Ok(Ok(a @ McpAnswer::Decided(_))) => Some(a),
                _ => Some(McpAnswer::Closed(RequestStatus::Expired)),
            }
        }
        Waited::Cancelled => {
            return Err(Fail::Cancelled); // the guard closes it as cancelled
        }
    };
    Ok(answer)
}

/// Every file a clearance's change writes (a diff over several files names
/// more than `file_path`): rules and the operator judge all of them.
/// Where `a/../b` lands depends on whether `a` is a link: rules judge it as
/// the kernel resolves it, so it must be written that way too, or not at
/// all. Not at all is simpler to trust: a path with `..` is refused.
pub(super) fn clearance_paths(
    change: &Change,
    file_path: &str,
    root: Option<&Path>,
) -> Result<Vec<String>, Fail> {
    // A one-file diff is written to `file_path`: its own `+++` name must
    // agree, or the operator reads a diff of one file above another's name.
    if let Change::Diff(files) = change
        && let [only] = files.as_slice()
        && let Some(named) = &only.path
        && !Path::new(file_path).ends_with(named)
    {
        return Err(Fail::Params(format!(
            "argument `diff` changes {named:?} (its `+++` line) but `file_path` is {file_path:?}; they must name the same file"
        )));
    }
    let paths: Vec<String> = apply::targets(change, file_path)
        .into_iter()
        .map(|(rel, _)| rel)
        .collect();
    // Each section would be applied to the original file and the last
    // would win, dropping what the others changed (a probe's approved
    // removal was lost that way, also with `./x` beside `x`).
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = paths.iter().find(|p| !seen.insert(same_file(p, root))) {
        return Err(Fail::Params(format!(
            "argument `diff` changes {twice:?} in more than one section; give one section per file"
        )));
    }
    if let Some(p) = paths.iter().find(|p| {
        std::path::Path::new(p)
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    }) {
        return Err(Fail::Params(format!(
            "argument `file_path`: {p:?} climbs with `..`; give the file's path inside the workspace without `..`"
        )));
    }
    Ok(paths)
}

/// A path as written, spelled one way: `./` and doubled or trailing
/// slashes dropped, and the workspace's own directory in front of it.
fn same_file(path: &str, root: Option<&Path>) -> PathBuf {
    let p: PathBuf = Path::new(path)
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    match root.and_then(|r| p.strip_prefix(r).ok()) {
        Some(inside) => inside.to_path_buf(),
        None => p,
    }
}

/// What `check_clearance` answers once the request is closed: the
/// operator's decision, the expiry, or why it closed undecided.
pub(super) fn clearance_outcome(
    request_id: String,
    answer: Option<McpAnswer>,
    timeout: Duration,
) -> ToolResult {
    let mut out = json!({"request_id": request_id});
    match answer {
        Some(McpAnswer::Decided(d)) => {
            out["status"] = json!(if d.approved { "approved" } else { "rejected" });
            if let Some(reason) = d.reason {
                out["reason"] = json!(reason);
            }
        }
        Some(McpAnswer::Closed(RequestStatus::Expired)) => {
            out["status"] = json!("timeout");
            out["reason"] = json!(format!(
                "no decision within {} s; the request expired",
                timeout.as_secs()
            ));
        }
        Some(McpAnswer::Closed(status)) => {
            out["status"] = json!("rejected");
            out["reason"] = json!(format!(
                "the request was {status} before the operator decided",
                status = status.as_str()
            ));
        }
        None => {
            return Err(Fail::refused(
                "session_ended",
                "the session ended before the operator decided",
            ));
        }
    }
    Ok(out)
}
