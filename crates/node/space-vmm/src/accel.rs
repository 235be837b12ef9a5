//! Accelerator choice: KVM only where the host CPU shows hardware virtualisation, TCG otherwise.
//!
//! `/dev/kvm` alone is not enough: on PVM nested-KVM hosts (our dev machines) the device
//! exists but only runs PVM-enabled guest kernels, and a stock kernel hangs at boot.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// The QEMU accelerator a VM runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's software emulation (Tiny Code Generator).
    Tcg,
}

impl Accel {
    /// The name QEMU and our config use: "kvm" or "tcg".
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// unknown accelerator: expected "kvm" or "tcg"
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown accelerator {0:?}: expected \"kvm\" or \"tcg\"")]
pub struct ParseAccelError(pub String);

impl FromStr for Accel {
    type Err = ParseAccelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "kvm" => Ok(Accel::Kvm),
            "tcg" => Ok(Accel::Tcg),
            _ => Err(ParseAccelError(s.to_owned())),
        }
    }
}

/// Picks KVM when /dev/kvm exists and /proc/cpuinfo shows `vmx` or `svm`; TCG otherwise.
pub fn detect_accel() -> Accel {
    let kvm_dev = Path::new("/dev/kvm").exists();
    // cpuinfo is a small kernel-generated file; an unreadable one means "no evidence of VT".
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let accel = accel_for(kvm_dev, &cpuinfo);
    tracing::info!(
        accel = %accel,
        kvm_device = kvm_dev,
        hw_virt = cpu_has_hw_virt(&cpuinfo),
        "selected VM accelerator"
    );
    accel
}

/// The pure decision behind [`detect_accel`].
pub fn accel_for(kvm_device_exists: bool, cpuinfo: &str) -> Accel {
    if kvm_device_exists && cpu_has_hw_virt(cpuinfo) {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// True when any `flags` line of /proc/cpuinfo lists `vmx` (Intel VT-x) or `svm` (AMD-V).
fn cpu_has_hw_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .any(|flags| flags.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("kvm".parse::<Accel>().unwrap(), Accel::Kvm);
        assert_eq!(" TCG ".parse::<Accel>().unwrap(), Accel::Tcg);
        assert!("hvf".parse::<Accel>().is_err());
        assert_eq!(Accel::Kvm.to_string(), "kvm");
        assert_eq!(Accel::Tcg.to_string(), "tcg");
    }

    #[test]
    fn needs_both_device_and_cpu_flag() {
        let vmx = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n";
        let svm = "flags\t\t: fpu svm\n";
        let none = "flags\t\t: fpu vme sse vmxnot\nmodel name\t: vmx svm\n";
        assert_eq!(accel_for(true, vmx), Accel::Kvm);
        assert_eq!(accel_for(true, svm), Accel::Kvm);
        assert_eq!(accel_for(false, vmx), Accel::Tcg);
        assert_eq!(accel_for(true, none), Accel::Tcg);
        assert_eq!(accel_for(true, ""), Accel::Tcg);
    }

    #[test]
    fn detect_matches_this_host() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let expected = accel_for(Path::new("/dev/kvm").exists(), &cpuinfo);
        assert_eq!(detect_accel(), expected);
        if !cpu_has_hw_virt(&cpuinfo) {
            // Our dev/CI machines: PVM nested KVM without vmx/svm must not pick KVM.
            assert_eq!(detect_accel(), Accel::Tcg);
        }
    }
}
