//! The jail's own seccomp filter, installed before `execve` and so under QEMU's own
//! (`-sandbox`, which QEMU adds at start-up): whatever QEMU's filter allows, a jailed process
//! never makes namespaces (a user namespace would give it capabilities again), mounts, traces
//! or reads other processes, loads kernel code or BPF programs, or touches kernel keyrings.
//! The same filter covers anything run in the jail (the escape probes of the tests).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// System calls refused with `EPERM`, whatever their arguments.
const DENIED: &[libc::c_long] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_userfaultfd,
];

/// `clone` flags that make namespaces.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// The filters, in the order they are installed (compiled once per process, as they never
/// change): the denials (`EPERM`), then `clone3` answered `ENOSYS` (its flags live in memory
/// a filter cannot read; glibc then falls back to `clone`, whose flags the first filter
/// checks).
pub(crate) fn filters() -> std::io::Result<&'static [BpfProgram]> {
    static FILTERS: std::sync::OnceLock<Result<Vec<BpfProgram>, String>> =
        std::sync::OnceLock::new();
    match FILTERS.get_or_init(|| compile().map_err(|e| e.to_string())) {
        Ok(programs) => Ok(programs),
        Err(e) => Err(std::io::Error::other(format!(
            "cannot compile the jail's seccomp filter: {e}"
        ))),
    }
}

fn compile() -> Result<Vec<BpfProgram>, seccompiler::BackendError> {
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag as u64),
                flag as u64,
            )?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    denied.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?;
    Ok(vec![deny.try_into()?, clone3.try_into()?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let f = filters().expect("the jail's filters compile");
        assert_eq!(f.len(), 2);
        assert!(f
            .iter()
            .all(|p| !p.is_empty() && p.len() < u16::MAX as usize));
    }
}
