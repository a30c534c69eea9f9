//! Applying an approved change (`check_diff`), and what `check_clearance`
//! records so it can be applied safely later.
//!
//! `check_clearance` stores a SHA-256 of each target file with the request
//! (in SQLite, so it outlives a server restart). `check_diff` applies only
//! an approved request of the caller's own session (a bridge token) or of
//! its workspace (an IDE client), refuses when a target file changed since
//! (unless `force`), computes every new content before writing anything,
//! claims the request so two concurrent applies write once, and writes
//! through the workspace's directory handle (never outside it, never a
//! server file).

use std::sync::Arc;

use intercom_actors::model::{
    Decision, PendingRequest, RequestKind, RequestStatus, SessionId, now_ms,
};
use intercom_actors::ports::Clearance;
use intercom_actors::workspace_fs::{
    FsError, WorkspaceFs, approved_on_blocking_pool, on_blocking_pool,
};
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use serde_json::json;

use super::super::patch::{self, Change, FilePatch};
use super::super::tools::Args;
use super::{Fail, IntercomMcp, Target, ToolResult, storage};

impl IntercomMcp {
    /// `check_diff`: applies the approved change of `request_id`.
    pub(super) async fn check_diff(
        &self,
        args: Args,
        ctx: &RequestContext<RoleServer>,
    ) -> ToolResult {
        let t = self.target(ctx).await?;
        let raw = args.str_or("request_id", "").trim().to_owned();
        let force = args.flag("force");
        let (global, req) = self.approved_request(&t, &raw).await?;
        let Some(root) = t.cwd.clone() else {
            return Err(Fail::refused(
                "no_workspace",
                "this session has no workspace (connect with /mcp?workspace_id=<id>), so the change cannot be applied here",
            ));
        };
        let (Some(text), Some(file_path)) = (req.diff.as_deref(), req.paths.first()) else {
            return Err(Fail::refused(
                "no_change",
                format!("request {raw} carries no change to apply"),
            ));
        };
        let store = &self.deps().store;
        let clearance = self.clearance_to_apply(&global, &raw).await?;
        let change = Change::parse(text).map_err(|e| {
            Fail::refused(
                "bad_diff",
                format!("the approved diff cannot be parsed: {e}"),
            )
        })?;
        let ws = self.shared.workspace(&root)?;
        let files = targets(&change, file_path);
        for (rel, _) in &files {
            lands_as_named(&ws, rel).await.map_err(|e| {
                let code = match e {
                    FsError::Moved { .. } => "moved",
                    _ => "outside_workspace",
                };
                Fail::refused(code, e.to_string())
            })?;
        }
        // Whole content replaces the file: applied over changes the
        // operator never saw, it lost them (a probe's `force`), so it is
        // applied only to the file as approved.
        let whole = matches!(change, Change::Whole(_));
        if !force || whole {
            as_approved(&ws, &files, &clearance, &req.session_id, file_path)
                .await
                .map_err(|e| if whole { whole_not_forced(e) } else { e })?;
        }
        // Compute every new content before writing anything.
        let outputs = new_contents(&ws, &change, files).await?;
        // Claimed before writing: of two concurrent applies, one writes.
        let claimed = store
            .claim_clearance(&global, &req.session_id, now_ms())
            .await
            .map_err(storage)?;
        if !claimed {
            return Err(already_applied(&raw));
        }
        let written = match write_all(&ws, outputs).await {
            Ok(written) => written,
            Err((fail, nothing_written)) => {
                if claimed
                    && nothing_written
                    && let Err(e) = store.release_clearance(&global).await
                {
                    tracing::error!(request = %global, "cannot release the apply claim: {e}");
                }
                return Err(fail);
            }
        };
        // On the request's session (where the operator looks for what its
        // approval did), naming the connection's when another applied it
        // (after a reconnect, or a server restart).
        let detail = json!({"request": global, "files": written, "forced": force, "applied_by_session": t.id});
        self.audit_on(&req.session_id, "change.applied", detail)
            .await;
        Ok(json!({"request_id": global, "files_written": written}))
    }

    /// The record of the check_clearance request `global` (asked as
    /// `raw`), when its change may still be applied.
    async fn clearance_to_apply(&self, global: &str, raw: &str) -> Result<Clearance, Fail> {
        // Only a change asked with check_clearance (which records its
        // targets) is applied here, `force` or not: an agent's ACP
        // permission in the same workspace was approved for that agent to
        // make, not for an MCP client to apply in its place.
        let Some(clearance) = self.deps().store.clearance(global).await.map_err(storage)? else {
            return Err(Fail::Params(format!(
                "argument `request_id`: {raw} is not a check_clearance request; only a change asked with check_clearance can be applied"
            )));
        };
        // Once applied, never again, `force` or not: the client chooses
        // `force`, and a probe's re-applied an approved change after the
        // operator had reverted it (and after a restart, from another
        // credential). The operator approves each change once.
        if clearance.applied_at.is_some() {
            return Err(already_applied(raw));
        }
        Ok(clearance)
    }

    /// The request `raw` names (its global id and record), when the caller
    /// may apply it: approved, and a clearance of its own session (a bridge
    /// token) or of its own workspace (an IDE client that reconnected).
    async fn approved_request(
        &self,
        t: &Target,
        raw: &str,
    ) -> Result<(String, PendingRequest), Fail> {
        let global = if raw.contains(':') {
            raw.to_owned()
        } else {
            PendingRequest::global_id(&t.id, raw)
        };
        let store = &self.deps().store;
        let (req, decision) = store
            .get_request(&global)
            .await
            .map_err(storage)?
            .ok_or_else(|| {
                Fail::Params(format!(
                    "argument `request_id`: there is no request {raw}; pass the request_id check_clearance returned"
                ))
            })?;
        // A bridge token applies only its own session's approvals.
        self.ensure_reach(t, "check_diff", &req.session_id, Some(raw))
            .await?;
        if req.session_id != t.id {
            // A client that reconnected (new session) may apply what its
            // earlier session got approved: an MCP session of the same
            // workspace and credential only.
            let own = store.get_session(&t.id).await.map_err(storage)?;
            let theirs = store.get_session(&req.session_id).await.map_err(storage)?;
            let why = match (own, theirs) {
                (Some(own), Some(theirs)) => super::confine::may_name(&own, &theirs).err(),
                _ => Some("this connection cannot reach"),
            };
            if let Some(why) = why {
                return Err(Fail::Params(format!(
                    "argument `request_id`: request {raw} is from a session that {why}"
                )));
            }
        }
        if req.kind != RequestKind::Permission {
            return Err(Fail::Params(format!(
                "argument `request_id`: {raw} is not a check_clearance request"
            )));
        }
        ensure_approved(req.status, decision.as_ref(), raw)?;
        Ok((global, req))
    }
}

/// Refuses unless the request was decided and approved, saying why.
fn ensure_approved(
    status: RequestStatus,
    decision: Option<&Decision>,
    raw: &str,
) -> Result<(), Fail> {
    match (status, decision) {
        (RequestStatus::Decided, Some(d)) if d.approved => Ok(()),
        (RequestStatus::Decided, Some(d)) => {
            let why = d
                .reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            Err(Fail::refused(
                "not_approved",
                format!("request {raw} was rejected{why}; nothing to apply"),
            ))
        }
        (RequestStatus::Pending, _) => Err(Fail::refused(
            "not_decided",
            format!("request {raw} is still waiting for the operator"),
        )),
        (status, _) => Err(Fail::refused(
            "not_approved",
            format!("request {raw} is {}; nothing to apply", status.as_str()),
        )),
    }
}

/// Every target's new content, computed before anything is written: the
/// whole content as given, or the file's current content with its hunks
/// applied.
async fn new_contents(
    ws: &Arc<WorkspaceFs>,
    change: &Change,
    files: Vec<(String, Option<&FilePatch>)>,
) -> Result<Vec<(String, String)>, Fail> {
    let mut outputs = Vec::with_capacity(files.len());
    for (rel, fp) in files {
        let content = match (change, fp) {
            (Change::Whole(content), _) => content.clone(),
            (Change::Diff(_), Some(fp)) => patched(ws, &rel, fp).await?,
            (Change::Diff(_), None) => {
                return Err(Fail::refused("bad_diff", format!("no hunks for {rel}")));
            }
        };
        outputs.push((rel, content));
    }
    Ok(outputs)
}

/// `rel`'s current content with `fp`'s hunks applied (a diff that creates
/// the file applies to nothing, and only when the file does not exist).
async fn patched(ws: &Arc<WorkspaceFs>, rel: &str, fp: &FilePatch) -> Result<String, Fail> {
    let r = rel.to_owned();
    let current = on_blocking_pool(ws.clone(), "read", rel, move |ws| {
        ws.current(&r, MAX_APPLY_BYTES)
    })
    .await
    .map_err(|e| Fail::refused("diff_does_not_apply", e.to_string()))?;
    let original = match current {
        Some(s) if fp.creates => {
            return Err(Fail::refused(
                "diff_does_not_apply",
                format!("the diff creates {rel}, but it exists ({} bytes)", s.len()),
            ));
        }
        Some(s) => s,
        None if fp.creates => String::new(),
        None => {
            return Err(Fail::refused(
                "diff_does_not_apply",
                format!("cannot read {rel}: it does not exist"),
            ));
        }
    };
    // Matching hunks against a big file is work: off the runtime's workers.
    let hunks = fp.hunks.clone();
    tokio::task::spawn_blocking(move || patch::apply(&original, &hunks))
        .await
        .map_err(|e| Fail::refused("diff_does_not_apply", format!("{rel}: {e}")))?
        .map_err(|e| Fail::refused("diff_does_not_apply", format!("{rel}: {e}")))
}

/// What `check_clearance` records of each target before it asks: proof the
/// target is writable inside the workspace (not a server file, not through
/// a symlink) and the hash of its content now.
pub(super) async fn record_targets(
    ws: &Arc<WorkspaceFs>,
    change: &Change,
    file_path: &str,
) -> Result<Recorded, Fail> {
    let mut recorded: Recorded = Vec::new();
    for (rel, _) in targets(change, file_path) {
        let which = if rel == file_path {
            "file_path"
        } else {
            "diff"
        };
        lands_as_named(ws, &rel).await.map_err(|e| match e {
            FsError::Moved { now, .. } => Fail::Params(format!(
                "argument `{which}`: {rel} leads through a link to {now}; name the file where it is"
            )),
            e => fs_fail(&e, which),
        })?;
        let r = rel.clone();
        // `snapshot` reads through `current`, which refuses whatever a
        // write to the target would refuse.
        let hash = on_blocking_pool(ws.clone(), "read", &rel, move |ws| snapshot(ws, &r))
            .await
            .map_err(|e| fs_fail(&e, which))?;
        recorded.push((rel, hash));
    }
    Ok(recorded)
}

/// Refuses a target that does not land where it is named: one whose way
/// goes through a link (`d/x` with `d` a link to `.git/hooks`). A change is
/// judged, shown and approved by the path it names; a probe's agent had
/// `d/pre-commit` approved (in `auto-edits`, at once), then swapped `d`
/// for a link, and `check_diff` wrote `.git/hooks/pre-commit`. Checked when
/// clearance is asked, when the change is applied, and at the write itself
/// ([`write_all`]).
async fn lands_as_named(ws: &Arc<WorkspaceFs>, rel: &str) -> Result<(), FsError> {
    let r = rel.to_owned();
    let (named, lands) = on_blocking_pool(ws.clone(), "write", rel, move |ws| {
        Ok((ws.relative(&r)?, ws.check_write(&r)?))
    })
    .await?;
    if lands != named {
        return Err(FsError::Moved {
            path: rel.to_owned(),
            then: named.display().to_string(),
            now: lands.display().to_string(),
        });
    }
    Ok(())
}

/// Whole new content as the operator is shown it and `check_diff` applies
/// it: a unified diff against the file as it is now (a creation when it does
/// not exist), when that diff applied to the file gives back exactly the
/// content; `None` (shown and applied as sent) for an empty or new file,
/// where nothing is hidden. A probe's whole content `+important line 7
/// (fixed)` read as a one-line addition and replaced a 50-line README.
/// Content that makes no such diff against a file that has some (a lone
/// carriage return did) is refused: shown as sent, it hid every line it
/// replaced.
pub(super) async fn whole_as_diff(
    ws: &Arc<WorkspaceFs>,
    rel: &str,
    new: &str,
) -> Result<Option<String>, Fail> {
    let r = rel.to_owned();
    let current = on_blocking_pool(ws.clone(), "read", rel, move |ws| {
        ws.current(&r, MAX_APPLY_BYTES)
    })
    .await
    .map_err(|e| fs_fail(&e, "file_path"))?;
    // An empty file would read as a creation, which an existing file refuses.
    if current.as_deref() == Some("") {
        return Ok(None);
    }
    let replaces = current.is_some();
    let old = current.unwrap_or_default();
    let (named, new) = (rel.to_owned(), new.to_owned());
    let diffed = tokio::task::spawn_blocking(move || {
        let diff = intercom_actors::protocol::acp::unified_diff(&named, &old, &new);
        let Ok(Change::Diff(files)) = Change::parse(&diff) else {
            return None;
        };
        let [file] = files.as_slice() else {
            return None;
        };
        (patch::apply(&old, &file.hunks).ok()? == new).then_some(diff)
    })
    .await;
    match diffed.ok().flatten() {
        None if replaces => Err(Fail::Params(format!(
            "argument `diff`: this whole content cannot be shown to the operator as the change it makes to {rel}, which has content (a lone carriage return does that); send a unified diff instead"
        ))),
        shown => Ok(shown),
    }
}

/// A target file's content hash at clearance time (`None`: did not exist).
pub(super) type Recorded = Vec<(String, Option<[u8; 32]>)>;

/// The files a change writes, relative to the workspace: `file_path` for
/// whole content and single-file diffs, the `+++` paths for several files.
pub(super) fn targets<'a>(
    change: &'a Change,
    file_path: &str,
) -> Vec<(String, Option<&'a FilePatch>)> {
    match change {
        Change::Whole(_) => vec![(file_path.to_owned(), None)],
        Change::Diff(files) if files.len() == 1 => vec![(file_path.to_owned(), files.first())],
        Change::Diff(files) => files
            .iter()
            .map(|f| (f.path.clone().unwrap_or_else(|| file_path.into()), Some(f)))
            .collect(),
    }
}

/// Largest file a diff is applied to.
pub(super) const MAX_APPLY_BYTES: usize = 64 * 1024 * 1024;

/// SHA-256 of a workspace file's content (`None`: it does not exist yet).
pub(super) fn snapshot(ws: &WorkspaceFs, rel: &str) -> Result<Option<[u8; 32]>, FsError> {
    use sha2::{Digest, Sha256};
    Ok(ws
        .current(rel, MAX_APPLY_BYTES)?
        .map(|content| Sha256::digest(content.as_bytes()).into()))
}

/// A refused path as the tool's error: the agent's argument, or I/O.
pub(super) fn fs_fail(e: &FsError, which: &str) -> Fail {
    match e {
        FsError::Io { .. } | FsError::TimedOut { .. } => Fail::refused("io", e.to_string()),
        _ => Fail::Params(format!("argument `{which}`: {e}")),
    }
}

pub(super) fn already_applied(raw: &str) -> Fail {
    Fail::refused(
        "already_applied",
        format!(
            "request {raw} was already applied; an approval is applied once: ask check_clearance again to make the change again"
        ),
    )
}

/// A whole-content change refused as [`as_approved`] refuses a diff, saying
/// why `force` does not help.
fn whole_not_forced(e: Fail) -> Fail {
    match e {
        Fail::Refused { code, message } => Fail::Refused {
            code,
            message: format!(
                "{message} (whole content replaces the file, so it is applied only to the file as it was approved, even with force: ask for clearance again)"
            ),
        },
        other => other,
    }
}

/// Without `force`: the files are as they were when the change was
/// approved, which only a clearance of the same session can tell.
async fn as_approved(
    ws: &Arc<WorkspaceFs>,
    files: &[(String, Option<&FilePatch>)],
    clearance: &Clearance,
    session: &SessionId,
    file_path: &str,
) -> Result<(), Fail> {
    if &clearance.session_id != session {
        return Err(Fail::refused(
            "unverifiable",
            format!(
                "there is no record of {file_path}'s content when the change was approved; check the file and call again with force: true"
            ),
        ));
    }
    unchanged_since_clearance(ws, files, &clearance.files).await
}

/// Refuses when a target file is not as it was when clearance was asked.
pub(super) async fn unchanged_since_clearance(
    ws: &Arc<WorkspaceFs>,
    files: &[(String, Option<&FilePatch>)],
    recorded: &Recorded,
) -> Result<(), Fail> {
    for (rel, _) in files {
        let r = rel.clone();
        let now = on_blocking_pool(ws.clone(), "read", rel, move |ws| snapshot(ws, &r))
            .await
            .map_err(|e| Fail::refused("io", format!("cannot read {rel}: {e}")))?;
        let then = recorded.iter().find(|(r, _)| r == rel).map(|(_, h)| *h);
        if then != Some(now) {
            tracing::info!(file = %rel, then = %then.as_ref().map(hex).unwrap_or_default(), now = %hex(&now), "refusing check_diff: file changed");
            return Err(Fail::refused(
                "file_changed",
                format!(
                    "{rel} changed since the change was approved; ask for clearance again, or pass force: true to apply anyway"
                ),
            ));
        }
    }
    Ok(())
}

/// Writes every file in order; on failure, the error and whether nothing
/// was written.
pub(super) async fn write_all(
    ws: &Arc<WorkspaceFs>,
    outputs: Vec<(String, String)>,
) -> Result<Vec<String>, (Fail, bool)> {
    let mut written: Vec<String> = Vec::new();
    for (rel, content) in outputs {
        let r = rel.clone();
        // The operator approved this change: not refused for the
        // server-wide cap agents' reads can fill.
        let result = approved_on_blocking_pool(ws.clone(), &rel, move |ws| {
            let named = ws.relative(&r)?;
            ws.write_at(&r, &content, &named)
        })
        .await;
        if let Err(e) = result {
            let done = if written.is_empty() {
                String::from("nothing was written")
            } else {
                format!("already written: {}", written.join(", "))
            };
            let fail = Fail::refused("write_failed", format!("cannot write {rel}: {e} ({done})"));
            return Err((fail, written.is_empty()));
        }
        written.push(rel);
    }
    Ok(written)
}

pub(super) fn hex(h: &Option<[u8; 32]>) -> String {
    match h {
        Some(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        None => "absent".into(),
    }
}
