//! How a run is printed: one Markdown row per run (every figure, and each
//! round trip as a multiple of the floor) and the notes that go below the
//! table.

use super::*;

/// The table's header and separator lines.
pub(super) fn header() -> String {
    let columns = [
        "operator",
        "N",
        "pace ms",
        "ramp ms",
        "requests",
        "rtt p50 µs",
        "rtt p99 µs",
        "rtt max µs",
        "rtt p99 2nd half µs",
        "floor p50 µs",
        "floor p99 µs",
        "rtt p50 ×floor",
        "rtt p99 ×floor",
        "rtt p99 2nd half ×floor",
        "commits/approval",
        "writes/approval",
        "notify p50 µs",
        "notify p99 µs",
        "op p50 µs",
        "op p99 µs",
        "rtt−op p50 µs",
        "req/s",
        "cpu %",
        "bench-side cpu %",
        "machine cpu %",
        "peak RSS MiB",
        "KiB/idle session",
        "start p50 ms",
        "start p99 ms",
        "start max ms",
        "errors",
    ];
    let align: Vec<&str> = (0..columns.len())
        .map(|i| if i == 0 { "---" } else { "--:" })
        .collect();
    format!("| {} |\n|{}|", columns.join(" | "), align.join("|"))
}

/// One run's row of the table.
pub(super) fn row(f: &Figures, floor: &Floor) -> String {
    let (r50, o50) = (pct(&f.rtt_us, 0.5), pct(&f.op_us, 0.5));
    let (r99, later99) = (pct(&f.rtt_us, 0.99), pct(&f.rtt_later, 0.99));
    let approvals = f.rtt_us.len().max(1) as f64;
    let cells: Vec<String> = vec![
        f.mode.name().to_owned(),
        f.n.to_string(),
        f.pace_ms.to_string(),
        f.ramp_ms.to_string(),
        f.rtt_us.len().to_string(),
        r50.to_string(),
        r99.to_string(),
        f.rtt_us.last().copied().unwrap_or(0).to_string(),
        later99.to_string(),
        floor.at(0.5).to_string(),
        floor.at(0.99).to_string(),
        floor.times(r50, 0.5),
        floor.times(r99, 0.99),
        floor.times(later99, 0.99),
        format!("{:.2}", f.commits as f64 / approvals),
        format!("{:.2}", f.writes as f64 / approvals),
        pct(&f.notify_us, 0.5).to_string(),
        pct(&f.notify_us, 0.99).to_string(),
        o50.to_string(),
        pct(&f.op_us, 0.99).to_string(),
        (r50 as i64 - o50 as i64).to_string(),
        format!("{:.0}", f.rps),
        format!("{:.0}", f.cpu_pct),
        format!("{:.0}", f.bench_cpu_pct),
        format!("{:.0}", f.machine_pct),
        format!("{:.1}", f.peak_rss_mb),
        format!("{:.0}", f.idle_kib_per_session),
        pct(&f.start_ms, 0.5).to_string(),
        pct(&f.start_ms, 0.99).to_string(),
        f.start_ms.last().copied().unwrap_or(0).to_string(),
        f.errors.to_string(),
    ];
    format!("| {} |", cells.join(" | "))
}

/// The notes of one run: the machine around it, the floor, then what the
/// run itself noted; each prefixed with the operator and N.
pub(super) fn notes(f: Figures, floor: &Floor) -> Vec<String> {
    let tag = format!("{} N={}", f.mode.name(), f.n);
    let mut out = vec![
        format!(
            "load average {:.2} before, {:.2} after; machine busy outside this process {:.0}% of a core (agents, kernel, anything else)",
            f.load.0,
            f.load.1,
            f.machine_pct - f.cpu_pct
        ),
        format!(
            "floor measured just before the run: pipe round trip to cat p50 {} µs p99 {} µs ({FLOOR_PIPE_ROUNDS} rounds), one store commit p50 {} µs p99 {} µs ({FLOOR_COMMITS} commits); {} commits for {} writes during the run",
            pct(&floor.pipe_us, 0.5),
            pct(&floor.pipe_us, 0.99),
            pct(&floor.commit_us, 0.5),
            pct(&floor.commit_us, 0.99),
            f.commits,
            f.writes
        ),
    ];
    out.extend(f.notes);
    out.into_iter()
        .map(|note| format!("{tag}: {note}"))
        .collect()
}
