//! `fs/read_text_file` and `fs/write_text_file`: the agent's file access,
//! served through the session's workspace handle ([`crate::workspace_fs`]).
//!
//! Reads are answered without asking (inside the workspace, regular files
//! only, bounded), and run off the actor: a slow file (a hung filesystem, a
//! huge one) never holds the session's decisions, steering or stop; at most
//! [`OPS_IN_FLIGHT`] file operations of a session run at once (each holds
//! its permit until it really ends, past its timeout too: see
//! [`crate::workspace_fs::on_blocking_pool`]); past that one is refused at
//! once.
//! Writes become `file_write` requests carrying the diff; the file
//! is written only after approval, re-resolved at that moment. All file I/O
//! runs on the blocking pool with a timeout, so a hung filesystem costs
//! this session a few seconds, never an async worker. Attempts at what the
//! agent must never have (outside the workspace, the server's own files,
//! writing through a symlink) are audited and shown to the operator.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::SessionState;
use super::noise::Verdict;
use crate::model::{OptionKind, PermissionOption, RequestKind};
use crate::ports::NoticeLevel;
use crate::protocol::acp;
use crate::protocol::jsonrpc::{RpcError, RpcId, codes};
use crate::workspace_fs::{FsError, approved_on_blocking_pool, on_blocking_pool};

/// A file write the agent asked for (`fs/write_text_file`), kept with its
/// request until it is decided.
#[derive(Debug, Clone)]
pub(super) struct AskedWrite {
    /// The path as the agent gave it (resolved again at write time).
    pub(super) path: String,
    /// What to write.
    pub(super) content: String,
    /// The workspace-relative file the request showed: the write is done
    /// only if the path still lands there.
    pub(super) shown: String,
}

/// Largest current file shown in a write's diff (bigger: diffed as new).
const DIFF_BASE_MAX: usize = 8 * 1024 * 1024;

fn rpc_error(e: &FsError) -> RpcError {
    let code = match e {
        FsError::Io { .. } | FsError::TimedOut { .. } => codes::INTERNAL_ERROR,
        FsError::Busy { .. } => codes::REFUSED,
        // ACP's "resource not found", worded as Node reports it: agents that
        // read a file to learn whether it exists (Gemini CLI before a write)
        // recognise either.
        FsError::NotFound { path } => {
            return RpcError::new(
                codes::RESOURCE_NOT_FOUND,
                format!("ENOENT: no such file or directory, open '{path}'"),
            );
        }
        _ => codes::INVALID_PARAMS,
    };
    RpcError::new(code, e.to_string())
}

impl SessionState {
    /// The workspace handle, or why there is none.
    fn workspace(&self) -> Result<Arc<crate::workspace_fs::WorkspaceFs>, FsError> {
        self.workspace.clone()
    }

    pub(super) async fn fs_read_requested(&mut self, id: RpcId, params: &Value) {
        let (path, line, limit) = match acp::parse_fs_read(params) {
            Ok(v) => v,
            Err(e) => return self.respond(id, Err(RpcError::new(codes::INVALID_PARAMS, e))),
        };
        let path = path.display().to_string();
        if self.paused {
            // A paused agent is not working for anyone: what it asks is
            // refused, reads too (a probe's agent read on while paused).
            self.warn_agent(|| format!("refused a read while paused: {path}"));
            let refusal = RpcError::new(codes::REQUEST_CANCELLED, super::inbound::PAUSED_REFUSAL);
            self.respond(id, Err(refusal));
            self.tell_refusal_once(super::inbound::PAUSED_NOTE).await;
            return;
        }
        let (ws, slot) = match self
            .workspace()
            .and_then(|ws| Ok((ws, self.fs_slot("read", &path)?)))
        {
            Ok(v) => v,
            Err(e) => return self.fs_read_done(id, path, Err(e)).await,
        };
        let max = self.settings.limits.max_read_bytes;
        let me = self.myself.clone();
        tokio::spawn(async move {
            let p = path.clone();
            let result = on_blocking_pool(ws, "read", &path, move |ws| {
                let _slot = slot;
                ws.read(&p, line, limit, max)
            })
            .await;
            // A session that ended meanwhile has nobody left to answer.
            let _ = me.send_message(super::SessionMsg::FileRead { id, path, result });
        });
    }

    /// One of the session's [`OPS_IN_FLIGHT`] permits for a file operation,
    /// or why not: the agent waits for the answers to the ones running.
    fn fs_slot(
        &self,
        action: &'static str,
        path: &str,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, FsError> {
        self.fs_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| FsError::Busy {
                action,
                path: path.to_owned(),
                why: format!(
                    "{OPS_IN_FLIGHT} file operations of this session are still running (one that timed out runs until its deadline)"
                ),
            })
    }

    /// A read finished (off the actor, or refused at once): answer the agent.
    pub(super) async fn fs_read_done(
        &mut self,
        id: RpcId,
        path: String,
        result: Result<String, FsError>,
    ) {
        match result {
            Ok(content) => self.respond(id, Ok(acp::fs_read_result(content))),
            Err(e) => {
                self.refused("fs/read_text_file", &path, &e).await;
                self.respond(id, Err(rpc_error(&e)));
            }
        }
    }

    pub(super) async fn fs_write_requested(&mut self, id: RpcId, params: &Value) {
        let (path, content) = match acp::parse_fs_write(params) {
            Ok(v) => v,
            Err(e) => return self.respond(id, Err(RpcError::new(codes::INVALID_PARAMS, e))),
        };
        let path = path.display().to_string();
        if let Some(why) = self.not_working_for_anyone() {
            return self.write_refused(id, &path, why).await;
        }
        let checked = match self
            .workspace()
            .and_then(|ws| Ok((ws, self.fs_slot("write", &path)?)))
        {
            Ok((ws, slot)) => {
                let p = path.clone();
                on_blocking_pool(ws, "write", &path, move |ws| {
                    let _slot = slot;
                    ws.write_preview(&p, DIFF_BASE_MAX)
                })
                .await
            }
            Err(e) => Err(e),
        };
        let (rel, old) = match checked {
            Ok(v) => v,
            Err(e) => {
                self.refused("fs/write_text_file", &path, &e).await;
                return self.respond(id, Err(rpc_error(&e)));
            }
        };
        self.flush_text(true).await;
        let rel = rel.display().to_string();
        let current = old.as_deref().unwrap_or("");
        let root = std::path::PathBuf::from(&self.record.cwd);
        let covering =
            self.toolcalls
                .take_covering(&root, std::path::Path::new(&path), current, &content);
        if let Some(cover) = covering {
            return self.write_covered(id, path, content, &rel, cover).await;
        }
        let diff = acp::unified_diff(&rel, current, &content);
        let opened = self
            .open_request(super::inbound::Opening {
                wire: id,
                from_mcp: false,
                command: None,
                kind: RequestKind::FileWrite,
                tool_kind: Some("edit".into()),
                title: format!("Write {rel}"),
                diff: Some(diff),
                paths: vec![rel.clone()],
                unlisted: 0,
                options: write_options(),
                write: Some(AskedWrite {
                    path,
                    content,
                    shown: rel,
                }),
            })
            .await;
        if let Ok(n) = opened {
            self.apply_rules(n, Some("edit".into()), None).await;
        }
    }

    /// Writes an approved file, resolving its path again now: only if it
    /// still lands on `shown` (the workspace-relative file approved).
    pub(super) async fn perform_write(
        &mut self,
        path: &str,
        content: &str,
        shown: &str,
    ) -> Result<Value, RpcError> {
        let ws = self.workspace().map_err(|e| rpc_error(&e))?;
        let slot = self.fs_slot("write", path).map_err(|e| rpc_error(&e))?;
        let (p, c, at) = (
            path.to_owned(),
            content.to_owned(),
            std::path::PathBuf::from(shown),
        );
        let write = move |ws: &crate::workspace_fs::WorkspaceFs| {
            let _slot = slot;
            ws.write_at(&p, &c, &at)
        };
        match approved_on_blocking_pool(ws, path, write).await {
            // ACP's `WriteTextFileResponse` is an object (`{}`); a strict
            // agent's decoder refuses `null`.
            Ok(()) => Ok(Value::Object(serde_json::Map::new())),
            Err(e) => {
                self.refused("fs/write_text_file", path, &e).await;
                Err(rpc_error(&e))
            }
        }
    }

    /// Logs a refused file operation; containment violations are also
    /// audited and shown to the operator.
    ///
    /// The agent decides how many refusals there are and how long the path
    /// is: the operator sees the first [`noise`](super::noise) allows per
    /// window (the next one says how many were left out), each with its
    /// path and reason cut to [`SHOWN_PATH_BYTES`].
    /// Why the agent is not working for anyone now (paused, stopping), so
    /// a write it asks for is not done even when an approval covered it:
    /// a probe's write, approved just before Stop, landed 3 s after it.
    pub(super) fn not_working_for_anyone(&self) -> Option<NotWorking> {
        if matches!(self.phase, super::Phase::Stopping | super::Phase::Ended) {
            Some(NotWorking {
                why: "the session is stopping",
                after: "the session began to stop",
            })
        } else if self.paused {
            Some(NotWorking {
                why: "the session is paused",
                after: "the session was paused",
            })
        } else {
            None
        }
    }

    /// Answers a write refused because of `why` (ACP: its turn was
    /// cancelled) and tells the operator which file was not written, in the
    /// audit log and a notice (bounded like other refusals): an approved
    /// request read "decided" while its file never changed.
    async fn write_refused(&mut self, id: RpcId, path: &str, not: NotWorking) {
        let why = not.why;
        self.warn_agent(|| format!("fs/write_text_file refused: {why}"));
        self.respond(
            id,
            super::requests::acp_cancelled(
                RequestKind::FileWrite,
                format!("write cancelled: {why}"),
            ),
        );
        if let Verdict::Log { left_out } = self.refusals.admit(Instant::now()) {
            // As requests show paths: from the workspace's top.
            let relative = std::path::Path::new(path)
                .strip_prefix(&self.record.cwd)
                .map_or_else(|_| path.to_owned(), |p| p.display().to_string());
            let shown = crate::text::shorten(&relative, SHOWN_PATH_BYTES);
            let detail = json!({"method": "fs/write_text_file", "path": shown, "reason": why, "refusals_left_out": left_out});
            self.audit("system", "fs.refused", detail).await;
            let text = format!(
                "The agent asked to write {shown} after {}; it was not written (nothing is written while a session is paused or stopping, approved or not).",
                not.after
            );
            self.emit_notice(NoticeLevel::Warning, &text).await;
        }
    }

    async fn refused(&mut self, method: &str, path: &str, e: &FsError) {
        let reason = crate::text::shorten(&e.to_string(), SHOWN_PATH_BYTES);
        self.warn_agent(|| format!("{method} refused: {reason}"));
        if !e.is_containment() {
            return;
        }
        let left_out = match self.refusals.admit(Instant::now()) {
            Verdict::Suppress => return,
            Verdict::Log { left_out } => left_out,
        };
        let mut detail = json!({
            "method": method,
            "path": crate::text::shorten(path, SHOWN_PATH_BYTES),
            "reason": reason,
        });
        let mut text =
            format!("The agent tried {method} on a path it may not use and was refused: {reason}");
        if left_out > 0 {
            detail["refusals_left_out"] = json!(left_out);
            text.push_str(&format!(" ({left_out} more refusals were not shown)"));
        }
        self.audit("system", "fs.refused", detail).await;
        self.emit_notice(NoticeLevel::Warning, &text).await;
    }
}

/// Why a session's agent is not working for anyone: what the agent is
/// told, and what the operator reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct NotWorking {
    why: &'static str,
    after: &'static str,
}

/// At most this many of one session's file operations run at once. Agents
/// wait for each read's answer (Claude Code and Gemini CLI read one file at
/// a time); a hostile one sending reads without waiting gets an error for
/// each past this instead of a blocking thread.
pub(super) const OPS_IN_FLIGHT: usize = 8;

/// The longest path (or refusal reason, which names it) shown to the
/// operator for a refused file call, in bytes.
const SHOWN_PATH_BYTES: usize = 512;

fn write_options() -> Vec<PermissionOption> {
    vec![
        PermissionOption {
            id: "write".into(),
            name: "Write file".into(),
            kind: OptionKind::AllowOnce,
        },
        PermissionOption {
            id: "reject".into(),
            name: "Reject".into(),
            kind: OptionKind::RejectOnce,
        },
    ]
}
