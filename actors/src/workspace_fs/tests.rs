//! What a hostile agent would try against the workspace file layer.

use std::os::unix::fs::symlink;

use super::*;

const MAX: usize = 1024 * 1024;

struct Fixture {
    _dir: tempfile::TempDir,
    _outside: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tmp");
    let outside = tempfile::tempdir().expect("tmp2");
    let root = dir.path().canonicalize().expect("canon");
    let outside_path = outside.path().canonicalize().expect("canon");
    Fixture {
        _dir: dir,
        _outside: outside,
        root,
        outside: outside_path,
    }
}

fn open(f: &Fixture, guard: ServerFiles) -> WorkspaceFs {
    WorkspaceFs::open(&f.root, guard).expect("open workspace")
}

#[test]
fn reads_and_writes_inside_work_with_relative_and_absolute_paths() {
    let f = fixture();
    let ws = open(&f, ServerFiles::default());
    ws.write("src/new.rs", "fn main() {}\n").expect("write");
    assert_eq!(
        std::fs::read_to_string(f.root.join("src/new.rs")).expect("read back"),
        "fn main() {}\n"
    );
    let abs = f.root.join("src/new.rs");
    assert_eq!(
        ws.read(abs.to_str().expect("utf8"), None, None, MAX),
        Ok("fn main() {}\n".into())
    );
    assert_eq!(
        ws.read("src/../src/new.rs", None, None, MAX)
            .map(|s| s.len()),
        Ok(13)
    );
}

#[test]
fn a_path_ending_in_a_slash_names_no_file() {
    let f = fixture();
    let ws = open(&f, ServerFiles::default());
    ws.write("inside.txt", "x").expect("write");
    for path in ["inside.txt/", "inside.txt/.", "src/new.rs/"] {
        assert!(
            matches!(ws.read(path, None, None, MAX), Err(FsError::Invalid { .. })),
            "read {path}"
        );
        assert!(
            matches!(ws.write(path, "y"), Err(FsError::Invalid { .. })),
            "write {path}"
        );
    }
    assert!(!f.root.join("src/new.rs").exists());
    assert_eq!(
        std::fs::read_to_string(f.root.join("inside.txt")).expect("read back"),
        "x"
    );
}

/// A control character in a path forges a diff's headers: a probe's
/// `x.sh\n--- a/CHANGELOG.md\n+++ b/CHANGELOG.md` was shown as a change to
/// CHANGELOG.md while it wrote a new file with that name.
#[test]
fn a_path_with_a_control_character_is_refused() {
    let f = fixture();
    let ws = open(&f, ServerFiles::default());
    for path in [
        "x.sh\n--- a/CHANGELOG.md\n+++ b/CHANGELOG.md",
        "a\rb",
        "tab\there",
        "esc\u{1b}[31m",
        "x\u{2028}+++ b/evil.sh",
    ] {
        let refused = ws.write(path, "y");
        assert!(
            matches!(&refused, Err(FsError::Invalid { why, .. }) if why.contains("control character")),
            "write {path:?}: {refused:?}"
        );
        assert!(
            matches!(ws.read(path, None, None, MAX), Err(FsError::Invalid { .. })),
            "read {path:?}"
        );
    }
    for e in std::fs::read_dir(&f.root).expect("list").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.chars().any(char::is_control), "{name:?} was written");
    }
}

#[test]
fn escapes_are_refused_for_reads_and_writes() {
    let f = fixture();
    std::fs::write(f.outside.join("secret"), "s3cret").expect("secret");
    symlink(&f.outside, f.root.join("link")).expect("symlink dir");
    symlink(f.outside.join("secret"), f.root.join("secret-link")).expect("symlink file");
    symlink("../../../../../../etc/passwd", f.root.join("rel-link")).expect("rel link");
    let ws = open(&f, ServerFiles::default());
    for bad in [
        "../x",
        "/etc/passwd",
        "link/secret",
        "secret-link",
        "rel-link",
        "a/../../x",
    ] {
        let read = ws.read(bad, None, None, MAX);
        assert!(
            matches!(read, Err(FsError::Outside { .. })),
            "read {bad}: {read:?}"
        );
        let write = ws.write(bad, "pwned");
        assert!(write.is_err(), "write {bad} was allowed");
    }
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret")).expect("secret"),
        "s3cret"
    );
    assert!(!f.outside.join("x").exists());
}

#[test]
fn a_dangling_symlink_leading_out_is_never_written_through() {
    let f = fixture();
    let target = f.outside.join("planted.txt");
    symlink(&target, f.root.join("link.txt")).expect("dangling symlink");
    let ws = open(&f, ServerFiles::default());
    assert!(matches!(
        ws.check_write("link.txt"),
        Err(FsError::Symlink { .. })
    ));
    assert!(ws.write("link.txt", "pwned").is_err());
    assert!(!target.exists(), "a file appeared outside the workspace");
    // A dangling link as a parent directory is refused too.
    symlink(f.outside.join("nodir"), f.root.join("dirlink")).expect("dangling dir link");
    assert!(ws.write("dirlink/x.txt", "pwned").is_err());
    assert!(!f.outside.join("nodir").exists());
}

#[test]
fn a_target_swapped_for_a_symlink_after_the_check_is_not_followed() {
    let f = fixture();
    let ws = open(&f, ServerFiles::default());
    std::fs::write(f.root.join("a.txt"), "old").expect("seed");
    ws.check_write("a.txt").expect("checked while harmless");
    // The attacker swaps the file for a link out between approval and write.
    std::fs::remove_file(f.root.join("a.txt")).expect("rm");
    symlink(f.outside.join("victim"), f.root.join("a.txt")).expect("swap");
    assert!(matches!(
        ws.write("a.txt", "new"),
        Err(FsError::Symlink { .. })
    ));
    assert!(!f.outside.join("victim").exists());
}

#[test]
fn a_workspace_directory_swapped_for_a_symlink_stays_the_opened_one() {
    let f = fixture();
    std::fs::create_dir(f.root.join("sub")).expect("mkdir");
    let ws = WorkspaceFs::open(&f.root.join("sub"), ServerFiles::default()).expect("open");
    std::fs::rename(f.root.join("sub"), f.root.join("sub-moved")).expect("mv");
    symlink(&f.outside, f.root.join("sub")).expect("swap");
    ws.write("x.txt", "data")
        .expect("write goes to the opened directory");
    assert!(f.root.join("sub-moved/x.txt").exists());
    assert!(!f.outside.join("x.txt").exists());
}

#[test]
fn fifos_sockets_and_directories_are_refused_at_once() {
    let f = fixture();
    let fifo = f.root.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf8")).expect("cstr");
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(f.root.join("sock")).expect("socket");
    std::fs::create_dir(f.root.join("d")).expect("dir");
    let ws = open(&f, ServerFiles::default());
    for (p, what) in [("pipe", "FIFO"), ("sock", "socket"), ("d", "directory")] {
        // Both the pre-check and the descriptor check name the kind.
        match ws.read(p, None, None, MAX) {
            Err(FsError::NotRegular { what: w, .. }) => assert!(w.contains(what), "{p}: {w}"),
            other => panic!("{p}: {other:?}"),
        }
    }
    assert!(matches!(
        ws.write("pipe", "x"),
        Err(FsError::NotRegular { .. })
    ));
    assert!(matches!(
        ws.read("/dev/zero", None, None, MAX),
        Err(FsError::Outside { .. })
    ));
}

#[test]
fn reads_honour_line_and_limit_and_the_size_cap() {
    let f = fixture();
    std::fs::write(f.root.join("f.txt"), "a\nb\nc\nd\n").expect("seed");
    let ws = open(&f, ServerFiles::default());
    assert_eq!(ws.read("f.txt", Some(2), Some(2), MAX), Ok("b\nc\n".into()));
    assert_eq!(ws.read("f.txt", Some(9), None, MAX), Ok(String::new()));
    assert_eq!(ws.read("f.txt", None, Some(0), MAX), Ok(String::new()));
    assert!(matches!(
        ws.read("f.txt", None, None, 4),
        Err(FsError::TooLarge { max: 4, .. })
    ));
    // One huge line: even a one-line read is capped.
    std::fs::write(f.root.join("big.txt"), "x".repeat(64 * 1024)).expect("big");
    assert!(matches!(
        ws.read("big.txt", Some(1), Some(1), 1024),
        Err(FsError::TooLarge { .. })
    ));
}

#[test]
fn a_few_lines_of_a_huge_file_read_only_what_is_needed() {
    // A reader that counts bytes handed out: 5 lines must not pull 64 MiB.
    struct Counting<'a>(
        &'a mut usize,
        std::iter::Cycle<std::slice::Iter<'static, u8>>,
    );
    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if *self.0 >= 64 << 20 {
                return Ok(0);
            }
            for b in buf.iter_mut() {
                *b = *self.1.next().unwrap_or(&b'\n');
            }
            *self.0 += buf.len();
            Ok(buf.len())
        }
    }
    let mut pulled = 0usize;
    let text = read_range(
        Counting(&mut pulled, b"line of text\n".iter().cycle()),
        Some(1),
        Some(5),
        MAX,
    )
    .ok()
    .expect("read");
    assert_eq!(String::from_utf8_lossy(&text).lines().count(), 5);
    assert!(pulled <= 128 * 1024, "pulled {pulled} bytes for 5 lines");
}

#[test]
fn reaching_a_line_scans_a_bounded_amount_of_a_file_without_newlines() {
    // An endless file of zeros (a hostile agent's `truncate -s 1T`): the
    // scan for line 2 stops at its bound instead of running for good.
    struct Zeros<'a>(&'a mut u64);
    impl Read for Zeros<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            *self.0 += buf.len() as u64;
            Ok(buf.len())
        }
    }
    let mut pulled = 0u64;
    let scan = 4 << 20;
    let r = read_range_within(Zeros(&mut pulled), Some(2), Some(1), MAX, scan);
    assert!(matches!(r, Err(RangeError::LineTooFar)));
    assert!(pulled <= scan + (64 << 10), "scanned {pulled} bytes");

    // Through the workspace, with the real bound, on a sparse file.
    let f = fixture();
    let sparse = std::fs::File::create(f.root.join("sparse.bin")).expect("sparse");
    sparse
        .set_len(1 << 30)
        .expect("a 1 GiB sparse file (past the scan bound)");
    let ws = open(&f, ServerFiles::default());
    match ws.read("sparse.bin", Some(2), Some(1), MAX) {
        Err(e @ FsError::LineTooFar { line: 2, .. }) => {
            assert!(e.to_string().contains("line 2 of sparse.bin"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

/// A scan past its operation's deadline stops there (its caller was
/// answered "timed out"): a probe's abandoned scans of a sparse file kept
/// blocking threads busy until the pool was full.
#[test]
fn a_scan_stops_at_its_deadline() {
    struct Zeros;
    impl Read for Zeros {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
    }
    pool::set_deadline(Some(std::time::Instant::now()));
    let r = read_range_within(Zeros, Some(2), Some(1), MAX, u64::MAX);
    pool::set_deadline(None);
    assert!(matches!(r, Err(RangeError::TimedOut)));
}

#[test]
fn a_held_file_stays_refused_after_it_is_renamed() {
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    std::fs::write(f.root.join("serve.out"), "token: s3cret\n").expect("output");
    let m = std::fs::metadata(f.root.join("serve.out")).expect("meta");
    let files = ServerFiles::new(Vec::new(), Vec::new()).holding([(m.dev(), m.ino())]);
    std::fs::rename(f.root.join("serve.out"), f.root.join("rotated.log")).expect("rotate");
    assert!(files.covers(&f.root.join("rotated.log")));
    let ws = open(&f, files);
    assert!(matches!(
        ws.read("rotated.log", None, None, MAX),
        Err(FsError::ServerFile { .. })
    ));
}

#[test]
fn server_files_are_refused_by_path_by_directory_and_by_inode() {
    let f = fixture();
    std::fs::create_dir(f.root.join("data")).expect("data");
    std::fs::write(f.root.join("data/api-token"), "tok").expect("token");
    std::fs::write(f.root.join("config.toml"), "x = 1").expect("config");
    std::fs::hard_link(f.root.join("config.toml"), f.root.join("innocent.txt")).expect("hardlink");
    symlink("data/api-token", f.root.join("tok-link")).expect("inner link");
    let guard = ServerFiles::new(
        [f.root.join("data/api-token"), f.root.join("config.toml")],
        [f.root.join("data")],
    );
    let ws = open(&f, guard);
    for p in [
        "data/api-token",
        "./data/../data/api-token",
        "config.toml",
        "innocent.txt",
        "tok-link",
        "data/other.db",
    ] {
        let read = ws.read(p, None, None, MAX);
        assert!(
            matches!(
                read,
                Err(FsError::ServerFile { .. }) | Err(FsError::NotFound { .. })
            ),
            "read {p}: {read:?}"
        );
        assert!(
            matches!(
                ws.write(p, "pwned"),
                Err(FsError::ServerFile { .. }) | Err(FsError::Symlink { .. })
            ),
            "write {p} was allowed"
        );
    }
    assert_eq!(
        std::fs::read_to_string(f.root.join("config.toml")).expect("config"),
        "x = 1"
    );
    assert!(matches!(
        ws.read("data/api-token", None, None, MAX),
        Err(FsError::ServerFile { .. })
    ));
}

#[test]
fn writes_keep_the_mode_and_leave_no_temporary_files() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let script = f.root.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\n").expect("seed");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ws = open(&f, ServerFiles::default());
    ws.write("run.sh", "#!/bin/sh\necho hi\n").expect("write");
    let mode = std::fs::metadata(&script)
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
    let names: Vec<_> = std::fs::read_dir(&f.root)
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "left behind: {names:?}");
}

/// The server's guard lists the database files and the config as files and
/// the data directory as a directory; the API token is only in the
/// directory. A hard link to it in the workspace is the same file: a probe
/// read the token through one. Every regular file directly in a protected
/// directory is compared by inode too.
#[test]
fn a_hard_link_to_a_file_in_the_data_directory_is_refused() {
    let f = fixture();
    let data = f.outside.join("data");
    std::fs::create_dir(&data).expect("data");
    std::fs::write(data.join("api-token"), "s3cret").expect("token");
    std::fs::hard_link(data.join("api-token"), f.root.join("hardtok")).expect("hardlink");
    let guard = ServerFiles::new([data.join("agent-intercom.db")], [data.clone()]);
    let ws = open(&f, guard);
    let read = ws.read("hardtok", None, None, MAX);
    assert!(matches!(read, Err(FsError::ServerFile { .. })), "{read:?}");
    assert!(matches!(
        ws.write("hardtok", "x"),
        Err(FsError::ServerFile { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(data.join("api-token")).expect("token"),
        "s3cret"
    );
}

#[test]
fn dotdot_after_a_link_is_refused_where_text_and_kernel_disagree() {
    // `lnk/../X` is X at the top read as text, but docs/X to the kernel
    // (and to the rules): refused, relative or absolute. A plain `a/../b`
    // (no link popped) still reads as before.
    let f = fixture();
    std::fs::create_dir_all(f.root.join("docs/sub")).expect("mkdir");
    std::fs::create_dir_all(f.root.join(".git/hooks")).expect("mkdir");
    symlink("docs/sub", f.root.join("lnk")).expect("link");
    std::fs::write(f.root.join("README.md"), "top\n").expect("readme");
    let ws = open(&f, ServerFiles::default());
    let abs = format!("{}/lnk/../.git/hooks/post-merge", f.root.display());
    for bad in [
        "lnk/../.git/hooks/post-merge",
        "lnk/../README.md",
        abs.as_str(),
    ] {
        let write = ws.write(bad, "#!/bin/sh\n");
        assert!(
            matches!(write, Err(FsError::Invalid { why, .. }) if why.contains("symbolic link")),
            "write {bad}: {write:?}"
        );
    }
    assert!(!f.root.join(".git/hooks/post-merge").exists());
    assert_eq!(
        std::fs::read_to_string(f.root.join("README.md")).expect("readme"),
        "top\n"
    );
    // Through a real directory, `..` means the same either way.
    ws.write("docs/../notes.txt", "ok\n").expect("plain dotdot");
    assert_eq!(
        std::fs::read_to_string(f.root.join("notes.txt")).expect("notes"),
        "ok\n"
    );
}

#[test]
fn an_approved_write_is_done_only_where_it_was_shown() {
    // Asked (and shown) as notes/x; the link re-pointed before the write:
    // refused, nothing written in .git/hooks.
    let f = fixture();
    for d in ["notes", ".git/hooks"] {
        std::fs::create_dir_all(f.root.join(d)).expect("mkdir");
    }
    symlink("notes", f.root.join("lnk")).expect("link");
    let ws = open(&f, ServerFiles::default());
    let (shown, _) = ws
        .write_preview("lnk/pre-merge-commit", MAX)
        .expect("preview");
    assert_eq!(shown, Path::new("notes/pre-merge-commit"));
    std::fs::remove_file(f.root.join("lnk")).expect("unlink");
    symlink(".git/hooks", f.root.join("lnk")).expect("relink");
    let moved = ws.write_at("lnk/pre-merge-commit", "#!/bin/sh\n", &shown);
    assert!(
        matches!(&moved, Err(FsError::Moved { now, .. }) if now == ".git/hooks/pre-merge-commit"),
        "{moved:?}"
    );
    assert!(moved.as_ref().is_err_and(FsError::is_containment));
    assert!(!f.root.join(".git/hooks/pre-merge-commit").exists());
    // Where it still lands: written.
    ws.write_at("notes/ok", "fine\n", Path::new("notes/ok"))
        .expect("write");
    assert_eq!(
        std::fs::read_to_string(f.root.join("notes/ok")).expect("ok"),
        "fine\n"
    );
}
