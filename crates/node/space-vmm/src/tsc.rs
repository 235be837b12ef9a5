//! Host TSC frequency. Under TCG the guest's TSC *is* the host's (QEMU reads the host TSC), so
//! handing the guest `tsc_early_khz=<host kHz>` spares it the PIT calibration that fails and
//! hangs the boot when the host is busy.

/// Measured once per process; `None` where there is no x86 TSC or the measurement looked wrong.
pub(crate) async fn host_tsc_khz() -> Option<u64> {
    static CACHE: tokio::sync::OnceCell<Option<u64>> = tokio::sync::OnceCell::const_new();
    *CACHE
        .get_or_init(|| async {
            let khz = tokio::task::spawn_blocking(measure).await.ok().flatten();
            match khz {
                Some(khz) => tracing::info!(khz, "measured host TSC frequency for TCG guests"),
                None => tracing::warn!(
                    "cannot measure host TSC frequency; TCG guests calibrate themselves"
                ),
            }
            khz
        })
        .await
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u64> {
    /// Pairs a TSC read with CLOCK_MONOTONIC_RAW (not NTP-slewed), keeping the pair whose two
    /// clock reads are closest together so preemption does not skew it.
    fn sample() -> Option<(u64, u128)> {
        let mut best: Option<(u128, u64, u128)> = None;
        for _ in 0..16 {
            let t0 = raw_ns()?;
            // SAFETY: RDTSC has no preconditions on x86_64.
            let tsc = unsafe { core::arch::x86_64::_rdtsc() };
            let t1 = raw_ns()?;
            let spread = t1.checked_sub(t0)?;
            if best.is_none_or(|(s, _, _)| spread < s) {
                best = Some((spread, tsc, t0 + spread / 2));
            }
        }
        best.map(|(_, tsc, ns)| (tsc, ns))
    }
    let (tsc0, ns0) = sample()?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (tsc1, ns1) = sample()?;
    let khz = khz_from(tsc1.checked_sub(tsc0)?, ns1.checked_sub(ns0)?)?;
    // Plausible CPUs run their TSC between 100 MHz and 20 GHz.
    (100_000..=20_000_000).contains(&khz).then_some(khz)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u64> {
    None
}

/// kHz from a tick count over an interval in nanoseconds, rounded to nearest.
fn khz_from(ticks: u64, ns: u128) -> Option<u64> {
    if ns == 0 {
        return None;
    }
    u64::try_from((u128::from(ticks) * 1_000_000 + ns / 2) / ns).ok()
}

#[cfg(target_arch = "x86_64")]
fn raw_ns() -> Option<u128> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) } != 0 {
        return None;
    }
    Some(u128::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u128::try_from(ts.tv_nsec).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn khz_arithmetic() {
        assert_eq!(khz_from(2_596_134_000, 1_000_000_000), Some(2_596_134));
        assert_eq!(khz_from(259_613_400, 100_000_000), Some(2_596_134));
        assert_eq!(khz_from(1, 0), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[tokio::test]
    async fn measures_something_plausible() {
        let khz = host_tsc_khz().await.unwrap();
        assert!((100_000..=20_000_000).contains(&khz));
    }
}
