//! `space bench`: the baseline figures of a node, as percentiles over repeated runs.
//!
//! Measured through the public API of a running server (so everything a client pays is in
//! the numbers): cold create→ready latency, exec round trip of `true`, file write and read
//! throughput, and the host memory each idle sandbox costs beyond its guest RAM. The memory
//! figure reads `/proc` of the VMM processes, so run the bench on the node itself.

use std::time::{Duration, Instant};

use clap::Args;
use space_cli::client::SpaceClient;
use space_cli::stats::{summarize, Summary};
use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::SandboxId;

use crate::Global;

/// `space bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Template to create sandboxes from.
    #[arg(long, default_value = "busybox")]
    template: String,
    /// Sequential cold creates to time.
    #[arg(long, default_value_t = 20)]
    creates: usize,
    /// Exec round trips to time.
    #[arg(long, default_value_t = 50)]
    execs: usize,
    /// Size of the file moved in each throughput run, MiB.
    #[arg(long, default_value_t = 100)]
    file_mib: usize,
    /// Throughput runs (each one write and one read).
    #[arg(long, default_value_t = 5)]
    file_runs: usize,
    /// Disk of the sandbox the exec and file figures are measured in, MiB.
    #[arg(long, default_value_t = 1024)]
    disk_mib: u32,
    /// Idle sandboxes whose VMM memory is measured.
    #[arg(long, default_value_t = 5)]
    idle: usize,
    /// Seconds the idle sandboxes settle before their memory is read.
    #[arg(long, default_value_t = 10)]
    settle_secs: u64,
}

/// One line of the report.
#[derive(serde::Serialize)]
struct Figure {
    name: &'static str,
    unit: &'static str,
    #[serde(flatten)]
    summary: Summary,
}

/// Runs the benchmark and prints the figures.
pub async fn run(g: &Global, a: BenchArgs) -> anyhow::Result<u8> {
    let c = g.client()?;
    let req = CreateSandboxRequest {
        template: a.template.clone(),
        ..Default::default()
    };
    let mut figures = Vec::new();

    eprintln!("cold create -> ready, {} runs…", a.creates);
    let (mut wall, mut server) = (Vec::new(), Vec::new());
    for _ in 0..a.creates {
        let t = Instant::now();
        let sb = c.create_sandbox(&req).await?;
        wall.push(ms(t.elapsed()));
        server.extend(sb.create_latency_ms.map(|v| v as f64));
        c.delete_sandbox(&sb.id).await?;
    }
    push(&mut figures, "create_to_ready_client", "ms", &wall);
    push(&mut figures, "create_to_ready_server", "ms", &server);

    // The throughput runs replace a file atomically (old and new copy exist at once): give
    // the disk room for both.
    let mut roomy = req.clone();
    roomy.resources.disk_mib = Some(a.disk_mib);
    let sb = c.create_sandbox(&roomy).await?;
    let result = measure_in_sandbox(&c, &sb.id, &a, &mut figures).await;
    c.delete_sandbox(&sb.id).await?;
    result?;

    eprintln!("VMM memory of {} idle sandboxes…", a.idle);
    let mut ids = Vec::new();
    for _ in 0..a.idle {
        ids.push(c.create_sandbox(&req).await?);
    }
    tokio::time::sleep(Duration::from_secs(a.settle_secs)).await;
    let (mut overhead, mut total) = (Vec::new(), Vec::new());
    for sb in &ids {
        if let Some(m) = vmm_memory(&sb.id, sb.resources.memory_mib) {
            overhead.push(m.overhead_kib as f64 / 1024.0);
            total.push(m.total_kib as f64 / 1024.0);
        }
    }
    for sb in &ids {
        c.delete_sandbox(&sb.id).await?;
    }
    if overhead.is_empty() {
        eprintln!("(no VMM process found in /proc: run the bench on the node to measure memory)");
    }
    push(&mut figures, "vmm_rss_beyond_guest_ram", "MiB", &overhead);
    push(&mut figures, "vmm_rss_total", "MiB", &total);

    if g.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!(
            "{:<28} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "figure", "unit", "n", "min", "p50", "p90", "p99", "max"
        );
        for f in &figures {
            let s = f.summary;
            println!(
                "{:<28} {:>6} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                f.name, f.unit, s.n, s.min, s.p50, s.p90, s.p99, s.max
            );
        }
    }
    Ok(0)
}

async fn measure_in_sandbox(
    c: &SpaceClient,
    id: &SandboxId,
    a: &BenchArgs,
    figures: &mut Vec<Figure>,
) -> anyhow::Result<()> {
    eprintln!("exec round trip of `true`, {} runs…", a.execs);
    let spec = ProcessSpec::argv(["true"]);
    c.run(id, &spec).await?; // warm up
    let mut rt = Vec::new();
    for _ in 0..a.execs {
        let t = Instant::now();
        let out = c.run(id, &spec).await?;
        rt.push(ms(t.elapsed()));
        anyhow::ensure!(
            out.status.exit_code == Some(0),
            "`true` failed: {:?}",
            out.status
        );
    }
    push(figures, "exec_true_round_trip", "ms", &rt);

    eprintln!(
        "{} MiB file write and read, {} runs…",
        a.file_mib, a.file_runs
    );
    let data: bytes::Bytes = (0..a.file_mib << 20)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect::<Vec<u8>>()
        .into();
    let (mut wr, mut rd) = (Vec::new(), Vec::new());
    for _ in 0..a.file_runs {
        let t = Instant::now();
        c.write_file(id, "/home/user/bench.bin", None, None, data.clone())
            .await?;
        wr.push(a.file_mib as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let back = c.read_file_bytes(id, "/home/user/bench.bin", None).await?;
        rd.push(a.file_mib as f64 / t.elapsed().as_secs_f64());
        anyhow::ensure!(
            back.len() == data.len(),
            "read {} bytes, wrote {}",
            back.len(),
            data.len()
        );
    }
    push(figures, "file_write_throughput", "MiB/s", &wr);
    push(figures, "file_read_throughput", "MiB/s", &rd);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn push(figures: &mut Vec<Figure>, name: &'static str, unit: &'static str, samples: &[f64]) {
    if let Some(summary) = summarize(samples) {
        figures.push(Figure {
            name,
            unit,
            summary,
        });
    }
}

/// Resident memory of a sandbox's VMM.
struct VmmMemory {
    total_kib: u64,
    overhead_kib: u64,
}

/// Finds the QEMU process of `id` and splits its RSS into guest RAM (the anonymous mapping
/// of at least the guest's size) and everything else (the VMM's own cost: TCG translation
/// cache, device emulation, QEMU itself).
fn vmm_memory(id: &SandboxId, memory_mib: u32) -> Option<VmmMemory> {
    let pid = std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let ours = args
            .windows(2)
            .any(|w| w[0] == b"-name" && w[1].starts_with(id.as_str().as_bytes()));
        ours.then_some(pid)
    })?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(split_rss(&smaps, u64::from(memory_mib) * 1024))
}

fn split_rss(smaps: &str, guest_kib: u64) -> VmmMemory {
    let (mut total, mut guest) = (0u64, 0u64);
    let (mut size, mut is_guest) = (0u64, false);
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("Size:") => {
                size = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                is_guest = size >= guest_kib;
            }
            Some("Rss:") => {
                let rss: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                total += rss;
                if is_guest {
                    guest += rss;
                }
            }
            _ => {}
        }
    }
    let _ = size;
    VmmMemory {
        total_kib: total,
        overhead_kib: total.saturating_sub(guest),
    }
}
