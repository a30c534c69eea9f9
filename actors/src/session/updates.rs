//! What the agent reports: `session/update`s become transcript lines and
//! operator events. Text is gathered into blocks, tool calls into one line
//! each (bounded), plans replace each other; during a flood they are
//! coalesced and written once per tick, never dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::SessionState;
use super::ledger::RowId;
use super::toolcalls;
use crate::model::{MessageKind, Role};
use crate::ports::OperatorEvent;
use crate::protocol::acp::{self, Update};

/// Most entries of a plan kept; the rest are counted in one more entry.
const MAX_PLAN_ENTRIES: usize = 500;

impl SessionState {
    pub(super) async fn on_update(&mut self, params: &Value) {
        match acp::parse_update(params) {
            Ok((_, update)) => self.apply_update(update, params).await,
            Err(e) => self.warn_agent(|| format!("skipping session/update: {e}")),
        }
    }

    /// Whether what the agent streams now is history a `session/load`
    /// replays: during the load, or after its answer while no turn runs.
    pub(super) fn hearing_history(&self) -> bool {
        self.replaying
            || (self.turn.is_none()
                && self
                    .replay_tail_until
                    .is_some_and(|until| Instant::now() < until))
    }

    /// Takes in one update the agent sent (`params`: the raw update, read
    /// for what only it holds: modes and config options).
    pub(super) async fn apply_update(&mut self, update: acp::Update, params: &Value) {
        let history = matches!(
            update,
            Update::AgentText(_)
                | Update::UserText(_)
                | Update::Thought(_)
                | Update::ToolCall(_)
                | Update::ToolCallUpdate(_)
                | Update::Plan(_)
        );
        if self.replaying || (history && self.hearing_history()) {
            // History replayed by session/load is already in our transcript
            // (Gemini CLI replays it after answering: it read as the agent
            // redoing earlier writes). A tool call still enters the table
            // permissions are judged by: a permission naming only its id
            // must see its command and paths (a probe's `rm -rf`, announced
            // in the tail, was otherwise allowed past a deny rule).
            if let Update::ToolCall(view) | Update::ToolCallUpdate(view) = &update {
                self.toolcalls.update(view);
                self.forget_tool_lines();
            }
            self.replayed += 1;
            return;
        }
        match update {
            Update::AgentText(t) => self.on_agent_text(&t).await,
            Update::Thought(t) => self.on_thought(&t).await,
            Update::Usage(usage) => {
                self.usage = Some(usage);
                // Only the latest counts: during a flood it is shown on the
                // next tick, not once per update (each one is an event the
                // journal stores).
                self.usage_unsent = true;
                if !self.flooded() {
                    self.send_usage().await;
                }
            }
            Update::ToolCall(view) | Update::ToolCallUpdate(view) => self.on_tool(view).await,
            Update::Plan(entries) => self.on_plan(entries).await,
            Update::Other(_) => {
                if let Some(update) = params.get("update") {
                    let before = self.agent_options.current_mode.clone();
                    self.agent_options.apply_update(update);
                    self.tell_mode_change(before).await;
                }
            }
            Update::UserText(_) => {}
        }
    }

    /// A chunk of the agent's answer, added to the text block it belongs
    /// to.
    async fn on_agent_text(&mut self, t: &str) {
        if !self.thought.is_empty() {
            self.flush_thought().await;
        }
        // A notice written since this block began ends it: text after it
        // goes below it, not into the block above (a refusal read as said
        // before the pause). A new tool call ends the block itself, before
        // its row (`on_tool`).
        if !self.text.text.is_empty() && self.text.began_at_entry != self.entries_now() {
            self.flush_text(true).await;
        }
        if self.text.text.is_empty() {
            // Read after the flush, which wrote an entry of its own.
            self.text.began_at_entry = self.entries_now();
        }
        self.push_agent_text(t);
    }

    /// How many transcript entries this session has written so far.
    fn entries_now(&self) -> u64 {
        self.entries_written
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A chunk of the agent's thinking, kept within the turn's text cap.
    async fn on_thought(&mut self, t: &str) {
        if !self.text.text.is_empty() {
            // Keep the transcript in the order the agent spoke.
            self.flush_text(true).await;
        }
        let room = self
            .settings
            .limits
            .max_turn_text_bytes
            .saturating_sub(self.thought.len());
        let mut take = t.len().min(room);
        while !t.is_char_boundary(take) {
            take -= 1;
        }
        self.thought.push_str(&t[..take]);
    }

    /// An agent that switches its own mode (to one that asks less, say)
    /// does it in the operator's sight: a notice names the new mode, and
    /// says so when it is not one the agent offered. Not while it floods.
    async fn tell_mode_change(&mut self, before: Option<String>) {
        let now = self.agent_options.current_mode.clone();
        if now == before || self.flooded() {
            return;
        }
        let Some(mode) = now else {
            return;
        };
        // A probe's agent flipped between two modes: 6,786 notices in 8 s.
        if !self.agent_may_write(mode.len()).await {
            return;
        }
        let offered = self.agent_options.modes.iter().any(|m| m.id == mode);
        let text = format!(
            "The agent switched its own mode to `{}`{}.",
            crate::text::log_safe(&mode),
            if offered {
                ""
            } else {
                " (not a mode it offered)"
            }
        );
        self.emit_notice(crate::ports::NoticeLevel::Info, &text)
            .await;
        if let Some(warning) = crate::protocol::agent_options::no_asking_warning(&mode) {
            self.emit_notice(crate::ports::NoticeLevel::Warning, &warning)
                .await;
        }
    }

    /// Lets go of the transcript lines of tool calls the session no
    /// longer remembers (a later update of one starts a new line).
    pub(super) fn forget_tool_lines(&mut self) {
        for id in self.toolcalls.take_forgotten() {
            self.tools.remove(&id);
            self.dirty_tools.remove(&id);
        }
    }

    /// Shows the agent's latest usage, if not shown yet (and the turn's
    /// budget allows).
    async fn send_usage(&mut self) {
        if !std::mem::take(&mut self.usage_unsent) || !self.agent_may_write(USAGE_BYTES).await {
            return;
        }
        if let Some(usage) = self.usage.clone() {
            self.emit(OperatorEvent::Usage {
                session_id: self.id().clone(),
                usage,
            });
        }
    }

    /// Persists and shows what was coalesced during a flood.
    pub(super) async fn flush_coalesced(&mut self) {
        self.send_usage().await;
        for id in std::mem::take(&mut self.dirty_tools) {
            if let Some((row, doc)) = self.tools.get(&id).cloned() {
                let content = doc.to_string();
                if !self.agent_may_write(content.len()).await {
                    continue;
                }
                self.rewrite_tool_line(id, &row, &doc, content);
            }
        }
        if let Some(entries) = self.pending_plan.take() {
            self.write_plan(entries).await;
        }
    }

    async fn on_tool(&mut self, view: acp::ToolCallView) {
        let root = PathBuf::from(&self.record.cwd);
        self.toolcalls.update(&view);
        self.forget_tool_lines();
        // The call just updated is never the one forgotten (`update`).
        let Some(merged) = self.toolcalls.get(&view.id) else {
            return;
        };
        if self.flooded()
            && let Some((row, doc)) = self.tools.get_mut(&view.id)
            && !row.is_none()
        {
            // No diff rendering (file reads) while flooded; the merged state
            // keeps every edit for the permission that may follow.
            let light = acp::ToolCallView {
                edits: None,
                ..view.clone()
            };
            tool_doc(doc, &root, merged, &light, &|_| None);
            keep_small(doc, &mut self.text.tool_bytes);
            self.dirty_tools.insert(view.id);
            return;
        }
        // Taken out and put back: a diff's document is not copied per update.
        let (mut row, mut doc) = self.tools.remove(&view.id).unwrap_or((
            RowId::None,
            json!({"id": view.id, "title": "", "kind": "other", "status": "pending"}),
        ));
        row.refresh();
        let old_status = doc["status"].clone();
        tool_doc(&mut doc, &root, merged, &view, &|p| self.preview(p));
        keep_small(&mut doc, &mut self.text.tool_bytes);
        self.dirty_tools.remove(&view.id);
        let content = doc.to_string();
        if !self.agent_may_write(content.len()).await {
            // Not written: the line (if any) stays the call's, for a later update.
            self.tools.insert(view.id, (row, doc));
            return;
        }
        let new = row.is_none();
        if new && !self.text.text.is_empty() {
            // What the agent said before this call stays above it.
            self.flush_text(true).await;
        }
        if new {
            row = self.queue_append(Role::System, MessageKind::Tool, content);
            if let Some(turn) = self.turn.as_mut()
                && turn.tools.len() < TURN_TOOLS
            {
                turn.tools.push(view.id.clone());
            }
        } else {
            self.queue_update(&row, content);
        }
        let changed = new || old_status != doc["status"] || view.title.is_some();
        let shown = changed.then(|| {
            (
                doc["title"].as_str().unwrap_or_default().to_owned(),
                doc["status"].as_str().unwrap_or_default().to_owned(),
            )
        });
        self.tools.insert(view.id.clone(), (row, doc));
        if let Some((title, status)) = shown {
            self.emit(OperatorEvent::ToolCall {
                session_id: self.id().clone(),
                tool_call_id: view.id,
                title,
                status,
            });
        }
    }

    /// ACP's cancellation: the client that sends `session/cancel` marks
    /// the turn's unfinished tool calls `cancelled` at once (prompt turn,
    /// "Cancellation"), or a cut turn's calls stay `pending` in the
    /// transcript for good. The agent may still report one finished: its
    /// later update is shown as it says.
    pub(super) fn cancel_turn_tools(&mut self) {
        let ids = self
            .turn
            .as_mut()
            .map(|t| std::mem::take(&mut t.tools))
            .unwrap_or_default();
        for id in ids {
            let unfinished = self.tools.get(&id).is_some_and(|(_, doc)| {
                matches!(
                    doc["status"].as_str(),
                    None | Some("pending" | "in_progress")
                )
            });
            // Taken out and put back, as in `on_tool`: not copied.
            let Some((row, mut doc)) = unfinished.then(|| self.tools.remove(&id)).flatten() else {
                continue;
            };
            doc["status"] = json!(CANCELLED);
            let cancelled = acp::ToolCallView {
                id: id.clone(),
                status: Some(CANCELLED.into()),
                ..Default::default()
            };
            self.toolcalls.update(&cancelled);
            self.dirty_tools.remove(&id);
            let content = doc.to_string();
            self.rewrite_tool_line(id.clone(), &row, &doc, content);
            self.tools.insert(id, (row, doc));
        }
        self.forget_tool_lines();
    }

    /// Rewrites a tool call's one transcript line with `doc` (its `content`)
    /// and shows its title and status.
    fn rewrite_tool_line(&self, id: String, row: &RowId, doc: &Value, content: String) {
        self.queue_update(row, content);
        self.emit(OperatorEvent::ToolCall {
            session_id: self.id().clone(),
            tool_call_id: id,
            title: doc["title"].as_str().unwrap_or_default().to_owned(),
            status: doc["status"].as_str().unwrap_or_default().to_owned(),
        });
    }

    pub(super) async fn on_plan(&mut self, entries: Vec<(String, String)>) {
        if self.flooded() && !self.plan_message.is_none() {
            self.pending_plan = Some(entries);
            return;
        }
        self.pending_plan = None;
        self.write_plan(entries).await;
    }

    async fn write_plan(&mut self, mut entries: Vec<(String, String)>) {
        // Bounded and charged before anything is built: a probe's 200
        // heartbeats of 20,000 entries each held the session (and its
        // operator's cancel) for tens of seconds after its budget was spent.
        if entries.len() > MAX_PLAN_ENTRIES {
            let left = entries.len() - MAX_PLAN_ENTRIES;
            entries.truncate(MAX_PLAN_ENTRIES);
            entries.push((
                format!("({left} more entries of this plan were not kept)"),
                "other".to_owned(),
            ));
        }
        let size: usize = entries.iter().map(|(c, s)| c.len() + s.len() + 32).sum();
        if !self.agent_may_write(size).await {
            return;
        }
        let content = json!(
            entries
                .iter()
                .map(|(c, s)| json!({"content": c, "status": s}))
                .collect::<Vec<_>>()
        )
        .to_string();
        self.plan_message.refresh();
        if self.plan_message.is_none() {
            self.plan_message = self.queue_append(Role::System, MessageKind::Plan, content);
        } else {
            self.queue_update(&self.plan_message, content);
        }
        self.emit(OperatorEvent::Plan {
            session_id: self.id().clone(),
            entries,
        });
    }

    /// Stores the agent's aggregated thought and shows it to the operator.
    async fn flush_thought(&mut self) {
        let text = std::mem::take(&mut self.thought);
        if text.trim().is_empty() || !self.agent_may_write(text.len()).await {
            return;
        }
        self.note(Role::Agent, MessageKind::Thought, &text);
        self.emit(OperatorEvent::AgentThought {
            session_id: self.id().clone(),
            text,
        });
    }

    /// Adds agent text to the turn, up to `limits.max_turn_text_bytes`; past
    /// the cap the rest of the turn's text is dropped with a visible note.
    fn push_agent_text(&mut self, chunk: &str) {
        if self.text.truncated {
            return;
        }
        let cap = self.settings.limits.max_turn_text_bytes;
        let room = cap.saturating_sub(self.text.turn_bytes);
        let mut take = chunk.len().min(room);
        while !chunk.is_char_boundary(take) {
            take -= 1;
        }
        self.text.text.push_str(&chunk[..take]);
        self.text.turn_bytes += take;
        if take < chunk.len() {
            self.text.truncated = true;
            self.text.text.push_str(&format!(
                "\n\n[agent-intercom: the rest of this turn's text was dropped; it passed limits.max_turn_text_bytes ({cap} bytes)]"
            ));
            tracing::warn!(session = %self.record.id, cap, "agent text over the per-turn cap; truncated");
        }
        self.text.dirty = true;
    }

    /// Persists aggregated agent text (appending only what is new); `publish`
    /// also tells the operator and starts a new block.
    pub(super) async fn flush_text(&mut self, publish: bool) {
        if publish && !self.thought.is_empty() {
            self.flush_thought().await;
        }
        // Each block is a row and an event: a probe's agent alternated
        // one-byte text with blank thoughts, 15,000 blocks a second, all
        // within the turn's text bytes. Blocks count against the turn.
        if publish
            && !self.text.text.is_empty()
            && !self.agent_may_write(self.text.text.len()).await
        {
            self.text.text.clear();
            self.text.message_id = None;
            self.text.stored = 0;
            self.text.dirty = false;
            return;
        }
        if self.text.dirty && publish {
            // The block is complete: nothing needs its row id any more, so
            // nothing waits for the write either.
            self.queue_text();
            self.text.stored = self.text.text.len();
            self.text.dirty = false;
        }
        if self.text.dirty {
            self.text.flushed_at = Instant::now();
            let store = Arc::clone(&self.store);
            let (id, sid) = (self.text.message_id, self.id().clone());
            let tail = self.text.text[self.text.stored..].to_owned();
            let written = self
                .ledger
                .wait(store_text(store, sid, id, tail))
                .await
                .map(|id| self.text.message_id = Some(id));
            if let Err(e) = &written {
                tracing::warn!(session = %self.record.id, "agent text not stored yet, kept for a retry: {e}");
            }
            let stored = written.is_ok();
            if stored {
                self.text.stored = self.text.text.len();
            }
            // A failed write stays dirty and is retried on the next tick.
            self.text.dirty = !stored;
        }
        if publish && !self.text.text.is_empty() {
            if self.text.dirty {
                // Not stored yet: keep it for the retry, whole, as its own entry.
                self.unstored_text
                    .push((self.text.message_id, self.text.text.clone()));
                self.text.dirty = false;
            }
            let text = std::mem::take(&mut self.text.text);
            self.text.message_id = None;
            self.text.stored = 0;
            self.emit(OperatorEvent::AgentText {
                session_id: self.id().clone(),
                text,
            });
        }
    }

    /// Marks delivered what was delivered while the store refused the
    /// mark (a full disk): left unmarked, a revive after a restart
    /// delivered the first prompt a second time.
    pub(super) async fn retry_delivery_marks(&mut self) {
        let pending = std::mem::take(&mut self.unmarked);
        for steering_id in pending {
            if self
                .store
                .mark_steering_delivered(steering_id)
                .await
                .is_err()
            {
                self.unmarked.push(steering_id);
            }
        }
    }

    /// Retries transcript writes that failed (storage outage): nothing the
    /// agent said is lost once storage works again.
    pub(super) async fn retry_unstored_text(&mut self) {
        let pending = std::mem::take(&mut self.unstored_text);
        for (message_id, text) in pending {
            let ok = match message_id {
                Some(id) => self.store.update_message(id, &text).await.is_ok(),
                None => self
                    .store
                    .append_message(self.id(), Role::Agent, MessageKind::Text, &text)
                    .await
                    .is_ok(),
            };
            if !ok {
                self.unstored_text.push((message_id, text));
            }
        }
    }
}

/// What one usage event counts against the turn's budget (it is stored in
/// the event journal, not the transcript).
const USAGE_BYTES: usize = 64;
/// Tool calls a turn remembers as its own, for a cancel to mark
/// ([`SessionState::cancel_turn_tools`]); past it the rest keep their status.
pub(super) const TURN_TOOLS: usize = 1024;
/// The status a cancelled turn's unfinished tool calls are given.
const CANCELLED: &str = "cancelled";

/// The longest tool call title kept in the transcript, in bytes (the
/// request shows the whole of it).
const TOOL_TITLE_KEPT: usize = 4 * 1024;

/// The most diff text one tool call line keeps in the transcript.
const TOOL_DIFFS_KEPT: usize = 256 * 1024;

/// Bytes of tool call lines one turn writes to the transcript before their
/// diffs stop being kept (twice what one transcript page carries). Without
/// it, an agent sending big tool calls grew the database by about 40 MB a
/// second within one turn.
pub(super) const TOOL_BYTES_PER_TURN: usize = 2 * crate::transcript::MAX_PAGE_BYTES;

/// Bounds a tool call's transcript line: its title cut to
/// [`TOOL_TITLE_KEPT`], its diffs replaced by a note when they are over
/// [`TOOL_DIFFS_KEPT`] or the turn has written [`TOOL_BYTES_PER_TURN`] of
/// tool calls; adds what it keeps to `turn_bytes`. The merged tool call
/// (what a permission is judged and shown by) keeps everything.
fn keep_small(doc: &mut Value, turn_bytes: &mut usize) {
    if let Some(title) = doc["title"].as_str()
        && title.len() > TOOL_TITLE_KEPT
    {
        doc["title"] = json!(crate::text::shorten(title, TOOL_TITLE_KEPT));
    }
    let diff_bytes: usize = doc["diffs"]
        .as_array()
        .map(|d| d.iter().filter_map(Value::as_str).map(str::len).sum())
        .unwrap_or(0);
    // Paths count against the turn too: a probe's calls of 2,000 long
    // locations each wrote 7 MB a second into the transcript.
    let path_bytes: usize = doc["paths"]
        .as_array()
        .map(|p| p.iter().filter_map(Value::as_str).map(str::len).sum())
        .unwrap_or(0);
    if *turn_bytes + diff_bytes + path_bytes > TOOL_BYTES_PER_TURN && path_bytes > 0 {
        let n = doc["paths"].as_array().map_or(0, Vec::len);
        doc["paths"] = json!([format!(
            "({n} paths, not kept in the transcript: this turn's tool calls passed {TOOL_BYTES_PER_TURN} bytes)"
        )]);
    } else {
        *turn_bytes += path_bytes;
    }
    let why = if diff_bytes > TOOL_DIFFS_KEPT {
        Some(format!("over {TOOL_DIFFS_KEPT} bytes"))
    } else if *turn_bytes + diff_bytes > TOOL_BYTES_PER_TURN {
        Some(format!(
            "this turn's tool calls passed {TOOL_BYTES_PER_TURN} bytes"
        ))
    } else {
        None
    };
    let kept = match why {
        Some(why) => {
            let note = format!("(a diff of {diff_bytes} bytes, not kept in the transcript: {why})");
            let len = note.len();
            doc["diffs"] = json!([note]);
            len
        }
        None => diff_bytes,
    };
    *turn_bytes += kept + doc["title"].as_str().map_or(0, str::len);
}

/// Writes a tool call's merged state into its transcript document, paths
/// relative to the workspace; diffs are rendered again only when the update
/// carried content (rendering reads the files).
fn tool_doc(
    doc: &mut Value,
    root: &Path,
    merged: &toolcalls::ToolCall,
    view: &acp::ToolCallView,
    preview: toolcalls::Preview<'_>,
) {
    if let Some(t) = &merged.title {
        doc["title"] = json!(toolcalls::relative_title(root, t, merged.kind.as_deref()));
    }
    if let Some(k) = &merged.kind {
        doc["kind"] = json!(k);
    }
    if let Some(s) = &merged.status {
        doc["status"] = json!(s);
    }
    let mut paths = toolcalls::paths(root, merged);
    if merged.unlisted > 0 {
        paths.push(toolcalls::unlisted_note(merged.unlisted));
    }
    if !paths.is_empty() {
        doc["paths"] = json!(paths);
    }
    if view.edits.is_some() {
        doc["diffs"] = json!(toolcalls::show_blocking(root, merged, preview).diffs);
    }
}

impl SessionState {
    /// Queues the agent's finished text block; if the write fails, the
    /// block comes back as [`super::SessionMsg::TextNotStored`] and is
    /// retried every tick, never lost.
    fn queue_text(&self) {
        let store = Arc::clone(&self.store);
        let (me, sid) = (self.myself.clone(), self.id().clone());
        let (id, whole) = (self.text.message_id, self.text.text.clone());
        let tail = self.text.text[self.text.stored..].to_owned();
        self.ledger.queue(async move {
            if let Err(e) = store_text(store, sid.clone(), id, tail).await {
                tracing::warn!(session = %sid, "agent text not stored yet, kept for a retry: {e}");
                let _ = me.send_message(super::SessionMsg::TextNotStored {
                    message_id: id,
                    text: whole,
                });
            }
        });
    }

    /// Queues a new transcript row; its id follows.
    fn queue_append(&self, role: Role, kind: MessageKind, content: String) -> RowId {
        let (store, sid) = (Arc::clone(&self.store), self.id().clone());
        let (answer, id) = tokio::sync::oneshot::channel();
        self.ledger.queue(async move {
            let appended = store.append_message(&sid, role, kind, &content).await;
            if let Err(e) = &appended {
                tracing::warn!(session = %sid, "transcript write failed: {e}");
            }
            let _ = answer.send(appended.ok());
        });
        RowId::pending(id)
    }

    /// Queues new content for the transcript row `row` (once it exists).
    fn queue_update(&self, row: &RowId, content: String) {
        let (store, sid, id) = (Arc::clone(&self.store), self.id().clone(), row.later());
        // A row still on its way: this write reaches the store only after
        // the append committed, maybe after a write queued behind it that
        // someone waits for, who then waits for this one too. Not chatter
        // then, so the store does not hold it back.
        let late = row.is_on_its_way();
        self.ledger.queue(async move {
            let Some(id) = id.await else { return };
            let update = store.update_message(id, &content);
            let updated = if late {
                crate::ports::awaited(update).await
            } else {
                update.await
            };
            if let Err(e) = updated {
                tracing::warn!(session = %sid, "transcript update failed: {e}");
            }
        });
    }
}

/// Stores the part of a text block not yet stored: appended to its row
/// `id`, or as a new row (`tail` is then the whole block); the row's id.
async fn store_text(
    store: Arc<dyn crate::ports::SessionStore>,
    session: crate::model::SessionId,
    id: Option<i64>,
    tail: String,
) -> Result<i64, crate::ports::StoreError> {
    match id {
        Some(id) => store.append_to_message(id, &tail).await.map(|()| id),
        None => {
            store
                .append_message(&session, Role::Agent, MessageKind::Text, &tail)
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(title_bytes: usize, diff_bytes: usize) -> Value {
        json!({"id": "t1", "title": "t".repeat(title_bytes), "diffs": ["d".repeat(diff_bytes)]})
    }

    #[test]
    fn a_tool_call_line_keeps_a_small_diff_and_cuts_a_huge_title() {
        let mut turn = 0;
        let mut small = doc(100_000, 1_000);
        keep_small(&mut small, &mut turn);
        // Cut, with a note of its length.
        assert!(small["title"].as_str().expect("title").len() <= TOOL_TITLE_KEPT + 40);
        assert_eq!(small["diffs"][0].as_str().expect("diff").len(), 1_000);
        assert!(
            turn > 1_000 && turn < 1_000 + TOOL_TITLE_KEPT + 40,
            "{turn}"
        );
    }

    #[test]
    fn a_huge_diff_or_a_full_turn_leaves_a_note_instead() {
        let mut turn = 0;
        let mut huge = doc(10, TOOL_DIFFS_KEPT + 1);
        keep_small(&mut huge, &mut turn);
        let note = huge["diffs"][0].as_str().expect("note");
        assert!(
            note.contains("not kept in the transcript") && note.contains("over"),
            "{note}"
        );
        assert!(turn < 200, "{turn}");

        // Many diffs under the per-line bound: kept until the turn's budget.
        let mut turn = 0;
        let mut kept = 0;
        for _ in 0..100 {
            let mut d = doc(10, TOOL_DIFFS_KEPT - 1);
            keep_small(&mut d, &mut turn);
            if !d["diffs"][0].as_str().expect("diff").contains("not kept") {
                kept += 1;
            }
        }
        // About budget / line bound of them (the titles count too).
        let fit = TOOL_BYTES_PER_TURN / TOOL_DIFFS_KEPT;
        assert!((fit - 1..=fit).contains(&kept), "{kept} of {fit}");
        assert!(turn < TOOL_BYTES_PER_TURN + 100 * 200, "{turn}");
    }

    /// Paths count against the turn: a probe's tool calls of 2,000 long
    /// locations each wrote 7 MB a second into the transcript, while only
    /// diffs were counted.
    #[test]
    fn paths_count_against_the_turn_and_leave_a_note_past_it() {
        let mut turn = 0;
        let mut noted = 0;
        for _ in 0..100 {
            let mut d = json!({"id": "t1", "title": "t", "paths": vec!["p".repeat(1000); 500]});
            keep_small(&mut d, &mut turn);
            if d["paths"][0].as_str().expect("path").contains("not kept") {
                assert_eq!(d["paths"].as_array().expect("paths").len(), 1);
                noted += 1;
            }
        }
        assert!(noted > 60, "{noted}");
        assert!(turn <= TOOL_BYTES_PER_TURN + 100 * 200, "{turn}");
    }
}
