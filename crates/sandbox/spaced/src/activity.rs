//! Activity counters for the node's idleness decision (`GET /v1/activity`): pure parsers
//! of the `/proc` files, and one blocking sample.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};

use space_guest_proto::Activity;

use crate::workload::Workload;

/// Largest `/proc/diskstats` or `/proc/net/dev` read.
const MAX_PROC_TEXT: u64 = 1024 * 1024;
/// Longest `/proc/net/tcp*` line read (they are 150 bytes).
const MAX_TCP_LINE: u64 = 4096;
/// TCP state ESTABLISHED in `/proc/net/tcp` (hex).
const TCP_ESTABLISHED: &str = "01";

/// Bytes read and written on whole virtio disks (`vda`, `vdb`, …; partitions are not
/// counted twice) from `/proc/diskstats` text: (sectors read + sectors written) × 512.
pub fn disk_io_bytes(diskstats: &str) -> u64 {
    diskstats
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.get(2)?;
            let disk = name.strip_prefix("vd").is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_lowercase())
            });
            if !disk {
                return None;
            }
            let read: u64 = f.get(5)?.parse().ok()?;
            let written: u64 = f.get(9)?.parse().ok()?;
            Some(read.saturating_add(written).saturating_mul(512))
        })
        .fold(0u64, u64::saturating_add)
}

/// Bytes received plus sent on every interface but `lo`, from `/proc/net/dev` text.
pub fn net_bytes(net_dev: &str) -> u64 {
    net_dev
        .lines()
        .filter_map(|l| {
            let (name, counters) = l.split_once(':')?;
            if name.trim() == "lo" {
                return None;
            }
            let f: Vec<&str> = counters.split_whitespace().collect();
            let rx: u64 = f.first()?.parse().ok()?;
            let tx: u64 = f.get(8)?.parse().ok()?;
            Some(rx.saturating_add(tx))
        })
        .fold(0u64, u64::saturating_add)
}

/// Connections in state ESTABLISHED in `/proc/net/tcp` or `tcp6` text, read line by line
/// (the table can be large); lines longer than [`MAX_TCP_LINE`] end the count.
pub fn established(table: impl BufRead) -> u32 {
    let mut n = 0u32;
    let mut reader = table.take(u64::MAX);
    let mut line = Vec::new();
    loop {
        line.clear();
        reader.set_limit(MAX_TCP_LINE);
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return n,
            Ok(_) if !line.ends_with(b"\n") && line.len() as u64 >= MAX_TCP_LINE => return n,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let mut f = text.split_whitespace();
        // "sl local_address rem_address st ..."; the header's st column reads "st".
        if f.nth(3) == Some(TCP_ESTABLISHED) {
            n = n.saturating_add(1);
        }
    }
}

fn read_proc(path: &str) -> String {
    let mut text = String::new();
    if let Ok(f) = File::open(path) {
        let _ = f.take(MAX_PROC_TEXT).read_to_string(&mut text);
    }
    text
}

/// Takes a sample. `running` is the daemon's own count of running processes, used when
/// there is no workload cgroup. Blocking.
pub fn sample(workload: &Workload, running: usize, api_requests: u64) -> Activity {
    let (workload_processes, workload_cpu_usec) = workload
        .usage()
        .unwrap_or((u32::try_from(running).unwrap_or(u32::MAX), 0));
    let tcp_connections = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| File::open(p).ok())
        .map(|f| established(BufReader::new(f)))
        .fold(0u32, u32::saturating_add);
    Activity {
        workload_processes,
        workload_cpu_usec,
        disk_io_bytes: disk_io_bytes(&read_proc("/proc/diskstats")),
        net_bytes: net_bytes(&read_proc("/proc/net/dev")),
        tcp_connections,
        api_requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats() {
        let text = "\
   7       0 loop0 100 0 2000 10 0 0 0 0 0 10 10 0 0 0 0\n\
 254       0 vda 1200 5 40000 300 800 20 16000 500 0 700 900 0 0 0 0 0 0\n\
 254       1 vda1 1000 5 30000 300 700 20 15000 500 0 700 900\n\
 254      16 vdb 10 0 8 1 2 0 4 1 0 2 2\n\
  11       0 sr0 1 0 1 0 0 0 0 0 0 0 0\n\
 garbage\n";
        assert_eq!(disk_io_bytes(text), (40000 + 16000 + 8 + 4) * 512);
        assert_eq!(disk_io_bytes(""), 0);
    }

    #[test]
    fn net_dev() {
        let text = "\
Inter-|   Receive                                                |  Transmit\n\
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
    lo:  999999     100    0    0    0     0          0         0   999999     100    0    0    0     0       0          0\n\
  eth0: 1500       10    0    0    0     0          0         0     2500      20    0    0    0     0       0          0\n\
 wlan0:100 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n";
        assert_eq!(net_bytes(text), 1500 + 2500 + 100 + 7);
        assert_eq!(net_bytes(""), 0);
    }

    #[test]
    fn tcp_established() {
        let text = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 1235 1\n\
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1236 1\n\
   3: 0100007F:C351 0100007F:1F90 06 00000000:00000000 03:00000000 00000000     0        0 0 3\n";
        assert_eq!(established(text.as_bytes()), 2);
        assert_eq!(established(&b""[..]), 0);
        let tcp6 = "  sl  local_address                         remote_address                        st\n\
   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C350 01 0\n";
        assert_eq!(established(tcp6.as_bytes()), 1);
        // An absurd line stops the count instead of growing a buffer.
        let long = format!("{}\n   1: a b 01\n", "x".repeat(10_000));
        assert_eq!(established(long.as_bytes()), 0);
    }
}
