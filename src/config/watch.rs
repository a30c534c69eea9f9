//! Hot reload: watch `config.toml` and hand every new version to a callback.
//!
//! Why this exists: operators change routing and approval rules without a
//! restart. [`watch`] watches the config file's DIRECTORY (editors often save
//! by writing a temporary file and renaming it over the original, which a
//! watch on the file itself would lose), keeps only events that name the
//! config file (create, modify, rename, remove; access events are ignored),
//! debounces them with notify-debouncer-full, lets a burst settle, waits
//! until the file has gone unchanged for [`QUIET`] (a file still being
//! written is not read), then loads, resolves and validates the WHOLE file
//! and calls `on_reload` once with the result. The consumer applies an `Ok` atomically (one registry
//! `Reload`, one rule-set swap) and on `Err` keeps what it had and reports
//! the error (the server's `App` keeps it for `/healthz`).
//!
//! Threads: notify's watcher thread, the debouncer's thread, and one reload
//! thread owned by the [`WatchHandle`] on which `on_reload` runs (a plain
//! std thread: blocking, or `tokio::runtime::Handle::block_on`, is fine
//! there).
//!
//! A config file reached through symbolic links (a link to a file kept
//! elsewhere, or Kubernetes' ConfigMap layout, `config.toml ->
//! ..data/config.toml` with `..data` a link swapped to a new directory) is
//! watched along the whole chain: every link met while resolving the path
//! and the file it resolves to, each in its own directory ([`chain`]). The
//! chain is resolved again after each reload, so a link pointed elsewhere
//! is followed. The directory holding each watched directory is watched
//! too, so a directory deleted and made again, or swapped by a rename, is
//! watched afresh (its old watch went with it). A probe's edits to a
//! linked file were never seen while `/healthz` said the config was fine.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use notify::event::{EventKind, MetadataKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};

use super::{Config, ConfigError, paths};

/// How long the debouncer waits for a file's events to stop.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// After a debounced batch, further batches within this are merged into the
/// same reload (a slow save can straddle two debouncer ticks).
const SETTLE: Duration = Duration::from_millis(100);

/// How long the file must have gone unchanged before it is read.
pub const QUIET: Duration = Duration::from_secs(2);

/// How long ago the file at `path` last changed (`QUIET` or more when that
/// cannot be told: a missing file, a time in the future).
fn age(path: &Path) -> Duration {
    // A file that is gone (or dated in the future) has nothing to wait
    // for: it is read now, and its error reported. Taken as exactly
    // `QUIET` old, the wait below was zero, for ever: a deleted config
    // spun the watch thread at full speed and was never reported.
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .unwrap_or(Duration::MAX)
}

/// Why the watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The path names no file (e.g. `/` or `..`).
    #[error("cannot watch {}: it does not name a file", .path.display())]
    NoFileName {
        /// The path given.
        path: PathBuf,
    },
    /// The OS watch could not be set up.
    #[error(
        "cannot watch directory {} of the config file: {source}; check that it exists and, on Linux, that fs.inotify.max_user_watches / max_user_instances are not exhausted",
        .dir.display()
    )]
    Notify {
        /// The directory.
        dir: PathBuf,
        /// notify's error.
        source: notify::Error,
    },
    /// The reload thread could not be started.
    #[error("cannot start the config reload thread: {source}")]
    Thread {
        /// The OS error.
        source: std::io::Error,
    },
}

type Watcher = Debouncer<RecommendedWatcher, RecommendedCache>;

/// The debouncer, shared by the handle (which stops it) and the reload
/// thread (which watches the directories of a changed link chain).
type SharedWatcher = Arc<Mutex<Option<Watcher>>>;

/// The paths whose change changes what the config path reads ([`chain`]),
/// read by the event handler and renewed by the reload thread.
type Watched = Arc<RwLock<Vec<PathBuf>>>;

/// A running watch. Dropping it stops watching (without waiting); call
/// [`WatchHandle::stop`] to wait until no callback can run any more.
pub struct WatchHandle {
    path: PathBuf,
    debouncer: SharedWatcher,
    worker: Option<JoinHandle<()>>,
    stopped: Arc<AtomicBool>,
}

impl fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchHandle")
            .field("path", &self.path)
            .field("stopped", &self.stopped.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl WatchHandle {
    /// The watched config file (absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops watching and waits for the threads to end; no callback runs
    /// after this returns (unless called from inside the callback itself,
    /// where it cannot wait for its own thread).
    pub fn stop(mut self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(debouncer) = take(&self.debouncer) {
            // Joins the debouncer thread, which drops the reload channel's sender.
            debouncer.stop();
        }
        if let Some(worker) = self.worker.take()
            && worker.thread().id() != std::thread::current().id()
            && worker.join().is_err()
        {
            tracing::error!("config reload thread panicked");
        }
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(debouncer) = take(&self.debouncer) {
            debouncer.stop_nonblocking();
        }
    }
}

/// What the consumer of a read config asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Done with this version of the file: wait for the next change.
    Done,
    /// Read the file again once it has gone unchanged for this long (a
    /// change that could be a save caught half-way; see
    /// [`super::CONFIRM_QUIET`]). A change meanwhile restarts the wait.
    ReadAgainOnceQuietFor(Duration),
}

/// Watches the config file at `path` and calls `on_reload` with the freshly
/// loaded and validated [`Config`] (or why it is not valid) once per settled
/// burst of changes to it ([`Config::reload`], which refuses an emptied
/// file). Nothing is loaded at start: load the first version with
/// [`Config::load`].
///
/// `on_reload` is also given how long the file had gone unchanged when it
/// was read, and may ask for it to be read again once it has gone
/// unchanged for longer ([`Next::ReadAgainOnceQuietFor`]).
pub fn watch(
    path: PathBuf,
    on_reload: impl Fn(Result<Config, ConfigError>, Duration) -> Next + Send + 'static,
) -> Result<WatchHandle, WatchError> {
    let path = paths::absolutize(&path);
    if path.file_name().is_none() {
        return Err(WatchError::NoFileName { path });
    }
    let watched: Watched = Arc::new(RwLock::new(chain(&path)));
    let debouncer: SharedWatcher = Arc::new(Mutex::new(None));

    // `true` when a watched directory itself was replaced: watch it again.
    let (tx, rx) = mpsc::channel::<bool>();
    let stopped = Arc::new(AtomicBool::new(false));

    let worker = {
        let reload = Reloader {
            path: path.clone(),
            watched: Arc::clone(&watched),
            debouncer: Arc::clone(&debouncer),
        };
        let stopped = Arc::clone(&stopped);
        std::thread::Builder::new()
            .name("config-reload".into())
            .spawn(move || reload_loop(&reload, &rx, &stopped, &on_reload))
            .map_err(|source| WatchError::Thread { source })?
    };

    let handler = {
        let watched = Arc::clone(&watched);
        move |result: DebounceEventResult| match result {
            Ok(events) => {
                let paths = watched.read().unwrap_or_else(PoisonError::into_inner);
                let dirs: Vec<PathBuf> = dirs(&paths).into_iter().collect();
                let replaced = events.iter().any(|e| concerns(e, &dirs));
                if replaced || events.iter().any(|e| concerns(e, &paths)) {
                    let _ = tx.send(replaced);
                }
            }
            Err(errors) => {
                for e in &errors {
                    tracing::warn!("config watch error: {e}");
                }
                // Events may have been lost: re-read the file to be sure.
                let _ = tx.send(true);
            }
        }
    };
    // On error the handler (and with it the sender) is dropped, so the reload
    // thread sees the channel close and ends.
    let mut watcher =
        new_debouncer(DEBOUNCE, None, handler).map_err(|source| WatchError::Notify {
            dir: parent(&path),
            source,
        })?;
    let paths = watched
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for dir in watch_set(&paths) {
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Notify { dir, source })?;
    }
    *debouncer.lock().unwrap_or_else(PoisonError::into_inner) = Some(watcher);
    if paths.len() > 1 {
        tracing::info!(config = %path.display(), through = ?paths, "watching the config file and the links it is reached through");
    } else {
        tracing::info!(config = %path.display(), "watching the config file for changes");
    }
    Ok(WatchHandle {
        path,
        debouncer,
        worker: Some(worker),
        stopped,
    })
}

fn take(debouncer: &SharedWatcher) -> Option<Watcher> {
    debouncer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}

fn parent(path: &Path) -> PathBuf {
    path.parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// The directories `paths` are in.
fn dirs(paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    paths.iter().map(|p| parent(p)).collect()
}

/// The directories to watch for `paths`: each one's own, and the one that
/// holds it, so that a directory deleted and made again, or swapped by a
/// rename, is seen and watched again (a probe's watch went deaf for good).
fn watch_set(paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    let own = dirs(paths);
    let holders: BTreeSet<PathBuf> = own.iter().map(|d| parent(d)).collect();
    own.into_iter().chain(holders).collect()
}

/// Most links followed while resolving the config path (the kernel's
/// `ELOOP` bound).
const MAX_LINKS: usize = 40;

/// Every path whose change changes what `path` reads: `path` itself, each
/// symbolic link met while resolving it, component by component (a link to
/// the file, or a link to a directory on the way, as Kubernetes' `..data`),
/// and the file it resolves to. Each has its own directory watched.
pub fn chain(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    let mut resolved = PathBuf::from("/");
    let mut rest = names(path);
    let mut links = 0;
    while let Some(name) = rest.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let here = resolved.join(&name);
        match std::fs::read_link(&here) {
            Ok(target) if links < MAX_LINKS => {
                links += 1;
                if !out.contains(&here) {
                    out.push(here);
                }
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                let mut next = names(&target);
                next.extend(rest.drain(..));
                rest = next;
            }
            _ => resolved = here,
        }
    }
    if !out.contains(&resolved) {
        out.push(resolved);
    }
    out
}

/// The names along `path` (`..` kept, `.` and the root dropped).
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// What the reload thread needs to follow a changed link chain.
struct Reloader {
    path: PathBuf,
    watched: Watched,
    debouncer: SharedWatcher,
}

impl Reloader {
    /// Resolves the chain again; watches the directories it now needs and
    /// stops watching those it no longer does; with `again`, watches every
    /// one afresh (a watched directory was replaced: its old watch is gone).
    fn follow_links(&self, again: bool) {
        let now = chain(&self.path);
        let before = {
            let mut watched = self.watched.write().unwrap_or_else(PoisonError::into_inner);
            if *watched == now && !again {
                return;
            }
            std::mem::replace(&mut *watched, now.clone())
        };
        let (old, new) = (watch_set(&before), watch_set(&now));
        let mut guard = self
            .debouncer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(watcher) = guard.as_mut() else {
            return;
        };
        for dir in old.difference(&new) {
            let _ = watcher.unwatch(dir);
        }
        for dir in &new {
            if old.contains(dir) && !again {
                continue;
            }
            let _ = watcher.unwatch(dir);
            if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(dir = %dir.display(), "cannot watch a directory the config file is reached through: {e}");
            }
        }
        if before != now {
            tracing::info!(config = %self.path.display(), through = ?now, "the config file is reached through other links now; watching them");
        }
    }
}

/// Whether a (debounced) event is a change to the config file or a link
/// on the way to it (`watched`, from [`chain`]).
fn concerns(event: &notify::Event, watched: &[PathBuf]) -> bool {
    match event.kind {
        // Opening, reading and closing change nothing; a write also produces Modify.
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => event.need_rescan() || event.paths.iter().any(|p| watched.contains(p)),
    }
}

/// The reload thread: waits for a signal, lets the burst settle, loads the
/// file and calls back (a panic in the callback is logged and survived);
/// ends when the sender is gone.
fn reload_loop(
    reload: &Reloader,
    rx: &mpsc::Receiver<bool>,
    stopped: &AtomicBool,
    on_reload: &impl Fn(Result<Config, ConfigError>, Duration) -> Next,
) {
    while let Ok(first) = rx.recv() {
        let mut again = first;
        loop {
            match rx.recv_timeout(SETTLE) {
                Ok(replaced) => again |= replaced,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let mut quiet = QUIET;
        loop {
            if !wait_until_quiet(&reload.path, quiet, rx, &mut again)
                || stopped.load(Ordering::Acquire)
            {
                return;
            }
            reload.follow_links(std::mem::take(&mut again));
            match read_and_call(&reload.path, on_reload) {
                Next::Done => break,
                Next::ReadAgainOnceQuietFor(longer) => quiet = longer,
            }
        }
    }
}

/// Waits until the file at `path` has gone unchanged for `quiet`: a file
/// still being written is not read (a probe appended a rule line by line,
/// and a copy cut before the last deny rule was applied). Events meanwhile
/// are taken (`again` notes a replaced directory); false once the watch is
/// gone.
fn wait_until_quiet(
    path: &Path,
    quiet: Duration,
    rx: &mpsc::Receiver<bool>,
    again: &mut bool,
) -> bool {
    while let Some(wait) = quiet.checked_sub(age(path)).filter(|w| !w.is_zero()) {
        match rx.recv_timeout(wait) {
            Ok(replaced) => *again |= replaced,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
    true
}

/// Loads the file and hands the result to `on_reload` (a panic in it is
/// logged and survived: the watch goes on, and asks nothing more of this
/// version).
fn read_and_call(
    path: &Path,
    on_reload: &impl Fn(Result<Config, ConfigError>, Duration) -> Next,
) -> Next {
    let unchanged_for = age(path);
    let result = Config::reload(path);
    match &result {
        // Read, not yet applied: the consumer may still refuse it (a
        // reload that empties the rules), and "reloaded" before
        // "rejected" read as if both had happened.
        Ok(config) => tracing::debug!(
            config = %path.display(),
            workspaces = config.workspaces.len() + config.discovered.len(),
            rules = config.rules.len(),
            "config file read"
        ),
        Err(e) => tracing::error!(
            config = %path.display(),
            key = e.key().unwrap_or(""),
            "config change rejected, keeping the previous configuration: {e}"
        ),
    }
    // A panicking consumer must not end hot reload for good.
    let call = std::panic::AssertUnwindSafe(|| on_reload(result, unchanged_for));
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        tracing::error!("the config reload callback panicked; still watching");
        Next::Done
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, RenameMode};

    fn event(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        for p in paths {
            e = e.add_path(PathBuf::from(p));
        }
        e
    }

    #[test]
    fn only_changes_to_the_config_file_count() {
        let name = [PathBuf::from("/d/config.toml")];
        let yes = [
            event(
                EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                &["/d/config.toml"],
            ),
            event(EventKind::Create(CreateKind::File), &["/d/config.toml"]),
            event(
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                &["/d/.config.toml.swp", "/d/config.toml"],
            ),
            event(
                EventKind::Remove(notify::event::RemoveKind::File),
                &["/d/config.toml"],
            ),
            event(EventKind::Other, &[]).set_flag(notify::event::Flag::Rescan),
        ];
        for e in &yes {
            assert!(concerns(e, &name), "{e:?}");
        }
        let no = [
            event(EventKind::Access(AccessKind::Read), &["/d/config.toml"]),
            event(
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                &["/d/config.toml"],
            ),
            event(
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                &["/d/config.toml"],
            ),
            event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                &["/d/config.toml"],
            ),
            event(
                EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)),
                &["/d/config.toml"],
            ),
            event(
                EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                &["/d/other.toml"],
            ),
            event(EventKind::Create(CreateKind::File), &["/d/config.toml.bak"]),
        ];
        for e in &no {
            assert!(!concerns(e, &name), "{e:?}");
        }
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        let err = watch(PathBuf::from("/"), |_, _| Next::Done).expect_err("no file name");
        assert!(matches!(err, WatchError::NoFileName { .. }), "{err}");
    }

    #[test]
    fn handle_is_send() {
        fn send<T: Send>() {}
        send::<WatchHandle>();
    }
}
