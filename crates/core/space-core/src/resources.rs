//! Sandbox resources (vCPUs, memory, disk) and admission against node capacity.

use serde::{Deserialize, Serialize};

/// What one sandbox is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Virtual CPUs (1..=16).
    pub vcpus: u32,
    /// Guest memory in MiB (128..=65536).
    pub memory_mib: u32,
    /// Root disk size in MiB; the root filesystem is grown to this size at boot.
    pub disk_mib: u32,
}

/// Bounds on a single sandbox, independent of any node.
pub const MAX_VCPUS: u32 = 16;
/// Smallest guest memory the kernel and daemon boot in.
pub const MIN_MEMORY_MIB: u32 = 128;
/// Largest guest memory one sandbox may ask for.
pub const MAX_MEMORY_MIB: u32 = 64 * 1024;
/// Largest root disk one sandbox may ask for.
pub const MAX_DISK_MIB: u32 = 1024 * 1024;

impl Default for Resources {
    fn default() -> Self {
        Self {
            vcpus: 1,
            memory_mib: 512,
            disk_mib: 2048,
        }
    }
}

/// Why resources were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourcesError {
    /// A field is outside the bounds any sandbox may have.
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange {
        field: &'static str,
        min: u64,
        max: u64,
        value: u64,
    },
    /// The node does not have that much left.
    #[error("not enough {what} on the node: requested {requested}, free {free} of {total}")]
    Exhausted {
        what: &'static str,
        requested: u64,
        free: u64,
        total: u64,
    },
}

impl Resources {
    /// Checks the per-sandbox bounds. `min_disk_mib` is the template's image size.
    pub fn validate(&self, min_disk_mib: u32) -> Result<(), ResourcesError> {
        range("vcpus", self.vcpus.into(), 1, MAX_VCPUS.into())?;
        range(
            "memory_mib",
            self.memory_mib.into(),
            MIN_MEMORY_MIB.into(),
            MAX_MEMORY_MIB.into(),
        )?;
        range(
            "disk_mib",
            self.disk_mib.into(),
            min_disk_mib.into(),
            MAX_DISK_MIB.into(),
        )?;
        Ok(())
    }
}

fn range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ResourcesError> {
    if value < min || value > max {
        return Err(ResourcesError::OutOfRange {
            field,
            min,
            max,
            value,
        });
    }
    Ok(())
}

/// What a node can give to sandboxes in total, and what it has given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeCapacity {
    /// vCPUs the node may hand out (may overcommit physical cores).
    pub vcpus: u32,
    /// Guest memory the node may hand out, MiB.
    pub memory_mib: u64,
    /// Sandbox disk the node may hand out, MiB (disks are sparse; this bounds the worst case).
    pub disk_mib: u64,
}

impl NodeCapacity {
    /// Admits `req` if, added to `used`, it fits in this capacity.
    pub fn admit(&self, used: &NodeCapacity, req: &Resources) -> Result<(), ResourcesError> {
        fits(
            "vcpus",
            req.vcpus.into(),
            used.vcpus.into(),
            self.vcpus.into(),
        )?;
        fits(
            "memory_mib",
            req.memory_mib.into(),
            used.memory_mib,
            self.memory_mib,
        )?;
        fits(
            "disk_mib",
            req.disk_mib.into(),
            used.disk_mib,
            self.disk_mib,
        )?;
        Ok(())
    }

    /// Sum of the resources of a set of sandboxes.
    pub fn sum<'a>(items: impl IntoIterator<Item = &'a Resources>) -> NodeCapacity {
        items.into_iter().fold(
            NodeCapacity {
                vcpus: 0,
                memory_mib: 0,
                disk_mib: 0,
            },
            |acc, r| NodeCapacity {
                vcpus: acc.vcpus + r.vcpus,
                memory_mib: acc.memory_mib + u64::from(r.memory_mib),
                disk_mib: acc.disk_mib + u64::from(r.disk_mib),
            },
        )
    }
}

fn fits(what: &'static str, requested: u64, used: u64, total: u64) -> Result<(), ResourcesError> {
    let free = total.saturating_sub(used);
    if requested > free {
        return Err(ResourcesError::Exhausted {
            what,
            requested,
            free,
            total,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(Resources::default().validate(64).is_ok());
        let r = Resources {
            vcpus: 0,
            ..Resources::default()
        };
        assert!(matches!(
            r.validate(64),
            Err(ResourcesError::OutOfRange { field: "vcpus", .. })
        ));
        let r = Resources {
            disk_mib: 10,
            ..Resources::default()
        };
        assert!(matches!(
            r.validate(64),
            Err(ResourcesError::OutOfRange {
                field: "disk_mib",
                ..
            })
        ));
    }

    #[test]
    fn admission() {
        let cap = NodeCapacity {
            vcpus: 4,
            memory_mib: 1024,
            disk_mib: 10_000,
        };
        let used = NodeCapacity::sum(&[Resources {
            vcpus: 1,
            memory_mib: 512,
            disk_mib: 1000,
        }]);
        assert!(cap
            .admit(
                &used,
                &Resources {
                    vcpus: 1,
                    memory_mib: 512,
                    disk_mib: 1000
                }
            )
            .is_ok());
        let err = cap.admit(
            &used,
            &Resources {
                vcpus: 1,
                memory_mib: 1024,
                disk_mib: 1000,
            },
        );
        assert!(matches!(
            err,
            Err(ResourcesError::Exhausted {
                what: "memory_mib",
                free: 512,
                ..
            })
        ));
    }
}
