//! Resource use for the node's metrics (`GET /v1/metrics`): pure parsers of `/proc/stat`
//! and `/proc/meminfo`, and one blocking sample (with `statfs` of the root file system).

use std::fs::File;
use std::io::Read;

use space_guest_proto::GuestMetrics;

/// Largest `/proc/stat` or `/proc/meminfo` read (`/proc/stat` grows with the CPU count and
/// interrupt lines; a few KiB for a small VM).
const MAX_PROC_TEXT: u64 = 1024 * 1024;

/// CPU figures from `/proc/stat` text: (online CPUs, busy ticks, total ticks). Total is
/// user + nice + system + idle + iowait + irq + softirq + steal (guest time is already in
/// user and nice); busy is total less idle and iowait.
pub fn cpu(stat: &str) -> (u32, u64, u64) {
    let mut count = 0u32;
    let (mut busy, mut total) = (0u64, 0u64);
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("cpu") => {
                let ticks: Vec<u64> = f.take(8).map(|t| t.parse().unwrap_or(0)).collect();
                total = ticks.iter().fold(0u64, |a, t| a.saturating_add(*t));
                let idle = ticks.get(3).copied().unwrap_or(0);
                let iowait = ticks.get(4).copied().unwrap_or(0);
                busy = total.saturating_sub(idle).saturating_sub(iowait);
            }
            Some(name)
                if name
                    .strip_prefix("cpu")
                    .is_some_and(|n| n.parse::<u32>().is_ok()) =>
            {
                count = count.saturating_add(1);
            }
            _ => {}
        }
    }
    (count, busy, total)
}

/// Memory figures from `/proc/meminfo` text, bytes: (total, available, page cache).
pub fn memory(meminfo: &str) -> (u64, u64, u64) {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib.saturating_mul(1024))
    };
    (field("MemTotal"), field("MemAvailable"), field("Cached"))
}

fn read_proc(path: &str) -> String {
    let mut text = String::new();
    if let Ok(f) = File::open(path) {
        let _ = f.take(MAX_PROC_TEXT).read_to_string(&mut text);
    }
    text
}

/// Size and use of the root file system, bytes: (total, used); zeros if `statfs` fails.
fn root_disk() -> (u64, u64) {
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a NUL-terminated string and `st` a valid statfs to fill.
    if unsafe { libc::statfs(c"/".as_ptr(), &mut st) } != 0 {
        return (0, 0);
    }
    let frsize = st.f_frsize as u64;
    let total = (st.f_blocks as u64).saturating_mul(frsize);
    let free = (st.f_bfree as u64).saturating_mul(frsize);
    (total, total.saturating_sub(free))
}

/// Takes a sample. Blocking.
pub fn sample() -> GuestMetrics {
    let (cpu_count, cpu_busy_ticks, cpu_total_ticks) = cpu(&read_proc("/proc/stat"));
    let (mem_total_bytes, mem_available_bytes, mem_cache_bytes) =
        memory(&read_proc("/proc/meminfo"));
    let (disk_total_bytes, disk_used_bytes) = root_disk();
    GuestMetrics {
        cpu_count,
        cpu_busy_ticks,
        cpu_total_ticks,
        mem_total_bytes,
        mem_available_bytes,
        mem_cache_bytes,
        disk_total_bytes,
        disk_used_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat() {
        let text = "\
cpu  4705 150 1120 16250 520 30 40 5 100 0\n\
cpu0 2352 75 560 8125 260 15 20 2 50 0\n\
cpu1 2353 75 560 8125 260 15 20 3 50 0\n\
intr 114930548 113199788 3 0 5 263 0 4 [...]\n\
ctxt 1990473\n\
cpufreq 3\n\
btime 1062191376\n";
        let total = 4705 + 150 + 1120 + 16250 + 520 + 30 + 40 + 5;
        assert_eq!(cpu(text), (2, total - 16250 - 520, total));
        assert_eq!(cpu(""), (0, 0, 0));
        // A short line (an old kernel) counts what it has.
        assert_eq!(cpu("cpu 1 2 3 4\ncpu0 1 2 3 4\n"), (1, 6, 10));
    }

    #[test]
    fn proc_meminfo() {
        let text = "\
MemTotal:         502880 kB\n\
MemFree:          300000 kB\n\
MemAvailable:     400000 kB\n\
Buffers:            2000 kB\n\
Cached:            50000 kB\n\
SwapCached:            7 kB\n";
        assert_eq!(
            memory(text),
            (502880 * 1024, 400000 * 1024, 50000 * 1024),
            "SwapCached is not Cached"
        );
        assert_eq!(memory("garbage"), (0, 0, 0));
    }

    #[test]
    fn samples_this_machine() {
        let m = sample();
        assert!(m.cpu_count >= 1);
        assert!(m.cpu_busy_ticks <= m.cpu_total_ticks && m.cpu_total_ticks > 0);
        assert!(m.mem_available_bytes <= m.mem_total_bytes && m.mem_total_bytes > 0);
        assert!(m.disk_used_bytes <= m.disk_total_bytes && m.disk_total_bytes > 0);
    }
}
