//! Hot reload of `config.toml` against real files: edits in place, saves by
//! rename, broken files and their fixes, reads that must not reload, and the
//! WorkspaceRegistry actor serving whole maps while reloads land.
//!
//! Positive checks wait up to 10 s for the callback; "nothing happens" checks
//! wait [`QUIET`], which is the only reason these tests take about a second.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agent_intercom::config::{Config, ConfigError, Next, WatchHandle, watch};
use intercom_actors::registry::{RegistryMsg, ResolveError, Target, WorkspaceRegistry};
use ractor::Actor;

/// How long a positive check waits for the callback.
const WAIT: Duration = Duration::from_secs(10);
/// How long a negative check waits for nothing to happen.
const QUIET: Duration = Duration::from_millis(1000);

type Reload = Result<Config, ConfigError>;

/// A config declaring these workspaces (each a directory under the root).
fn config_text(workspaces: &[&str]) -> String {
    let mut text = String::from("[[agent]]\nid = \"a\"\ncommand = \"a\"\n");
    for ws in workspaces {
        text.push_str(&format!("[[workspace]]\nid = \"{ws}\"\npath = \"{ws}\"\n"));
    }
    text
}

/// A temp dir with `config.toml` declaring `workspaces`, and directories for
/// every workspace any test here uses.
fn setup(workspaces: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tmp");
    for ws in ["a1", "a2", "b1", "b2", "web"] {
        fs::create_dir_all(dir.path().join(ws)).expect("mkdir");
    }
    let path = dir.path().join("config.toml");
    fs::write(&path, config_text(workspaces)).expect("write");
    (dir, path)
}

fn start(path: &Path) -> (WatchHandle, mpsc::Receiver<Reload>) {
    let (tx, rx) = mpsc::channel();
    let handle = watch(path.to_path_buf(), move |result, _| {
        let _ = tx.send(result);
        Next::Done
    })
    .expect("watch");
    (handle, rx)
}

fn next(rx: &mpsc::Receiver<Reload>) -> Reload {
    rx.recv_timeout(WAIT)
        .expect("no reload within 10 s after a change")
}

fn assert_quiet(rx: &mpsc::Receiver<Reload>, what: &str) {
    match rx.recv_timeout(QUIET) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        Ok(result) => panic!("{what}: unexpected reload {:?}", result.map(|c| ids(&c))),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: watcher gone"),
    }
}

fn ids(cfg: &Config) -> Vec<String> {
    cfg.workspace_map()
        .workspaces
        .into_iter()
        .map(|w| w.id)
        .collect()
}

#[test]
fn an_edit_in_place_reloads_once_with_the_new_map() {
    let (_dir, path) = setup(&["a1"]);
    let (handle, rx) = start(&path);
    assert!(handle.path().ends_with("config.toml"));
    fs::write(&path, config_text(&["a1", "web"])).expect("edit");
    let cfg = next(&rx).expect("valid");
    assert_eq!(ids(&cfg), ["a1", "web"]);
    assert_eq!(cfg.source.as_deref(), Some(handle.path()));
    assert_quiet(&rx, "one edit, one reload");
}

#[test]
fn a_save_by_rename_reloads() {
    let (dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    let tmp = dir.path().join(".config.toml.swp");
    fs::write(&tmp, config_text(&["b1", "b2"])).expect("write temp");
    fs::rename(&tmp, &path).expect("rename over");
    let cfg = next(&rx).expect("valid");
    assert_eq!(ids(&cfg), ["b1", "b2"]);
    assert_quiet(&rx, "one save, one reload");
}

#[test]
fn a_save_by_delete_and_create_reloads_the_new_file() {
    let (_dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    fs::remove_file(&path).expect("remove");
    fs::write(&path, config_text(&["web"])).expect("create");
    let cfg = next(&rx).expect("the new file, not the missing one");
    assert_eq!(ids(&cfg), ["web"]);
}

/// A config file deleted and not made again is reported (the running
/// configuration goes stale, with the reason), and one made again later is
/// read. A deleted file used to spin the watch thread and go unreported.
#[test]
fn a_deleted_file_is_reported_and_one_made_again_is_read() {
    let (_dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    fs::remove_file(&path).expect("remove");
    let err = next(&rx).expect_err("the file is gone");
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    fs::write(&path, config_text(&["web"])).expect("create");
    assert_eq!(ids(&next(&rx).expect("made again")), ["web"]);
}

/// A config file that is a link to a file kept elsewhere: an edit to that
/// file reloads. A probe's edits were never seen (only the link's own
/// directory was watched) while `/healthz` said the config was fine.
#[test]
fn an_edit_to_the_file_a_link_names_reloads() {
    let (dir, path) = setup(&["a1"]);
    let real = dir.path().join("real");
    fs::create_dir(&real).expect("mkdir");
    fs::rename(&path, real.join("a.toml")).expect("move");
    std::os::unix::fs::symlink(real.join("a.toml"), &path).expect("link");
    let (_handle, rx) = start(&path);
    fs::write(real.join("a.toml"), config_text(&["a1", "web"])).expect("edit");
    assert_eq!(ids(&next(&rx).expect("valid")), ["a1", "web"]);
}

/// Kubernetes mounts a ConfigMap as `config.toml -> ..data/config.toml`,
/// `..data -> <version>`, and updates it by swapping `..data`: the swap
/// reloads, and the new version's directory is watched from then on.
#[test]
fn a_swapped_directory_link_reloads_and_is_followed() {
    let (dir, path) = setup(&["a1"]);
    let d = dir.path();
    for v in ["v1", "v2"] {
        fs::create_dir(d.join(v)).expect("mkdir");
    }
    fs::rename(&path, d.join("v1/config.toml")).expect("move");
    std::os::unix::fs::symlink("v1", d.join("..data")).expect("link");
    std::os::unix::fs::symlink("..data/config.toml", &path).expect("link");
    let (_handle, rx) = start(&path);
    fs::write(d.join("v2/config.toml"), config_text(&["b1"])).expect("write");
    std::os::unix::fs::symlink("v2", d.join("..tmp")).expect("link");
    fs::rename(d.join("..tmp"), d.join("..data")).expect("swap");
    assert_eq!(ids(&next(&rx).expect("valid")), ["b1"]);
    fs::write(d.join("v2/config.toml"), config_text(&["b1", "b2"])).expect("edit");
    assert_eq!(ids(&next(&rx).expect("valid")), ["b1", "b2"]);
    fs::write(d.join("v1/config.toml"), config_text(&["web"])).expect("edit");
    assert_quiet(&rx, "the version no longer linked");
}

/// The config's directory swapped by a rename (or deleted and made again):
/// the new one is read, and watched from then on. A probe's watch went deaf
/// for good: the server kept the old config while `/healthz` said ok.
#[test]
fn a_directory_swapped_under_the_config_is_watched_again() {
    let (dir, _) = setup(&["a1"]);
    let d = dir.path();
    fs::create_dir(d.join("real")).expect("mkdir");
    let path = d.join("real/config.toml");
    fs::write(&path, config_text(&["a1"])).expect("write");
    let (_handle, rx) = start(&path);
    fs::create_dir(d.join("real.new")).expect("mkdir");
    fs::write(d.join("real.new/config.toml"), config_text(&["b1"])).expect("write");
    fs::rename(d.join("real"), d.join("real.old")).expect("move away");
    fs::rename(d.join("real.new"), d.join("real")).expect("swap in");
    // Workspace paths are relative to the config's directory, now real/.
    let ws_ids = |r: Reload| r.map(|c| ids(&c)).unwrap_or_default();
    let mut seen = ws_ids(next(&rx));
    while seen != ["b1"] {
        seen = ws_ids(next(&rx));
    }
    fs::write(&path, config_text(&["b1", "b2"])).expect("edit the new one");
    let mut seen = ws_ids(next(&rx));
    while seen != ["b1", "b2"] {
        seen = ws_ids(next(&rx));
    }
}

/// A file written in two parts a second apart (an `echo >>` per line, a
/// slow copy) is read once it has been quiet, whole: a probe's copy cut
/// before its last deny rule was applied meanwhile. The pause is the
/// writer's, part of the scenario.
#[test]
fn a_file_still_being_written_is_read_once_whole() {
    let (_dir, path) = setup(&["a2"]);
    let (_handle, rx) = start(&path);
    fs::write(&path, config_text(&["a1"])).expect("first part");
    std::thread::sleep(Duration::from_millis(1000));
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    std::io::Write::write_all(&mut f, b"[[workspace]]\nid = \"web\"\npath = \"web\"\n")
        .expect("second part");
    drop(f);
    let cfg = next(&rx).expect("valid");
    assert_eq!(
        ids(&cfg),
        ["a1", "web"],
        "the first reload saw the whole file"
    );
}

#[test]
fn a_broken_file_is_reported_and_a_fix_recovers() {
    let (_dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);

    fs::write(&path, "[[workspace]\nid = ").expect("break");
    let err = next(&rx).expect_err("invalid TOML");
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(shown.contains(&path.display().to_string()), "{shown}");
    assert!(shown.contains("line 1"), "{shown}");

    fs::write(&path, config_text(&["a1"])).expect("fix");
    assert_eq!(ids(&next(&rx).expect("fixed")), ["a1"]);

    fs::write(&path, config_text(&["a1", "a1"])).expect("duplicate id");
    let err = next(&rx).expect_err("duplicate workspace id");
    assert_eq!(err.key(), Some("workspace[1].id"), "{err}");
    assert!(err.to_string().contains("duplicate workspace id"), "{err}");

    fs::write(&path, config_text(&["a1", "a2"])).expect("fix again");
    assert_eq!(ids(&next(&rx).expect("fixed again")), ["a1", "a2"]);
}

/// A save in progress (the file truncated first), or a file emptied by
/// mistake, would load as a config with no workspaces and no rules: a
/// probe saw every rule dropped while the server ran. A reload of an empty
/// file is refused, and the previous configuration stays.
#[test]
fn an_emptied_file_is_refused_and_the_previous_configuration_stays() {
    let (_dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    fs::write(&path, "").expect("truncate");
    let err = next(&rx).expect_err("an empty file is not a config");
    assert!(matches!(err, ConfigError::Empty { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("keeping the previous configuration"),
        "{err}"
    );
    fs::write(&path, "# nothing yet\n\n").expect("comments only");
    assert!(matches!(next(&rx), Err(ConfigError::Empty { .. })));
    fs::write(&path, config_text(&["a1", "web"])).expect("the whole file");
    assert_eq!(ids(&next(&rx).expect("valid")), ["a1", "web"]);
}

/// The file is read as a regular file of at most 1 MiB: a FIFO swapped in
/// for it blocked the reload thread for good, and `/dev/zero` took memory
/// without bound. Both are refused at once, and a fix still reloads.
#[test]
fn a_fifo_or_a_huge_file_is_refused_without_hanging_reload() {
    let (dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    let fifo = dir.path().join("cfg.fifo");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf8")).expect("cstr");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&fifo, &link).expect("symlink");
    fs::rename(&link, &path).expect("swap in the FIFO");
    let err = next(&rx).expect_err("a FIFO is not a config");
    assert!(err.to_string().contains("not a regular file"), "{err}");

    let huge = dir.path().join("huge");
    fs::write(&huge, format!("# {}\n", "x".repeat(2 << 20))).expect("huge");
    fs::rename(&huge, &path).expect("swap in a huge file");
    let err = next(&rx).expect_err("2 MiB is over the limit");
    assert!(err.to_string().contains("byte limit"), "{err}");

    let fixed = dir.path().join("fixed");
    fs::write(&fixed, config_text(&["web"])).expect("fixed");
    fs::rename(&fixed, &path).expect("swap in a good file");
    assert_eq!(ids(&next(&rx).expect("valid")), ["web"]);
}

#[test]
fn reading_the_file_or_touching_other_files_triggers_nothing() {
    let (dir, path) = setup(&["a1"]);
    let (_handle, rx) = start(&path);
    for _ in 0..3 {
        let text = fs::read_to_string(&path).expect("read");
        assert!(text.contains("a1"));
        drop(fs::File::open(&path).expect("open"));
    }
    fs::write(dir.path().join("other.toml"), "x = 1").expect("sibling");
    fs::write(dir.path().join("config.toml.bak"), "x = 1").expect("backup");
    assert_quiet(&rx, "reads and other files");
}

#[test]
fn stopping_the_watch_ends_callbacks() {
    let (_dir, path) = setup(&["a1"]);
    let (handle, rx) = start(&path);
    handle.stop();
    fs::write(&path, config_text(&["web"])).expect("edit");
    match rx.recv_timeout(QUIET) {
        // The callback (and its sender) is gone once stop returns.
        Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("callback still alive after stop"),
        Ok(r) => panic!("reload after stop: {:?}", r.map(|c| ids(&c))),
    }
}

/// Everything a resolve request can observe about the map at one instant.
fn resolve_view(result: &Result<intercom_actors::registry::Resolved, ResolveError>) -> String {
    match result {
        Ok(r) => format!("ok:{}", r.workspace),
        Err(ResolveError::UnknownWorkspace(_, configured)) => format!("unknown:{configured}"),
        Err(e) => format!("error:{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_serves_whole_maps_while_reloads_land() {
    let (_dir, path) = setup(&["a1", "a2"]);
    let initial = Config::load(&path).expect("load");
    let (registry, registry_task) = Actor::spawn(None, WorkspaceRegistry, initial.workspace_map())
        .await
        .expect("spawn registry");

    // The wiring the server does: Ok -> Reload, Err -> stale status.
    let status = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let (events, mut reloaded) = tokio::sync::mpsc::unbounded_channel::<Result<(), String>>();
    let handle = {
        let registry = registry.clone();
        let status = status.clone();
        watch(path.clone(), move |result, _| {
            match result {
                Ok(cfg) => {
                    let _ = registry.cast(RegistryMsg::Reload(Box::new(cfg.workspace_map())));
                    *status.lock().expect("status") = None;
                    let _ = events.send(Ok(()));
                }
                Err(e) => {
                    *status.lock().expect("status") = Some(e.to_string());
                    let _ = events.send(Err(e.to_string()));
                }
            }
            Next::Done
        })
        .expect("watch")
    };

    // A client resolving continuously, recording what it sees.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let registry = registry.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let map = ractor::call!(registry, RegistryMsg::Get).expect("get");
                let ids: Vec<String> = map.workspaces.into_iter().map(|w| w.id).collect();
                seen.insert(format!("map:{}", ids.join(",")));
                for ws in ["a1", "b2"] {
                    let target = Target {
                        workspace: Some(ws.into()),
                        ..Default::default()
                    };
                    let r = ractor::call!(registry, RegistryMsg::Resolve, target).expect("resolve");
                    seen.insert(resolve_view(&r));
                }
                tokio::task::yield_now().await;
            }
            seen
        })
    };

    let wait_reload = async |reloaded: &mut tokio::sync::mpsc::UnboundedReceiver<_>| {
        tokio::time::timeout(WAIT, reloaded.recv())
            .await
            .expect("reload within 10 s")
            .expect("watcher alive")
    };
    let wait_for_map = async |want: &[&str]| {
        let deadline = Instant::now() + WAIT;
        loop {
            let map = ractor::call!(registry, RegistryMsg::Get).expect("get");
            let ids: Vec<&str> = map.workspaces.iter().map(|w| w.id.as_str()).collect();
            if ids == want {
                return map;
            }
            assert!(
                Instant::now() < deadline,
                "map still {ids:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // Alternate between two whole maps while the client keeps resolving.
    for round in 0..3 {
        fs::write(&path, config_text(&["b1", "b2"])).expect("edit");
        assert_eq!(wait_reload(&mut reloaded).await, Ok(()), "round {round}");
        wait_for_map(&["b1", "b2"]).await;
        fs::write(&path, config_text(&["a1", "a2"])).expect("edit back");
        assert_eq!(wait_reload(&mut reloaded).await, Ok(()), "round {round}");
        wait_for_map(&["a1", "a2"]).await;
    }

    // A broken edit keeps the previous map and marks the config stale.
    fs::write(&path, config_text(&["a1", "a1"])).expect("break");
    let err = wait_reload(&mut reloaded).await.expect_err("invalid");
    assert!(err.contains("workspace[1].id"), "{err}");
    assert_eq!(
        status.lock().expect("status").as_deref(),
        Some(err.as_str())
    );
    wait_for_map(&["a1", "a2"]).await;

    // Fixing the file recovers without a restart; a new workspace appears.
    fs::write(&path, config_text(&["a1", "web"])).expect("fix");
    assert_eq!(wait_reload(&mut reloaded).await, Ok(()));
    let map = wait_for_map(&["a1", "web"]).await;
    assert_eq!(*status.lock().expect("status"), None);
    let web = map
        .resolve(&Target {
            workspace: Some("web".into()),
            ..Default::default()
        })
        .expect("resolve web");
    assert_eq!(
        web.cwd,
        path.parent()
            .expect("dir")
            .canonicalize()
            .expect("canon")
            .join("web")
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = client.await.expect("client");
    // Every observation is one whole map: A = {a1, a2}, B = {b1, b2}, or the
    // final {a1, web}; resolve answers agree with one of them.
    let allowed = [
        "map:a1,a2",
        "map:b1,b2",
        "map:a1,web",
        "ok:a1",
        "ok:b2",
        "unknown:a1, a2",
        "unknown:b1, b2",
        "unknown:a1, web",
    ];
    for s in &seen {
        assert!(
            allowed.contains(&s.as_str()),
            "partial or unexpected view {s:?}"
        );
    }
    assert!(
        seen.contains("map:a1,a2") && seen.contains("map:b1,b2"),
        "{seen:?}"
    );

    handle.stop();
    registry.stop(None);
    registry_task.await.expect("registry ends");
}

#[test]
fn a_panicking_callback_does_not_end_the_watch() {
    let (_dir, path) = setup(&["a1"]);
    let (tx, rx) = mpsc::channel();
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let _handle = watch(path.clone(), move |result, _| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = tx.send(result);
        assert!(n > 0, "first callback panics on purpose");
        Next::Done
    })
    .expect("watch");
    fs::write(&path, config_text(&["a2"])).expect("edit");
    assert_eq!(ids(&next(&rx).expect("valid")), ["a2"]);
    fs::write(&path, config_text(&["web"])).expect("edit again");
    assert_eq!(ids(&next(&rx).expect("valid")), ["web"]);
}
