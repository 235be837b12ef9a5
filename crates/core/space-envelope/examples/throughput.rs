//! Issue 17's first figure: how fast an artifact is sealed and opened (MiB/s, in memory, one
//! core), beside what every upload already pays, a SHA-256 over the same bytes.
//!
//!   cargo run --release -p space-envelope --example throughput [samples] [MiB]

use std::time::Instant;

use sha2::Digest;
use space_envelope::{open, seal, DataKey, DEFAULT_CHUNK};

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let samples: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    // Memory-file-like bytes: not all zero, not all random.
    let plain: Vec<u8> = (0..mib << 20)
        .map(|i| (i / 4096 * 7 + i % 13) as u8)
        .collect();
    let key = DataKey::generate();
    let mut sealed = Vec::with_capacity(plain.len() + plain.len() / 1000 + 4096);
    let (mut seal_rate, mut open_rate, mut sha_rate) = (Vec::new(), Vec::new(), Vec::new());
    let rate = |t: Instant| mib as f64 / t.elapsed().as_secs_f64();
    for _ in 0..samples {
        sealed.clear();
        let t = Instant::now();
        seal(&key, "bench/memory", DEFAULT_CHUNK, &plain[..], &mut sealed).expect("seal");
        seal_rate.push(rate(t));
        let t = Instant::now();
        let n = open(&key, "bench/memory", &sealed[..], std::io::sink()).expect("open");
        open_rate.push(rate(t));
        assert_eq!(n as usize, plain.len());
        let t = Instant::now();
        std::hint::black_box(sha2::Sha256::digest(&plain));
        sha_rate.push(rate(t));
    }
    println!("{mib} MiB, {samples} samples, 1 MiB chunks, AES-256-GCM STREAM");
    for (what, r) in [
        ("seal", &mut seal_rate),
        ("open", &mut open_rate),
        ("SHA-256 (every upload's digest)", &mut sha_rate),
    ] {
        println!(
            "{what:<34} p50 {:>7.0} MiB/s  p90 {:>7.0} MiB/s",
            percentile(r, 0.5),
            // The 90th percentile of a rate is its slow end.
            percentile(r, 0.1)
        );
    }
}
