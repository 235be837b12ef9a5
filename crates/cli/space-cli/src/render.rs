//! Human output: tables (comfy-table), sizes and times; `--json` prints the API's JSON.

use comfy_table::presets::NOTHING;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;
use space_core::files::watch::{FileChange, WatchEvent};
use space_core::files::{FileKind, FileStat};
use space_core::metrics::SandboxMetric;
use space_core::process::ProcessInfo;
use space_core::sandbox::{PausedBy, PoolShape, SandboxInfo, SandboxOrigin, StoppedBy};
use space_core::template::{CachedTemplate, TemplateCachePrune, TemplateInfo};
use space_core::{FileChangeKind, LifecycleEntry, SnapshotDiff, SnapshotInfo};

/// Prints a value as pretty JSON.
pub fn json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.to_vec());
    t
}

fn now_ms() -> i64 {
    space_control::db::now_ms()
}

/// `3m ago`, `in 2h`...
pub fn relative(ms: i64) -> String {
    let delta = ms - now_ms();
    let secs = delta.unsigned_abs() / 1000;
    let amount = match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m", secs / 60),
        3600..=86399 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86400),
    };
    if delta >= 0 {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// When the sandbox's timeout passes, or `-` while its timeout has paused or stopped it
/// (no deadline until it runs again).
pub fn expiry(s: &SandboxInfo) -> String {
    match s.timed_out_at_ms {
        Some(_) => "-".to_owned(),
        None => relative(s.expires_at_ms),
    }
}

/// `1.5 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn labels(info: &SandboxInfo) -> String {
    info.labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A sandbox list.
pub fn sandboxes(list: &[SandboxInfo]) {
    let mut t = table(&[
        "ID", "TEMPLATE", "STATE", "VCPUS", "MEMORY", "DISK", "LABELS", "CREATED", "EXPIRES",
    ]);
    for s in list {
        t.add_row(vec![
            s.id.to_string(),
            s.template.clone(),
            match (s.paused_by, s.stopped_by) {
                (Some(PausedBy::Idle), _) => format!("{} (idle)", s.state),
                (Some(PausedBy::Timeout), _) | (_, Some(StoppedBy::Timeout)) => {
                    format!("{} (timeout)", s.state)
                }
                _ => s.state.to_string(),
            },
            s.resources.vcpus.to_string(),
            format!("{} MiB", s.resources.memory_mib),
            format!("{} MiB", s.resources.disk_mib),
            labels(s),
            relative(s.created_at_ms),
            expiry(s),
        ]);
    }
    println!("{t}");
}

/// One sandbox, as `key: value` lines.
pub fn sandbox(s: &SandboxInfo) {
    let mut lines = vec![
        ("id", s.id.to_string()),
        ("state", s.state.to_string()),
        (
            "template",
            format!("{} ({})", s.template, short(&s.template_digest)),
        ),
        (
            "resources",
            format!(
                "{} vCPU, {} MiB memory, {} MiB disk",
                s.resources.vcpus, s.resources.memory_mib, s.resources.disk_mib
            ),
        ),
        ("node", s.node.clone()),
        ("created", relative(s.created_at_ms)),
        ("expires", expiry(s)),
        (
            "timeout",
            format!(
                "{} s, then {}{}",
                s.timeout_secs,
                s.on_timeout.as_str(),
                if s.auto_resume {
                    " (the next call wakes it)"
                } else {
                    ""
                }
            ),
        ),
    ];
    if let Some(ms) = s.create_latency_ms {
        lines.push(("create latency", format!("{ms} ms")));
    }
    if !s.labels.is_empty() {
        lines.push(("labels", labels(s)));
    }
    if !s.env_keys.is_empty() {
        lines.push(("env", s.env_keys.join(", ")));
    }
    if let Some(p) = s.paused_by {
        lines.push((
            "paused by",
            match p {
                PausedBy::User => "a client (resume to wake it)".to_owned(),
                PausedBy::Idle => "idleness (the next call wakes it)".to_owned(),
                PausedBy::Timeout if s.auto_resume => {
                    "its timeout (the next call wakes it)".to_owned()
                }
                PausedBy::Timeout => "its timeout (resume to wake it)".to_owned(),
                PausedBy::CutOff => {
                    "its node, cut off from the control plane (resumed when it is back)".to_owned()
                }
            },
        ));
    }
    if let Some(p) = s.stopped_by {
        lines.push((
            "stopped by",
            match p {
                StoppedBy::User => "a client (start to boot it)".to_owned(),
                StoppedBy::Timeout if s.auto_resume => {
                    "its timeout (the next call boots it)".to_owned()
                }
                StoppedBy::Timeout => "its timeout (start to boot it)".to_owned(),
            },
        ));
    }
    if let Some(o) = &s.origin {
        lines.push(("vm origin", origin(o)));
    }
    if let Some(p) = &s.forked_from {
        lines.push(("forked from", p.to_string()));
    }
    if let Some(snap) = &s.from_snapshot {
        lines.push(("from snapshot", snap.to_string()));
    }
    if let Some(secs) = s.auto_pause_secs {
        lines.push(("auto pause", format!("after {secs} s idle")));
    }
    if let Some(r) = &s.failure_reason {
        lines.push(("failure", r.clone()));
    }
    for (k, v) in lines {
        println!("{k:>15}: {v}");
    }
}

/// How a VM came to be, in words.
pub fn origin(o: &SandboxOrigin) -> String {
    match o {
        SandboxOrigin::Boot => "booted".to_owned(),
        SandboxOrigin::TemplateImage { pooled: true } => "template image (warm pool)".to_owned(),
        SandboxOrigin::TemplateImage { pooled: false } => "template image".to_owned(),
        SandboxOrigin::Checkpoint {
            sandbox_id,
            snapshot_id: Some(s),
        } => format!("checkpoint {s} of {sandbox_id}"),
        SandboxOrigin::Checkpoint {
            sandbox_id,
            snapshot_id: None,
        } => format!("fork of {sandbox_id}"),
    }
}

/// `2024-05-01 12:34:56.789Z` (UTC) for ms since the Unix epoch.
pub fn timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

/// Snapshots.
pub fn snapshots(list: &[SnapshotInfo]) {
    let mut t = table(&[
        "ID",
        "SANDBOX",
        "KIND",
        "TRIGGER",
        "CREATED",
        "EXCLUSIVE",
        "TOTAL",
        "LABEL",
    ]);
    for s in list {
        t.add_row(vec![
            s.id.to_string(),
            s.sandbox_id.to_string(),
            match (s.persistent, s.stored) {
                (_, true) => format!("{} (persistent, stored)", s.kind),
                (true, false) => format!("{} (persistent)", s.kind),
                (false, false) => s.kind.to_string(),
            },
            s.trigger.to_string(),
            format!(
                "{} ({})",
                timestamp(s.created_at_ms),
                relative(s.created_at_ms)
            ),
            bytes(s.exclusive_bytes),
            bytes(s.total_bytes),
            s.label.clone().unwrap_or_default(),
        ]);
    }
    println!("{t}");
}

/// A snapshot diff: one line per changed path.
pub fn diff(d: &SnapshotDiff) {
    let mut t = table(&["CHANGE", "SIZE BEFORE", "SIZE AFTER", "PATH"]);
    for c in &d.changes {
        let size = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        t.add_row(vec![
            match c.kind {
                FileChangeKind::Added => "added",
                FileChangeKind::Removed => "removed",
                FileChangeKind::Modified => "modified",
                FileChangeKind::TypeChanged => "type changed",
            }
            .to_owned(),
            size(c.size_before),
            size(c.size_after),
            c.path.clone(),
        ]);
    }
    println!("{t}");
    if d.truncated {
        eprintln!("(diff truncated: more paths may have changed; see --limit)");
    }
}

/// One event-log line (also used while following).
pub fn event_line(e: &LifecycleEntry) -> String {
    // The event's API name (`pause`, `done`, `crash`...), as in the JSON.
    let event = serde_json::to_value(e.event)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut line = format!("{}  {event:<10} {} -> {}", timestamp(e.at_ms), e.from, e.to);
    if let Some(d) = &e.detail {
        line.push_str("  ");
        line.push_str(d);
    }
    line
}

/// The warm pool.
pub fn pool(list: &[PoolShape]) {
    let mut t = table(&["TEMPLATE", "SHAPE", "READY", "FILLING", "TARGET"]);
    for p in list {
        t.add_row(vec![
            p.template.clone(),
            format!(
                "{} vCPU, {} MiB, {} MiB disk",
                p.resources.vcpus, p.resources.memory_mib, p.resources.disk_mib
            ),
            p.ready.to_string(),
            p.filling.to_string(),
            p.target.to_string(),
        ]);
    }
    println!("{t}");
}

/// Nodes of a cluster.
/// What `space node drain` did: a row per sandbox.
pub fn drain(report: &space_core::cluster::DrainReport) {
    let mut t = table(&["SANDBOX", "MOVED TO", "STATE", "WHY NOT"]);
    for m in &report.moved {
        t.add_row(vec![
            m.id.to_string(),
            m.node.clone(),
            m.state.to_string(),
            String::new(),
        ]);
    }
    for f in &report.failed {
        t.add_row(vec![
            f.id.to_string(),
            "-".into(),
            f.state.to_string(),
            format!("{}: {}", f.code, f.message),
        ]);
    }
    println!("{t}");
    println!(
        "node {}: {} moved, {} not (it stays cordoned)",
        report.node,
        report.moved.len(),
        report.failed.len()
    );
}

pub fn nodes(list: &[space_core::cluster::NodeInfo]) {
    let mut t = table(&[
        "NAME",
        "STATE",
        "ADDRESS",
        "GEN",
        "SANDBOXES",
        "USED / CAPACITY",
    ]);
    for n in list {
        let state = match n.state {
            space_core::cluster::NodeState::Ready => "ready",
            space_core::cluster::NodeState::Cordoned => "cordoned",
            space_core::cluster::NodeState::Lost => "lost",
        };
        let room = match (n.used, n.capacity) {
            (Some(u), Some(c)) => format!(
                "{}/{} vCPU, {}/{} MiB",
                u.vcpus, c.vcpus, u.memory_mib, c.memory_mib
            ),
            _ => "-".into(),
        };
        t.add_row(vec![
            n.name.clone(),
            state.into(),
            n.address.clone(),
            n.generation.to_string(),
            n.sandboxes.map_or_else(|| "-".into(), |s| s.to_string()),
            room,
        ]);
    }
    println!("{t}");
}

/// The first 12 characters of a digest.
pub fn short(digest: &str) -> &str {
    let d = digest.strip_prefix("sha256:").unwrap_or(digest);
    &d[..d.len().min(12)]
}

/// Templates.
pub fn templates(list: &[TemplateInfo]) {
    let mut t = table(&[
        "NAME",
        "DIGEST",
        "SIZE",
        "DEFAULTS",
        "USER",
        "BUILT",
        "DESCRIPTION",
    ]);
    for i in list {
        t.add_row(vec![
            i.name.clone(),
            short(&i.digest).to_owned(),
            format!("{} MiB", i.image_size_mib),
            format!(
                "{} vCPU, {} MiB, {} MiB disk",
                i.default_resources.vcpus,
                i.default_resources.memory_mib,
                i.default_resources.disk_mib
            ),
            i.default_user.clone(),
            relative(i.built_at_ms),
            i.description.clone(),
        ]);
    }
    println!("{t}");
}

/// A template cache.
pub fn cached_templates(list: &[CachedTemplate]) {
    let mut t = table(&["NODE", "DIGEST", "SIZE", "BUILT", "LAST NEEDED", "WHAT"]);
    for c in list {
        t.add_row(vec![
            c.node.clone(),
            short(&c.digest).to_owned(),
            format!("{} MiB", c.image_size_mib),
            relative(c.built_at_ms),
            relative(c.last_used_ms),
            c.description.clone(),
        ]);
    }
    println!("{t}");
}

/// What a prune of the template cache did.
pub fn template_cache_prune(p: &TemplateCachePrune) {
    let verb = if p.dry_run { "would remove" } else { "removed" };
    println!(
        "{verb} {} cached template(s), {} MiB",
        p.removed.len(),
        p.freed_mib
    );
    if !p.removed.is_empty() {
        cached_templates(&p.removed);
    }
    if !p.in_use.is_empty() {
        println!(
            "kept {} unused for long but needed by sandboxes or snapshots",
            p.in_use.len()
        );
    }
    if !p.busy_nodes.is_empty() {
        println!(
            "skipped (a template build runs there): {}",
            p.busy_nodes.join(", ")
        );
    }
    if !p.unreachable_nodes.is_empty() {
        println!(
            "skipped (could not be asked): {}",
            p.unreachable_nodes.join(", ")
        );
    }
}

/// Processes.
pub fn processes(list: &[ProcessInfo]) {
    let mut t = table(&["ID", "PID", "USER", "STATUS", "COMMAND"]);
    for p in list {
        let status = match &p.exit {
            None => "running".to_owned(),
            Some(e) => match (e.exit_code, e.signal) {
                (Some(c), _) => format!("exited {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => "exited".to_owned(),
            },
        };
        t.add_row(vec![
            p.id.to_string(),
            p.pid.to_string(),
            p.user.clone(),
            status,
            p.argv.join(" "),
        ]);
    }
    println!("{t}");
}

fn kind(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// A directory listing.
pub fn files(list: &[FileStat], truncated: bool) {
    let mut t = table(&["MODE", "OWNER", "GROUP", "SIZE", "MODIFIED", "PATH"]);
    for f in list {
        let path = match &f.symlink_target {
            Some(target) => format!("{} -> {target}", f.path),
            None if f.kind == FileKind::Dir => format!("{}/", f.path),
            None => f.path.clone(),
        };
        t.add_row(vec![
            format!("{:04o}", f.mode & 0o7777),
            f.owner.clone().unwrap_or_else(|| f.uid.to_string()),
            f.group.clone().unwrap_or_else(|| f.gid.to_string()),
            f.size.to_string(),
            relative(f.modified_ms),
            path,
        ]);
    }
    println!("{t}");
    if truncated {
        eprintln!("(listing truncated)");
    }
}

/// One entry.
pub fn stat(f: &FileStat) {
    println!("{:>9}: {}", "path", f.path);
    println!("{:>9}: {}", "kind", kind(f.kind));
    println!("{:>9}: {} ({})", "size", f.size, bytes(f.size));
    println!("{:>9}: {:04o}", "mode", f.mode & 0o7777);
    let name = |n: &Option<String>, id: u32| n.clone().unwrap_or_else(|| id.to_string());
    println!(
        "{:>9}: {}:{} ({}:{})",
        "owner",
        name(&f.owner, f.uid),
        name(&f.group, f.gid),
        f.uid,
        f.gid
    );
    println!("{:>9}: {}", "modified", relative(f.modified_ms));
    if let Some(t) = &f.symlink_target {
        println!("{:>9}: {t}", "target");
    }
}

/// Resource-use samples.
pub fn metrics(list: &[SandboxMetric]) {
    let mut t = table(&["TIME", "CPUS", "CPU", "MEMORY", "CACHE", "DISK"]);
    for m in list {
        t.add_row(vec![
            timestamp(m.timestamp_ms),
            m.cpu_count.to_string(),
            format!("{:.1} %", m.cpu_used_pct),
            format!("{} / {}", bytes(m.mem_used), bytes(m.mem_total)),
            bytes(m.mem_cache),
            format!("{} / {}", bytes(m.disk_used), bytes(m.disk_total)),
        ]);
    }
    println!("{t}");
}

/// One line of a directory watch: `create  sub/file.txt`.
pub fn watch_line(ev: &WatchEvent) -> String {
    match ev {
        WatchEvent::Started { .. } => "(watching)".to_owned(),
        WatchEvent::Overflow { .. } => "(changes lost: the watch fell behind)".to_owned(),
        WatchEvent::Change { name, change, .. } => {
            let change = match change {
                FileChange::Create => "create",
                FileChange::Write => "write",
                FileChange::Remove => "remove",
                FileChange::Rename => "rename",
                FileChange::Chmod => "chmod",
            };
            format!("{change:<7} {name}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines() {
        let ev = WatchEvent::Change {
            seq: 2,
            name: "sub/a.txt".into(),
            change: FileChange::Write,
            stat: None,
        };
        assert_eq!(watch_line(&ev), "write   sub/a.txt");
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(timestamp(951_782_400_123), "2000-02-29 00:00:00.123Z");
        assert_eq!(timestamp(1_700_000_000_000), "2023-11-14 22:13:20.000Z");
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes(10), "10 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
    }
}
