//! The warm pool: VMs already restored from a template's memory image, warmed up (the
//! daemon answered once, so TCG has translated its code) and paused, waiting to become a
//! sandbox. Claiming one costs a `cont`, a handshake and one configure round trip.
//!
//! The pool keeps up to `target` members per image key that creates have asked for, refills
//! in the background after every claim, and stops filling (and sheds members) when the host
//! runs short of memory. Members are not sandboxes: they have no record, and a node that
//! restarts kills them as orphans and fills the pool again.

use space_node_proto::PoolShape;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;

use space_core::template::TemplateInfo;
use space_core::Resources;
use space_vmm::Vm;
use tokio::sync::Notify;

use crate::image::{ImageKey, MemoryImage};

/// Prefix of pool members' VM names (and run directories).
pub(crate) const MEMBER_PREFIX: &str = "pool-";
/// Fewer than this share of host memory available: stop filling and shed members.
pub(crate) const LOW_MEMORY_PERCENT: u64 = 20;

/// A paused VM restored from a memory image.
pub(crate) struct Member {
    pub name: String,
    pub vm: Vm,
    /// Its disk, in the pool's directory until claimed.
    pub disk: PathBuf,
    pub run_dir: PathBuf,
    pub image: MemoryImage,
}

/// What the pool keeps warm for one image key.
pub(crate) struct Shape {
    pub key: ImageKey,
    pub template: TemplateInfo,
    pub resources: Resources,
    pub members: VecDeque<Member>,
    /// Members being made right now.
    pub filling: usize,
}

/// Pool bookkeeping (the filling itself is done by the node, which owns the VMM).
pub(crate) struct Pool {
    target: usize,
    shapes: Mutex<HashMap<String, Shape>>,
    /// Set by [`Pool::drain`]: fills that finish later must discard their member.
    closed: std::sync::atomic::AtomicBool,
    /// Woken when a member was taken or a new shape is wanted.
    pub wake: Notify,
}

impl Pool {
    pub(crate) fn new(target: usize) -> Pool {
        Pool {
            target,
            shapes: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Shape>> {
        self.shapes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Members per shape the pool aims for (0 = no pool).
    pub(crate) fn target(&self) -> usize {
        self.target
    }

    /// A ready member for `key`, if any; wakes the filler to replace it.
    pub(crate) fn take(&self, key: &ImageKey) -> Option<Member> {
        let member = self
            .lock()
            .get_mut(&key.digest())
            .and_then(|s| s.members.pop_front());
        if member.is_some() {
            self.wake.notify_one();
        }
        member
    }

    /// Registers demand for `key` so the filler keeps members of it.
    pub(crate) fn want(&self, key: &ImageKey, template: &TemplateInfo, resources: &Resources) {
        if self.target == 0 || self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut shapes = self.lock();
        let digest = key.digest();
        if let std::collections::hash_map::Entry::Vacant(e) = shapes.entry(digest) {
            e.insert(Shape {
                key: key.clone(),
                template: template.clone(),
                resources: *resources,
                members: VecDeque::new(),
                filling: 0,
            });
            drop(shapes);
            self.wake.notify_one();
        }
    }

    /// The shape most in need of a member (fewest members + fills in flight below target),
    /// marking one fill as started. `max_parallel` bounds fills in flight over all shapes.
    pub(crate) fn next_fill(
        &self,
        max_parallel: usize,
    ) -> Option<(ImageKey, TemplateInfo, Resources)> {
        let mut shapes = self.lock();
        let in_flight: usize = shapes.values().map(|s| s.filling).sum();
        if in_flight >= max_parallel {
            return None;
        }
        let shape = shapes
            .values_mut()
            .filter(|s| s.members.len() + s.filling < self.target)
            .min_by_key(|s| s.members.len() + s.filling)?;
        shape.filling += 1;
        Some((shape.key.clone(), shape.template.clone(), shape.resources))
    }

    /// A fill finished: adds the member (if it worked) and clears the in-flight mark. Hands
    /// the member back if the pool was drained meanwhile (the caller discards it).
    pub(crate) fn filled(&self, key: &ImageKey, member: Option<Member>) -> Option<Member> {
        let mut shapes = self.lock();
        if let Some(shape) = shapes.get_mut(&key.digest()) {
            shape.filling = shape.filling.saturating_sub(1);
        }
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return member;
        }
        match shapes.get_mut(&key.digest()) {
            Some(shape) => {
                if let Some(m) = member {
                    shape.members.push_back(m);
                }
                None
            }
            None => member,
        }
    }

    /// Takes one member from the fullest shape (to shed memory).
    pub(crate) fn evict_one(&self) -> Option<Member> {
        let mut shapes = self.lock();
        shapes
            .values_mut()
            .max_by_key(|s| s.members.len())
            .and_then(|s| s.members.pop_back())
    }

    /// Forgets every shape of template `digest` (removed), handing back their members to
    /// discard; fills in flight for them are handed back when they finish.
    pub(crate) fn drain_template(&self, digest: &str) -> Vec<Member> {
        let mut shapes = self.lock();
        let gone: Vec<String> = shapes
            .iter()
            .filter(|(_, s)| s.template.digest == digest)
            .map(|(k, _)| k.clone())
            .collect();
        gone.iter()
            .filter_map(|k| shapes.remove(k))
            .flat_map(|s| s.members)
            .collect()
    }

    /// Fills in flight.
    pub(crate) fn filling(&self) -> usize {
        self.lock().values().map(|s| s.filling).sum()
    }

    /// Takes every member and closes the pool (shutdown).
    pub(crate) fn drain(&self) -> Vec<Member> {
        let mut shapes = self.lock();
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        shapes
            .values_mut()
            .flat_map(|s| s.members.drain(..))
            .collect()
    }

    /// Ready members per template name and shape.
    pub(crate) fn status(&self) -> Vec<PoolShape> {
        let mut out: Vec<PoolShape> = self
            .lock()
            .values()
            .map(|s| PoolShape {
                template: s.template.name.clone(),
                template_digest: s.template.digest.clone(),
                resources: s.resources,
                ready: s.members.len(),
                filling: s.filling,
                target: self.target,
            })
            .collect();
        out.sort_by(|a, b| a.template.cmp(&b.template));
        out
    }
}

/// Available memory as a share of total, in percent, from /proc/meminfo.
pub(crate) fn available_memory_percent() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    (total > 0).then(|| available * 100 / total)
}
