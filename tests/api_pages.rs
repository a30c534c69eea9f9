//! Reading lists the agent made huge: the transcript
//! (`GET /api/sessions/{id}/messages`), the approvals and the audit log
//! answer bounded pages (entries and bytes) with a `Link` header to the
//! rest, and paging loses and repeats nothing. The real app in-process, the
//! scripted agent as a child process.

mod common;

use common::api_server::{Server, sid};
use common::{Reply, Setup};
use serde_json::{Value, json};

/// Small tool calls, then big ones (a diff of about 200 KiB each: under
/// what one transcript line keeps, and all of them under what one turn
/// keeps), then a last line of text.
const SMALL: usize = 1100;
const BIG: usize = 60;
const BIG_DIFF_LINES: usize = 2000;

fn flooding_agent() -> Setup {
    let mut steps: Vec<Value> = (0..SMALL)
        .map(|i| json!({"tool_call": {"id": format!("s{i}"), "title": format!("small {i}"), "kind": "read"}}))
        .collect();
    steps.extend((0..BIG).map(|i| {
        let content = format!("{}\n", "x".repeat(100)).repeat(BIG_DIFF_LINES);
        json!({"tool_call": {"id": format!("b{i}"), "title": format!("big {i} "), "kind": "edit",
            "diffs": [{"path": format!("big-{i}.txt"), "new_text": content}]}})
    }));
    steps.push(json!({"chunk": "all sent."}));
    Setup {
        scenario: json!({"turns": [steps]}),
        ..Setup::default()
    }
}

fn entries(r: &Reply) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(300)]);
    r.body.as_array().expect("an array").clone()
}

fn ids(list: &[Value]) -> Vec<i64> {
    list.iter().map(|e| e["id"].as_i64().expect("id")).collect()
}

/// The path of the `Link` header's page for `rel`.
fn linked(r: &Reply, rel: &str) -> Option<String> {
    let link = r.link.as_deref()?;
    assert!(link.contains(&format!("rel=\"{rel}\"")), "{link}");
    let start = link.find('<')? + 1;
    let end = link.find('>')?;
    Some(link[start..end].to_owned())
}

#[test]
fn a_huge_transcript_is_read_in_bounded_pages_that_lose_nothing() {
    let server = Server::start(flooding_agent());
    let http = &server.http;
    let id = sid(&http.start("flood the transcript"));
    http.until_transcript(&id, "all sent.");
    let base = format!("/api/sessions/{id}/messages");

    // The default page: the newest entries, cut by the byte budget (60 big
    // tool calls of about 200 KiB are 12 MiB; a page carries about 8 MiB).
    let latest = http.get(&base);
    let page = entries(&latest);
    assert!(latest.text.len() < 9 << 20, "{} bytes", latest.text.len());
    assert!(page.len() < BIG, "{} entries", page.len());
    let shown = |e: &Value| e["content"].as_str().unwrap_or_default().to_owned();
    assert!(
        page.iter().any(|e| shown(e).contains("big 59 ")),
        "the newest tool call is on the latest page"
    );
    let page_ids = ids(&page);
    assert!(page_ids.windows(2).all(|w| w[0] < w[1]), "oldest first");

    // Paging back with the Link header reaches the first entry, each page
    // within the bounds, none repeated.
    let mut all = page_ids.clone();
    let mut next = linked(&latest, "prev");
    let mut pages = 1;
    while let Some(path) = next {
        let r = http.get(&path);
        let older = ids(&entries(&r));
        assert!(!older.is_empty() && older.len() <= 1000, "{}", older.len());
        assert!(
            older.last() < all.first(),
            "a page back holds only older entries"
        );
        all.splice(0..0, older);
        next = linked(&r, "prev");
        pages += 1;
    }
    assert!(pages >= 3, "{pages} pages");
    // The prompt, the agent's text before the tool calls (the scripted
    // agent echoes the prompt first), every tool call, its text after them
    // (a tool call ends a text block: the transcript keeps the order).
    assert_eq!(all.len(), 1 + 1 + SMALL + BIG + 1, "every entry, once");
    assert!(all.windows(2).all(|w| w[0] < w[1]));

    // Catching up from the first entry walks the same entries forward.
    let mut forward = Vec::new();
    let mut path = Some(format!("{base}?after={}&limit=400", all[0] - 1));
    while let Some(p) = path {
        let r = http.get(&p);
        forward.extend(ids(&entries(&r)));
        path = linked(&r, "next");
    }
    assert_eq!(forward, all);

    // `ctl log` prints the latest page and says how to see the one before.
    let (out, err) = ctl_log(&server, &[&id]);
    assert!(out.contains("big 59 ") && !out.contains("small 0"));
    let before = err
        .split("--before ")
        .nth(1)
        .and_then(|n| n.trim().parse::<i64>().ok())
        .unwrap_or_else(|| panic!("no --before in {err:?}"));
    assert_eq!(before, page_ids[0]);
    let (older, _) = ctl_log(&server, &[&id, "--before", &before.to_string()]);
    assert!(older.contains("small 1099") && !older.contains("big 59 "));
}

/// Runs the real binary's `ctl log <args>`; returns stdout and stderr.
fn ctl_log(server: &Server, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-intercom"))
        .args([
            "ctl",
            "--url",
            &server.http.base,
            "--token",
            common::TOKEN,
            "log",
        ])
        .args(args)
        .output()
        .expect("run ctl");
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_page_query_is_refused_with_what_is_allowed() {
    let server = Server::start(Setup::default());
    let http = &server.http;
    let id = sid(&http.start("hello"));
    http.until_transcript(&id, "ok");
    let base = format!("/api/sessions/{id}/messages");
    for (query, says) in [
        ("?before=5&after=1", "not both"),
        ("?limit=0", "between 1 and 5000"),
        ("?limit=999999", "between 1 and 5000"),
        ("?before=abc", "before"),
        ("?page=2", "page"),
    ] {
        let r = http.get(&format!("{base}{query}"));
        assert_eq!(r.status, 400, "{query}: {}", r.text);
        assert_eq!(r.body["code"], "bad_request", "{query}");
        let error = r.body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{query}: {error}");
    }
    // A small transcript is one page, with no Link header.
    let r = http.get(&base);
    assert!(r.link.is_none(), "{:?}", r.link);
    assert_eq!(
        entries(&r)
            .iter()
            .map(|e| e["content"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["hello", "prompt: hellook"]
    );
    let unknown = http.get("/api/sessions/s-0000000000000000/messages");
    assert_eq!(unknown.status, 404, "{}", unknown.text);
}

/// An agent writing big files: every write is a request with its diff,
/// decided and audited.
fn big_writes(n: usize, size: usize) -> Setup {
    let mut steps: Vec<Value> = (0..n)
        .map(|i| {
            let fill = if i % 2 == 0 { "a" } else { "b" };
            json!({"write_file": {"path": "big.txt", "content": format!("{i}\n{}\n", fill.repeat(size))}})
        })
        .collect();
    steps.push(json!({"chunk": "all written."}));
    Setup {
        scenario: json!({"turns": [steps]}),
        ..Setup::default()
    }
}

/// Follows `rel="prev"` links from `first` to the end; returns every
/// page's items in order and how many pages there were.
fn all_pages(http: &common::Http, first: &str) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut pages = 0;
    let mut next = Some(first.to_owned());
    while let Some(path) = next {
        let r = http.get(&path);
        assert!(r.text.len() < 10 << 20, "{path}: {} bytes", r.text.len());
        items.extend(entries(&r));
        next = linked(&r, "prev");
        pages += 1;
    }
    (items, pages)
}

#[test]
fn approvals_and_the_audit_log_are_read_in_bounded_pages() {
    // 24 writes whose diffs (old and new text) are about 1 MiB each.
    const WRITES: usize = 24;
    let server = Server::start(big_writes(WRITES, 512 * 1024));
    let http = &server.http;
    let r = http.post(
        "/api/sessions",
        &json!({"workspace": "demo", "prompt": "write", "mode": "ask"}),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    let id = sid(&r.body);
    // Decided by a person, so each keeps its whole diff (one decided by a
    // mode keeps 64 KiB of it).
    for n in 1..=WRITES {
        let request = format!("req-{n}");
        http.until_pending(&id, &request);
        let decided = http.post(
            &format!("/api/approvals/{id}:{request}"),
            &json!({"decision": "approve"}),
        );
        assert_eq!(decided.status, 200, "{}", decided.text);
    }
    http.until_transcript(&id, "all written.");

    // Every approval once, newest first, over several bounded pages.
    let (approvals, pages) = all_pages(http, "/api/approvals");
    assert!(pages >= 3, "{pages} pages");
    let ids: Vec<&str> = approvals
        .iter()
        .map(|a| a["id"].as_str().unwrap_or_default())
        .collect();
    let expected: Vec<String> = (1..=WRITES)
        .rev()
        .map(|n| format!("{id}:req-{n}"))
        .collect();
    assert_eq!(ids, expected);
    // The status filter and a small limit page the same way.
    let (decided, pages) = all_pages(http, "/api/approvals?status=decided&limit=5");
    assert_eq!(decided.len(), WRITES);
    assert!(pages >= 5, "{pages} pages of 5");
    assert!(decided.iter().all(|a| a["status"] == "decided"));
    // Brief pages: the same approvals without their diffs, and the link to
    // the next page keeps it brief.
    let (brief, pages) = all_pages(http, "/api/approvals?status=decided&limit=5&brief=true");
    assert_eq!(brief.len(), WRITES);
    assert!(pages >= 5, "{pages} pages of 5");
    assert!(
        brief.iter().all(|a| a["diff"].is_null()),
        "a diff in a brief page"
    );
    assert!(
        decided.iter().all(|a| !a["diff"].is_null()),
        "the full pages keep them"
    );

    // The audit log: newest first, paged by count here.
    let (whole, _) = all_pages(http, &format!("/api/audit?session={id}&limit=1000"));
    let (paged, pages) = all_pages(http, &format!("/api/audit?session={id}&limit=3"));
    assert_eq!(paged, whole);
    assert!(
        pages >= whole.len() / 3,
        "{pages} pages for {}",
        whole.len()
    );
    let ats: Vec<i64> = whole
        .iter()
        .map(|e| e["at"].as_i64().unwrap_or_default())
        .collect();
    assert!(ats.windows(2).all(|w| w[0] >= w[1]), "newest first");

    for bad in [
        "/api/approvals?limit=0",
        "/api/audit?limit=9999",
        "/api/audit?before=x",
    ] {
        let r = http.get(bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
    }
}
