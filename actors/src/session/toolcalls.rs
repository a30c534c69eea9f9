//! Tool calls as the agent announced them, merged update by update, and the
//! edits an operator allowed.
//!
//! ACP's `tool_call_update`, and the `toolCall` inside
//! `session/request_permission`, are partial updates of a tool call announced
//! earlier: Claude Code's permission carries only `toolCallId`, a title and
//! `rawInput`. This module keeps the merged state of every call (kind, title,
//! diffs, locations, rawInput) so that a permission is shown and judged with
//! everything the agent said about it; renders paths relative to the
//! workspace; and remembers the edits an allowed permission announced, so the
//! `fs/write_text_file` carrying exactly those edits out is not asked a second
//! time (ARCHITECTURE.md, "One decision per change"). Everything here is
//! plain data owned by the session actor.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::protocol::acp::{self, AnnouncedEdit, ToolCallView};

/// Tool calls remembered per session; the oldest are forgotten first.
const MAX_CALLS: usize = 1024;
/// What the remembered calls may hold together (titles, edits, raw input,
/// about); past it the oldest are forgotten first. An agent announcing a
/// thousand calls of a megabyte each held a gigabyte per session.
const MAX_CALL_BYTES: usize = 32 << 20;
/// Allowed-but-unused edit sets remembered per session.
const MAX_GRANTS: usize = 256;
/// Files larger than this are not read to show a diff in context.
pub const MAX_PREVIEW_BYTES: usize = 1 << 20;
/// The most a file may grow to by a call's edits; past it the edits are
/// shown as the agent sent them. `replace_all` of `a` by `aa`, thirty times,
/// is a billion times the file: a probe's 2.7 KB message took 48 s and
/// 1.9 GB.
const MAX_EDITED_BYTES: usize = 4 << 20;
/// What rendering one call may read and build in all (files read for
/// context, their edited texts); past it the rest of its files are shown
/// from the agent's own texts. A probe's 256 diff blocks naming 1 MB files
/// read 256 MB and held a runtime worker for 18 s per 21 KB message.
const RENDER_BYTES: usize = 16 << 20;
/// How long rendering one call may spend matching lines in all; past it
/// the rest of its diffs are coarse (correct, computed at once).
const RENDER_TIME: std::time::Duration = std::time::Duration::from_millis(200);
/// The most diff text one call's rendering keeps; past it a file's diff is
/// a note. A request's diff is stored and served whole.
const MAX_SHOWN_DIFF_BYTES: usize = 8 << 20;
/// Diff blocks, and locations, one tool call may announce that are kept
/// and shown; past it the call says how many it left out, and a permission
/// for it names more paths than a request may (`rules::MAX_REQUEST_PATHS`),
/// so it is refused. A probe's one line of 14,000 diff blocks held a session
/// actor for a minute (each file was compared with every other) while the
/// server answered nobody.
pub const MAX_FILES: usize = 256;

/// Reads a file the agent named, for a diff in context: `None` when it does
/// not exist, is refused (outside the workspace, a server file, a symlink
/// out) or is too large. The session passes its workspace handle's reader.
pub type Preview<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// What the agent said about one tool call so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCall {
    /// Title as sent (may name absolute paths).
    pub title: Option<String>,
    /// read / edit / execute / ...
    pub kind: Option<String>,
    /// pending / in_progress / completed / failed.
    pub status: Option<String>,
    /// The announced diffs.
    pub edits: Vec<AnnouncedEdit>,
    /// The announced locations.
    pub locations: Vec<PathBuf>,
    /// The tool's raw input.
    pub raw_input: Option<Value>,
    /// Diff blocks and locations the agent announced past [`MAX_FILES`],
    /// not kept.
    pub unlisted: usize,
    /// About how many bytes this call holds ([`ToolCall::weight`]).
    bytes: usize,
    /// The raw input's size as JSON, measured when it changes (updates
    /// that only move the status do not serialize it again).
    raw_bytes: usize,
}

impl ToolCall {
    fn apply(&mut self, view: &ToolCallView) {
        if view.title.is_some() {
            self.title.clone_from(&view.title);
        }
        if view.kind.is_some() {
            self.kind.clone_from(&view.kind);
        }
        if view.status.is_some() {
            self.status.clone_from(&view.status);
        }
        if let Some(edits) = &view.edits {
            self.edits = edits.iter().take(MAX_FILES).cloned().collect();
        }
        if let Some(locations) = &view.locations {
            self.locations = locations.iter().take(MAX_FILES).cloned().collect();
        }
        if view.edits.is_some() || view.locations.is_some() {
            let over = |n: Option<usize>| n.map_or(0, |n| n.saturating_sub(MAX_FILES));
            self.unlisted = over(view.edits.as_ref().map(Vec::len))
                + over(view.locations.as_ref().map(Vec::len));
        }
        if view.raw_input.is_some() {
            self.raw_input.clone_from(&view.raw_input);
            self.raw_bytes = self.raw_input.as_ref().map_or(0, |r| r.to_string().len());
        }
        self.bytes = self.weight();
    }

    /// About how many bytes the call holds: its texts, and its raw input
    /// as JSON ([`ToolCall::raw_bytes`]).
    fn weight(&self) -> usize {
        let text = |t: &Option<String>| t.as_ref().map_or(0, String::len);
        let edits: usize = self
            .edits
            .iter()
            .map(|e| e.path.as_os_str().len() + text(&e.old_text) + e.new_text.len())
            .sum();
        let locations: usize = self.locations.iter().map(|l| l.as_os_str().len()).sum();
        text(&self.title)
            + text(&self.kind)
            + text(&self.status)
            + edits
            + locations
            + self.raw_bytes
    }

    /// The command of an execute call (from `rawInput`'s command keys, or
    /// the whole `rawInput` when an execute call sends it as a string).
    pub fn command(&self) -> Option<String> {
        acp::command_of(self.raw_input.as_ref()).or_else(|| {
            let text = self.raw_input.as_ref()?.as_str()?;
            (self.kind.as_deref() == Some("execute")).then(|| text.to_owned())
        })
    }

    /// Whether a replacement applies to every occurrence (Claude Code's
    /// `replace_all`); otherwise the first occurrence is replaced.
    fn replace_all(&self) -> bool {
        self.raw_input
            .as_ref()
            .and_then(|r| r.get("replace_all"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// A tool call as the operator sees it: workspace-relative paths, diffs in
/// context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    /// Title with the workspace prefix removed.
    pub title: Option<String>,
    /// Kind.
    pub kind: Option<String>,
    /// One unified diff per file.
    pub diffs: Vec<String>,
    /// Files from diffs and locations, relative when inside the workspace.
    pub paths: Vec<String>,
    /// The command of an execute call.
    pub command: Option<String>,
    /// Files the agent named past [`MAX_FILES`], not listed.
    pub unlisted: usize,
}

/// The edits one allowed permission announced, not yet written.
#[derive(Debug, Clone, PartialEq)]
struct Grant {
    /// Global id of the request whose decision allowed them.
    request: String,
    tool_call_id: String,
    /// Each edit with where it landed when the permission was asked
    /// ([`landing`]).
    edits: Vec<(AnnouncedEdit, PathBuf)>,
    replace_all: bool,
}

/// Where a write to `path` lands, resolved the way the kernel opens it
/// ([`crate::fsjail::resolve`]); `None` when it cannot be resolved or lands
/// outside the workspace. Rules and modes judge that place: a grant compared
/// by text alone let `link/../README.md`, allowed by a rule for `docs/**`
/// because the link leads into `docs/`, cover a write to `README.md`.
fn landing(root: &Path, path: &Path) -> Option<PathBuf> {
    crate::fsjail::landings(root, [path]).pop().flatten()
}

/// A write found to carry out what an allowed permission announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cover {
    /// Global id of the deciding request.
    pub request: String,
    /// The tool call it was about.
    pub tool_call_id: String,
}

/// What was announced to a permission: captured when the operator is asked,
/// so later updates cannot change what an approval covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Announced {
    /// The tool call.
    pub tool_call_id: String,
    /// Its edits at the time of asking.
    pub edits: Vec<AnnouncedEdit>,
    /// Where each edit landed at the time of asking ([`landing`]): what
    /// the operator and the rules judged. A link re-pointed before the
    /// decision changes nothing a grant covers.
    pub lands: Vec<Option<PathBuf>>,
    /// Whether replacements apply to every occurrence.
    pub replace_all: bool,
}

/// Every tool call of a session, and the allowed edits not yet written.
#[derive(Debug, Default)]
pub struct ToolCalls {
    calls: HashMap<String, ToolCall>,
    order: VecDeque<String>,
    grants: VecDeque<Grant>,
    /// What the calls hold together ([`MAX_CALL_BYTES`]).
    bytes: usize,
    /// Calls forgotten since [`ToolCalls::take_forgotten`] was last asked.
    forgotten: Vec<String>,
}

impl ToolCalls {
    /// Merges an update (or a new call, or a permission's `toolCall`) into
    /// the call's state and returns the merged state.
    pub fn update(&mut self, view: &ToolCallView) -> &ToolCall {
        if !self.calls.contains_key(&view.id) {
            if self.order.len() >= MAX_CALLS {
                self.forget_oldest();
            }
            self.order.push_back(view.id.clone());
        }
        let call = self.calls.entry(view.id.clone()).or_default();
        let before = call.bytes;
        call.apply(view);
        self.bytes = self.bytes.saturating_sub(before) + call.bytes;
        while self.bytes > MAX_CALL_BYTES && self.order.front() != Some(&view.id) {
            self.forget_oldest();
        }
        // Never the call just updated: it is not the oldest, or it is alone.
        self.calls.entry(view.id.clone()).or_default()
    }

    /// The merged state of a call still remembered.
    pub fn get(&self, id: &str) -> Option<&ToolCall> {
        self.calls.get(id)
    }

    /// Forgets the oldest call.
    fn forget_oldest(&mut self) {
        if let Some(old) = self.order.pop_front() {
            if let Some(call) = self.calls.remove(&old) {
                self.bytes = self.bytes.saturating_sub(call.bytes);
            }
            self.forgotten.push(old);
        }
    }

    /// The calls forgotten since the last time this was asked (whoever
    /// keeps more about a call, such as its transcript line, can let go).
    pub fn take_forgotten(&mut self) -> Vec<String> {
        std::mem::take(&mut self.forgotten)
    }

    /// What a permission about `call` covers once allowed, with where each
    /// edit lands now in workspace `root` (the time of asking).
    pub fn announced(root: &Path, id: &str, call: &ToolCall) -> Announced {
        Announced {
            tool_call_id: id.to_owned(),
            edits: call.edits.clone(),
            lands: crate::fsjail::landings(root, call.edits.iter().map(|e| e.path.as_path())),
            replace_all: call.replace_all(),
        }
    }

    /// Remembers the edits of an allowed permission with where each landed
    /// when it was asked. An edit that landed nowhere inside covers
    /// nothing: its write is asked for on its own.
    pub fn grant(&mut self, request: &str, announced: Announced) {
        let edits: Vec<(AnnouncedEdit, PathBuf)> = announced
            .edits
            .into_iter()
            .zip(announced.lands)
            .filter_map(|(e, real)| real.map(|real| (e, real)))
            .collect();
        if edits.is_empty() {
            return;
        }
        if self.grants.len() >= MAX_GRANTS {
            self.grants.pop_front();
        }
        self.grants.push_back(Grant {
            request: request.to_owned(),
            tool_call_id: announced.tool_call_id,
            edits,
            replace_all: announced.replace_all,
        });
    }

    /// Forgets every allowed edit (the turn ended or was cancelled).
    pub fn clear_grants(&mut self) {
        self.grants.clear();
    }

    /// If writing `content` to `path` (as the agent named it) is exactly what
    /// an allowed permission announced, for the same name landing where it
    /// landed when allowed (a link re-pointed since then does not match),
    /// consumes that part of the grant and says which decision covers the
    /// write. `current` is the file's content now ("" when it does not
    /// exist).
    pub fn take_covering(
        &mut self,
        root: &Path,
        path: &Path,
        current: &str,
        content: &str,
    ) -> Option<Cover> {
        if self.grants.is_empty() {
            return None;
        }
        let target = normalize(root, path);
        let lands = landing(root, path)?;
        let same = |(e, real): &(AnnouncedEdit, PathBuf)| {
            *real == lands && normalize(root, &e.path) == target
        };
        let found = self.grants.iter().position(|g| {
            let edits: Vec<&AnnouncedEdit> =
                g.edits.iter().filter(|x| same(x)).map(|(e, _)| e).collect();
            !edits.is_empty()
                && apply_edits(current, &edits, g.replace_all).as_deref() == Some(content)
        })?;
        let grant = &mut self.grants[found];
        grant.edits.retain(|x| !same(x));
        let cover = Cover {
            request: grant.request.clone(),
            tool_call_id: grant.tool_call_id.clone(),
        };
        if grant.edits.is_empty() {
            self.grants.remove(found);
        }
        Some(cover)
    }
}

/// Keys of `rawInput` that name a file or directory in the agents this
/// server runs (Claude Code's `file_path`, `notebook_path` and `path`,
/// Gemini CLI's `absolute_path`, `dir_path`, moves' `source` and
/// `destination`).
const RAW_PATH_KEYS: &[&str] = &[
    "file_path",
    "filePath",
    "absolute_path",
    "notebook_path",
    "path",
    "dir_path",
    "source",
    "destination",
    "old_path",
    "new_path",
    "file",
    "files",
    "filename",
    "paths",
    "file_paths",
    "filePaths",
    "target_file",
    "target_path",
    "directory",
    "dir",
];

/// The most paths taken from one `rawInput` (the request's paths are
/// bounded again when rules judge them).
const RAW_PATHS_MAX: usize = 512;

/// Paths a call names only in its `rawInput` (string values of
/// [`RAW_PATH_KEYS`], or strings in a list there): a request is judged by every file it names, so one
/// that puts its path there and not in `locations` is not judged as naming
/// none.
fn raw_paths(call: &ToolCall) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Some(raw) = &call.raw_input {
        collect_raw_paths(raw, RAW_DEPTH, &mut found);
    }
    found.into_iter().map(PathBuf::from).collect()
}

/// How deep into `rawInput` paths are looked for (`{"edits": [{"path":
/// ...}]}` is three levels).
const RAW_DEPTH: usize = 4;

/// Adds the paths named under [`RAW_PATH_KEYS`] in `value` and the objects
/// and lists within it, down to `depth` levels, at most [`RAW_PATHS_MAX`].
fn collect_raw_paths<'a>(value: &'a Value, depth: usize, found: &mut Vec<&'a str>) {
    let Some(depth) = depth.checked_sub(1) else {
        return;
    };
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if RAW_PATH_KEYS.contains(&key.as_str()) {
                    let named: Vec<&str> = match v {
                        Value::String(p) => vec![p.as_str()],
                        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
                        _ => Vec::new(),
                    };
                    let room = RAW_PATHS_MAX.saturating_sub(found.len());
                    found.extend(named.into_iter().filter(|p| !p.is_empty()).take(room));
                }
                collect_raw_paths(v, depth, found);
            }
        }
        Value::Array(items) => {
            for v in items {
                collect_raw_paths(v, depth, found);
            }
        }
        _ => {}
    }
}

/// The files a call names (diffs first, then locations, then what
/// `rawInput` names), as the operator thinks of them. Linear in the number
/// of paths (each is bounded: [`MAX_FILES`], [`RAW_PATHS_MAX`]).
pub fn paths(root: &Path, call: &ToolCall) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let raw = raw_paths(call);
    let named = call
        .edits
        .iter()
        .map(|e| &e.path)
        .chain(&call.locations)
        .chain(&raw);
    // An empty path names no file (it is not the workspace itself).
    for p in named.filter(|p| !p.as_os_str().is_empty()) {
        let rel = relative(root, p);
        if seen.insert(rel.clone()) {
            paths.push(rel);
        }
    }
    paths
}

/// A permission's title with the command it runs in front, in backticks,
/// unless the title already starts its first backticked span with exactly
/// that command. Rules judge the command (`rawInput`), so the operator must
/// see it too: a probe titled a request ``Run `git status` `` while its
/// command was `curl ... | sh`, and only the title was shown. "Remember"
/// takes the first backticked span, which is then the command that runs.
pub fn title_with_command(title: String, command: Option<&str>) -> String {
    let Some(cmd) = command.map(str::trim).filter(|c| !c.is_empty()) else {
        return title;
    };
    // A command with a backtick cannot be one backticked span: it always
    // gets the marked form, which "Remember" reads whole (a probe's
    // ``sh `curl …` `` was remembered as an allow rule for `sh`).
    if !cmd.contains('`') {
        let first_span = title
            .split_once('`')
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(span, _)| span.trim());
        if first_span == Some(cmd) {
            return title;
        }
        if title.trim() == cmd {
            // The title is the command itself: shown as one, nothing repeated.
            return format!("`{cmd}`");
        }
    }
    format!("`{cmd}{COMMAND_TITLE_MARK}{title})")
}

/// What follows the command in a title [`title_with_command`] wrote: the
/// command is everything between the first backtick and the last such mark.
pub const COMMAND_TITLE_MARK: &str = "` (the agent's title: ";

/// What stands for the files a call named past [`MAX_FILES`] in its
/// transcript line.
pub fn unlisted_note(n: usize) -> String {
    format!("({n} more files the agent named, not listed)")
}

/// Renders a merged call for the operator, relative to workspace `root`:
/// one diff per file, the files in the order the agent first named them,
/// within [`RENDER_BYTES`], [`RENDER_TIME`] and [`MAX_SHOWN_DIFF_BYTES`].
pub fn show(root: &Path, call: &ToolCall, preview: Preview<'_>) -> Shown {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut by_file: HashMap<PathBuf, Vec<&AnnouncedEdit>> = HashMap::new();
    for e in &call.edits {
        // `..` stays as written: read as text, `link/../x` shows a file of
        // the workspace where the kernel (and the rules) see one beside the
        // link's target.
        let n = if climbs(&e.path) {
            root.join(&e.path)
        } else {
            normalize(root, &e.path)
        };
        by_file
            .entry(n.clone())
            .or_insert_with(|| {
                files.push(n);
                Vec::new()
            })
            .push(e);
    }
    let mut budget = Budget::new();
    let mut shown_bytes = 0;
    let diffs = files
        .iter()
        .map(|file| {
            let rel = relative(root, file);
            if shown_bytes > MAX_SHOWN_DIFF_BYTES {
                return format!(
                    "(the diff of {rel} is not shown: this call's diffs passed {MAX_SHOWN_DIFF_BYTES} bytes)\n"
                );
            }
            let edits = by_file.get(file).map_or(&[][..], Vec::as_slice);
            let diff = render_diff(file, &rel, edits, call.replace_all(), preview, &mut budget);
            shown_bytes += diff.len();
            diff
        })
        .collect();
    Shown {
        title: call
            .title
            .as_deref()
            .map(|t| relative_title(root, t, call.kind.as_deref())),
        kind: call.kind.clone(),
        diffs,
        paths: paths(root, call),
        command: call.command(),
        unlisted: call.unlisted,
    }
}

/// [`show`], run so that the runtime worker it reads files and matches
/// lines on hands its other tasks to another worker meanwhile
/// (`block_in_place`, on a multi-threaded runtime; plainly elsewhere, as in
/// single-threaded tests). A probe's renders held a worker long enough that
/// `/healthz` waited behind them.
pub fn show_blocking(root: &Path, call: &ToolCall, preview: Preview<'_>) -> Shown {
    // Without edits there is nothing to read or match, and handing the
    // worker's tasks over costs more than the rest (measured on the
    // approval path of `benches/load.rs`).
    let multi = !call.edits.is_empty()
        && tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(|| show(root, call, preview))
    } else {
        show(root, call, preview)
    }
}

/// What is left of one call's rendering: bytes to read and build, and the
/// time to match lines until.
struct Budget {
    bytes: usize,
    until: std::time::Instant,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            bytes: RENDER_BYTES,
            until: std::time::Instant::now() + RENDER_TIME,
        }
    }

    /// Takes `n` bytes; false when they are not left, and then nothing
    /// more is read for this call.
    fn take(&mut self, n: usize) -> bool {
        match self.bytes.checked_sub(n) {
            Some(left) => {
                self.bytes = left;
                true
            }
            None => {
                self.bytes = 0;
                false
            }
        }
    }

    /// Time left to match lines (zero once spent).
    fn time(&self) -> std::time::Duration {
        self.until
            .saturating_duration_since(std::time::Instant::now())
    }
}

/// One file's diff: against the file as it is now when it can be read inside
/// the workspace (fragments shown in context, a "new" file that exists shown
/// as the overwrite it is), otherwise from the agent's own texts.
fn render_diff(
    file: &Path,
    rel: &str,
    edits: &[&AnnouncedEdit],
    replace_all: bool,
    preview: Preview<'_>,
    budget: &mut Budget,
) -> String {
    let current = if budget.bytes > 0 {
        preview(file)
    } else {
        None
    };
    if let Some(current) = &current
        && budget.take(current.len())
        && let Some(after) = apply_edits(current, edits, replace_all)
        && budget.take(after.len())
    {
        return acp::unified_diff_within(rel, current, &after, budget.time());
    }
    edits
        .iter()
        .map(|e| {
            let old = e.old_text.as_deref().unwrap_or("");
            acp::unified_diff_within(rel, old, &e.new_text, budget.time())
        })
        .collect::<Vec<_>>()
        .join("")
}

/// The file's content after the edits, or `None` when a replaced text is not
/// in the file, or when the result would pass [`MAX_EDITED_BYTES`] (the
/// size is worked out before any text is built). A missing or empty
/// `oldText` means the whole new content.
pub fn apply_edits(current: &str, edits: &[&AnnouncedEdit], replace_all: bool) -> Option<String> {
    let mut text = current.to_owned();
    for e in edits {
        text = match e.old_text.as_deref() {
            None | Some("") => e.new_text.clone(),
            Some(old) if text.contains(old) => {
                let times = if replace_all {
                    text.matches(old).count()
                } else {
                    1
                };
                let grown = (text.len() - times * old.len())
                    .checked_add(times.checked_mul(e.new_text.len())?)?;
                if grown > MAX_EDITED_BYTES {
                    return None;
                }
                if replace_all {
                    text.replace(old, &e.new_text)
                } else {
                    text.replacen(old, &e.new_text, 1)
                }
            }
            Some(_) => return None,
        };
        if text.len() > MAX_EDITED_BYTES {
            return None;
        }
    }
    Some(text)
}

/// `path` joined onto `root` when relative, with `.` and `..` resolved
/// lexically (no disk access: the agent's paths are compared as named).
pub fn normalize(root: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    };
    crate::fsjail::normalize(&joined)
}

/// The path as the operator thinks of it: relative to the workspace when
/// it starts there, absolute otherwise. `..` stays as written: resolved
/// by text, `link/../x` would read as a file of the workspace when it
/// lands beside the link's target (rules resolve it as the kernel does).
pub fn relative(root: &Path, path: &Path) -> String {
    if path.to_string_lossy().contains("://") {
        // A URI, not a path: shown (and judged) as written.
        return path.display().to_string();
    }
    let n: PathBuf = if path.is_absolute() {
        path.components().collect()
    } else {
        root.join(path).components().collect()
    };
    match n.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) if !climbs(rel) => rel.display().to_string(),
        _ => n.display().to_string(),
    }
}

/// Whether `path` has a `..` component (its meaning depends on the links
/// before it).
fn climbs(path: &Path) -> bool {
    path.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
}

/// A title with the workspace prefix removed from the paths it names, for
/// calls on files (`read`, `edit`, `delete`, `move`, `search`). Any other
/// title is kept as the agent wrote it: Gemini CLI's shell title is the
/// command itself, and `cd /tmp && rm -f /w/notes.txt` shown as
/// `cd /tmp && rm -f notes.txt` named another file than the one it removes.
pub fn relative_title(root: &Path, title: &str, kind: Option<&str>) -> String {
    let on_files = matches!(kind, Some("read" | "edit" | "delete" | "move" | "search"));
    let prefix = format!("{}/", root.display().to_string().trim_end_matches('/'));
    if !on_files || prefix.len() <= 1 {
        return title.to_owned();
    }
    title.replace(&prefix, "")
}

#[cfg(test)]
mod tests;
