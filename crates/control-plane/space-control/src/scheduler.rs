//! Where a new sandbox goes: the placement rule of the many-node control plane (issue 14),
//! decided from what the nodes last reported. Pure: the caller reads the nodes (their
//! status) and records the placement; nothing here does I/O, so every rule is unit-tested
//! here. [`crate::nodes::Nodes::place`] is the caller.
//!
//! The rules, in order:
//! 1. Only a [`NodeState::Ready`] node takes placements: a cordoned one takes none, a lost
//!    one cannot. A retry names the nodes that already failed the create
//!    ([`PlacementRequest::excluded`]), so it goes elsewhere and never runs twice on one.
//! 2. The sandbox must fit in the node's free capacity (vCPUs, memory, disk), as the
//!    node's own admission will check it.
//! 3. Template locality: a node with a ready warm-pool member of the template first (a
//!    claim), then one with the template's memory image (a restore), then one with the
//!    template (a cold boot), then any (which fetches the template from the object store
//!    first).
//! 4. Spread: the node whose busiest resource would be the least used after the placement,
//!    then the one with fewer sandboxes, then the smaller name (so a decision is
//!    reproducible).

use space_core::resources::{NodeCapacity, Resources};
use space_core::ErrorCode;
use space_node_proto::NodeStatus;

/// Whether a node takes placements (the API's node state).
pub use space_core::cluster::NodeState;

/// A node as its last heartbeat described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node's name (what a sandbox's row records as its node).
    pub name: String,
    /// Whether it takes placements.
    pub state: NodeState,
    /// What it reported of itself (`None`: it did not say; it is not placed on).
    pub status: Option<NodeStatus>,
}

/// A node open to this placement, with what it reported.
struct Open<'a> {
    name: &'a str,
    status: &'a NodeStatus,
}

/// What is to be placed.
#[derive(Debug, Clone, Copy)]
pub struct PlacementRequest<'a> {
    /// The sandbox's resources.
    pub resources: Resources,
    /// Digest of the template it boots from.
    pub template_digest: &'a str,
    /// Nodes not to use: those that already failed this create.
    pub excluded: &'a [String],
}

/// How warm the chosen node is for the template (best first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Locality {
    /// A warm-pool member of the template is ready there.
    WarmPool,
    /// Its memory image is there.
    MemoryImage,
    /// The template is there: a cold boot.
    Template,
    /// Not even the template: it fetches it, then boots cold.
    Cold,
}

/// Where the sandbox goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node's name.
    pub node: String,
    /// How warm it is for the template.
    pub locality: Locality,
}

/// Why nothing fits (answered `507 insufficient_capacity` with this as the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoPlacement {
    /// No node has registered.
    #[error("no node is registered")]
    NoNodes,
    /// Every node is cordoned, lost or already failed this create.
    #[error("no node takes new sandboxes ({cordoned} cordoned, {lost} lost, {excluded} already failed this create)")]
    NoneReady {
        /// Cordoned nodes.
        cordoned: usize,
        /// Lost nodes.
        lost: usize,
        /// Ready nodes the request excluded.
        excluded: usize,
    },
    /// Ready nodes exist, but none has room.
    #[error(
        "no node has room for {} vCPUs, {} MiB of memory and {} MiB of disk (the most free on a ready node: {} vCPUs, {} MiB of memory, {} MiB of disk)",
        requested.vcpus, requested.memory_mib, requested.disk_mib,
        most_free.vcpus, most_free.memory_mib, most_free.disk_mib
    )]
    NoRoom {
        /// What was asked for.
        requested: Resources,
        /// The most of each resource free on any one ready node (not necessarily the same).
        most_free: NodeCapacity,
    },
}

impl NoPlacement {
    /// The API's code for it.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InsufficientCapacity
    }
}

/// Chooses the node for `req` among `nodes`.
pub fn place(nodes: &[NodeView], req: &PlacementRequest<'_>) -> Result<Placement, NoPlacement> {
    if nodes.is_empty() {
        return Err(NoPlacement::NoNodes);
    }
    let open: Vec<Open<'_>> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Ready && !req.excluded.contains(&n.name))
        .filter_map(|n| {
            n.status.as_ref().map(|status| Open {
                name: &n.name,
                status,
            })
        })
        .collect();
    if open.is_empty() {
        let count = |s: NodeState| nodes.iter().filter(|n| n.state == s).count();
        return Err(NoPlacement::NoneReady {
            cordoned: count(NodeState::Cordoned),
            lost: count(NodeState::Lost),
            excluded: nodes.iter().filter(|n| n.state == NodeState::Ready).count(),
        });
    }
    open.iter()
        .filter(|n| {
            n.status
                .capacity
                .admit(&n.status.used, &req.resources)
                .is_ok()
        })
        .map(|n| (locality(n, req.template_digest), n))
        .min_by_key(|(locality, n)| {
            (
                *locality,
                busiest_after(n, &req.resources),
                n.status.sandboxes,
                n.name,
            )
        })
        .map(|(locality, n)| Placement {
            node: n.name.to_owned(),
            locality,
        })
        .ok_or_else(|| NoPlacement::NoRoom {
            requested: req.resources,
            most_free: most_free(&open),
        })
}

fn locality(node: &Open<'_>, template_digest: &str) -> Locality {
    if node
        .status
        .pool_ready
        .get(template_digest)
        .is_some_and(|n| *n > 0)
    {
        Locality::WarmPool
    } else if node.status.memory_images.contains(template_digest) {
        Locality::MemoryImage
    } else if node.status.templates.contains(template_digest) {
        Locality::Template
    } else {
        Locality::Cold
    }
}

/// The use of the node's busiest resource once `add` is placed, in parts per million
/// (integers, so equal loads compare equal).
fn busiest_after(node: &Open<'_>, add: &Resources) -> u64 {
    // A resource the node has none of is full.
    let share = |used: u64, add: u64, total: u64| {
        used.saturating_add(add)
            .saturating_mul(1_000_000)
            .checked_div(total)
            .unwrap_or(u64::MAX)
    };
    [
        share(
            node.status.used.vcpus.into(),
            add.vcpus.into(),
            node.status.capacity.vcpus.into(),
        ),
        share(
            node.status.used.memory_mib,
            add.memory_mib.into(),
            node.status.capacity.memory_mib,
        ),
        share(
            node.status.used.disk_mib,
            add.disk_mib.into(),
            node.status.capacity.disk_mib,
        ),
    ]
    .into_iter()
    .max()
    .unwrap_or(u64::MAX)
}

fn most_free(nodes: &[Open<'_>]) -> NodeCapacity {
    let free = |n: &Open<'_>| NodeCapacity {
        vcpus: n.status.capacity.vcpus.saturating_sub(n.status.used.vcpus),
        memory_mib: n
            .status
            .capacity
            .memory_mib
            .saturating_sub(n.status.used.memory_mib),
        disk_mib: n
            .status
            .capacity
            .disk_mib
            .saturating_sub(n.status.used.disk_mib),
    };
    nodes.iter().map(free).fold(
        NodeCapacity {
            vcpus: 0,
            memory_mib: 0,
            disk_mib: 0,
        },
        |a, f| NodeCapacity {
            vcpus: a.vcpus.max(f.vcpus),
            memory_mib: a.memory_mib.max(f.memory_mib),
            disk_mib: a.disk_mib.max(f.disk_mib),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "sha256:template";
    const SMALL: Resources = Resources {
        vcpus: 1,
        memory_mib: 512,
        disk_mib: 2048,
    };

    fn cap(vcpus: u32, memory_mib: u64, disk_mib: u64) -> NodeCapacity {
        NodeCapacity {
            vcpus,
            memory_mib,
            disk_mib,
        }
    }

    fn node(name: &str, used: NodeCapacity) -> NodeView {
        NodeView {
            name: name.to_owned(),
            state: NodeState::Ready,
            status: Some(NodeStatus {
                capacity: cap(16, 16 * 1024, 100 * 1024),
                used,
                sandboxes: 0,
                memory_images: Default::default(),
                templates: Default::default(),
                templates_fetched: 0,
                pool_ready: Default::default(),
                credentials_revision: 0,
            }),
        }
    }

    fn idle(name: &str) -> NodeView {
        node(name, cap(0, 0, 0))
    }

    fn req(excluded: &[String]) -> PlacementRequest<'_> {
        PlacementRequest {
            resources: SMALL,
            template_digest: T,
            excluded,
        }
    }

    fn placed(nodes: &[NodeView]) -> String {
        place(nodes, &req(&[])).expect("placed").node
    }

    #[test]
    fn spreads_over_the_least_used_node_and_is_reproducible() {
        let nodes = [
            node("a", cap(8, 1024, 0)),
            node("b", cap(2, 8 * 1024, 0)),
            node("c", cap(2, 1024, 0)),
        ];
        // a is busiest by vCPUs (9/16 after), b by memory (8.5 GiB of 16): c is least used.
        assert_eq!(placed(&nodes), "c");
        // Equal loads: fewer sandboxes, then the name.
        let mut twins = [idle("y"), idle("x")];
        assert_eq!(placed(&twins), "x");
        twins[1].status.as_mut().unwrap().sandboxes = 3;
        assert_eq!(placed(&twins), "y");
    }

    #[test]
    fn template_locality_comes_before_spread() {
        let mut warm = node("busy-warm", cap(12, 12 * 1024, 0));
        warm.status
            .as_mut()
            .unwrap()
            .pool_ready
            .insert(T.to_owned(), 1);
        let mut imaged = node("imaged", cap(6, 6 * 1024, 0));
        imaged
            .status
            .as_mut()
            .unwrap()
            .memory_images
            .insert(T.to_owned());
        let cold = idle("cold");
        let got = place(&[cold.clone(), imaged.clone(), warm.clone()], &req(&[])).unwrap();
        assert_eq!(
            (got.node.as_str(), got.locality),
            ("busy-warm", Locality::WarmPool)
        );
        // A pool with no ready member is no better than none.
        warm.status
            .as_mut()
            .unwrap()
            .pool_ready
            .insert(T.to_owned(), 0);
        let got = place(&[cold.clone(), imaged, warm], &req(&[])).unwrap();
        assert_eq!(
            (got.node.as_str(), got.locality),
            ("imaged", Locality::MemoryImage)
        );
        // Another template's image does not count.
        let mut other = idle("other");
        other
            .status
            .as_mut()
            .unwrap()
            .memory_images
            .insert("sha256:other".to_owned());
        let got = place(&[other.clone()], &req(&[])).unwrap();
        assert_eq!(got.locality, Locality::Cold);
        // A node with the template beats one that would fetch it, however idle.
        let mut has = node("has-template", cap(8, 8 * 1024, 0));
        has.status.as_mut().unwrap().templates.insert(T.to_owned());
        let got = place(&[other, has], &req(&[])).unwrap();
        assert_eq!(
            (got.node.as_str(), got.locality),
            ("has-template", Locality::Template)
        );
    }

    #[test]
    fn only_ready_nodes_with_room_take_the_sandbox() {
        let mut cordoned = idle("cordoned");
        cordoned.state = NodeState::Cordoned;
        let mut lost = idle("lost");
        lost.state = NodeState::Lost;
        let full = node("full", cap(16, 0, 0));
        let nearly = node("nearly", cap(0, 16 * 1024 - 512, 0));
        assert_eq!(
            placed(&[cordoned.clone(), lost.clone(), full.clone(), nearly]),
            "nearly",
            "exactly the memory left fits"
        );
        let tight = node("tight", cap(0, 16 * 1024 - 511, 0));
        assert_eq!(
            place(&[cordoned.clone(), full, tight], &req(&[])),
            Err(NoPlacement::NoRoom {
                requested: SMALL,
                most_free: cap(16, 16 * 1024, 100 * 1024),
            }),
            "the most free of each resource, over ready nodes"
        );
        assert_eq!(
            place(&[cordoned, lost], &req(&[])),
            Err(NoPlacement::NoneReady {
                cordoned: 1,
                lost: 1,
                excluded: 0
            })
        );
        assert_eq!(place(&[], &req(&[])), Err(NoPlacement::NoNodes));
    }

    #[test]
    fn a_retry_goes_elsewhere_or_nowhere() {
        let nodes = [idle("a"), node("b", cap(4, 4096, 0))];
        let failed = ["a".to_owned()];
        assert_eq!(place(&nodes, &req(&failed)).unwrap().node, "b");
        let both = ["a".to_owned(), "b".to_owned()];
        let err = place(&nodes, &req(&both)).unwrap_err();
        assert_eq!(
            err,
            NoPlacement::NoneReady {
                cordoned: 0,
                lost: 0,
                excluded: 2
            }
        );
        assert_eq!(err.code(), ErrorCode::InsufficientCapacity);
        assert!(err.to_string().contains("2 already failed"), "{err}");
    }

    #[test]
    fn a_node_reporting_no_capacity_takes_nothing_and_the_reason_reads_well() {
        let mut empty = idle("empty");
        empty.status.as_mut().unwrap().capacity = cap(0, 0, 0);
        let err = place(&[empty], &req(&[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no node has room for 1 vCPUs, 512 MiB of memory and 2048 MiB of disk (the most \
             free on a ready node: 0 vCPUs, 0 MiB of memory, 0 MiB of disk)"
        );
    }
}
