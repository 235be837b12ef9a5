//! Sandbox networks on this node: every VM (sandbox, pool member, image build) gets a
//! network namespace named after the VM, made right before the VM starts and removed with
//! its run directory. The guest inside is configured with the same address in every
//! sandbox (`space_net::datapath::GuestLink`).
//!
//! Namespace names carry a prefix derived from this node's run directory, so two nodes on
//! one host (tests run many) never sweep each other's namespaces.

use space_guest_proto::GuestNetwork;
use space_net::datapath::GuestLink;
use space_vmm::VmNetwork;

use crate::sandbox_manager::Inner;
use crate::NodeError;

/// Longest VM name a namespace name is built from (VM names are ids: `sbx-`/`pool-`/`img-`
/// and 20-24 characters).
const MAX_VM_NAME_IN_NETNS: usize = 48;

pub use space_node_manager::netns_prefix;

impl Inner {
    /// Prefix of every namespace this node makes: `spc` and 8 hex digits of a hash of the run
    /// directory.
    pub(crate) fn netns_prefix(&self) -> String {
        netns_prefix(&self.run_root)
    }

    /// Namespace of the VM called `vm_name`.
    pub(crate) fn netns_name(&self, vm_name: &str) -> String {
        let short: String = vm_name.chars().take(MAX_VM_NAME_IN_NETNS).collect();
        format!("{}{short}", self.netns_prefix())
    }

    /// The NIC of a VM about to start (its namespace made if missing), or `None` when this
    /// node gives sandboxes no network.
    pub(crate) fn vm_network(&self, vm_name: &str) -> Result<Option<VmNetwork>, NodeError> {
        if !self.cfg.sandbox_network {
            return Ok(None);
        }
        Ok(Some(self.nm.ensure_vm_network(&self.netns_name(vm_name))?))
    }

    /// Removes the namespace of a VM that is gone (no-op without networking). Failures are
    /// logged: the orphan sweep retries at the next start.
    pub(crate) fn drop_vm_network(&self, vm_name: &str) {
        if !self.cfg.sandbox_network {
            return;
        }
        if let Err(e) = self.nm.remove_vm_network(&self.netns_name(vm_name)) {
            tracing::warn!(vm = %vm_name, error = %e, "cannot remove the VM's network namespace");
        }
    }

    /// How the guest addresses its NIC, for `configure`.
    pub(crate) fn guest_network(&self) -> Option<GuestNetwork> {
        if !self.cfg.sandbox_network {
            return None;
        }
        let link = GuestLink::default();
        Some(GuestNetwork {
            mac: link.guest_mac_text(),
            address: link.guest,
            prefix: link.prefix,
            gateway: link.gateway,
            dns: link.gateway,
            mtu: link.mtu,
        })
    }

    /// Removes this node's namespaces whose VM is not among `live_vms`.
    pub(crate) fn sweep_vm_networks(&self, live_vms: &std::collections::HashSet<String>) {
        let prefix = self.netns_prefix();
        for netns in self.nm.vm_networks(&prefix) {
            let vm = &netns[prefix.len()..];
            if live_vms.contains(vm) {
                continue;
            }
            tracing::warn!(%netns, "removing an orphaned network namespace");
            if let Err(e) = self.nm.remove_vm_network(&netns) {
                tracing::warn!(%netns, error = %e, "cannot remove an orphaned network namespace");
            }
        }
    }
}
