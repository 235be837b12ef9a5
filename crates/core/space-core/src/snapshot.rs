//! Snapshots of a sandbox: what one is, the per-sandbox schedule, retention that decays by
//! tier, and the file-level diff between two disk snapshots.
//!
//! - A **disk** snapshot is a reflink of the sandbox disk taken while the guest filesystems
//!   are frozen: crash-consistent, O(1) in the disk size, the VM keeps running.
//! - A **checkpoint** is memory + device state + disk at one instant: restoring it brings the
//!   processes back as they were.
//!
//! Retention only ever concerns snapshots the scheduler took ([`SnapshotTrigger::Schedule`]):
//! manual and fork snapshots are kept until someone deletes them. A snapshot taken
//! `persistent` also outlives its sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{SandboxId, SnapshotId};

/// Longest snapshot label, in characters.
pub const MAX_SNAPSHOT_LABEL_CHARS: usize = 128;
/// Shortest interval anywhere in a schedule or retention tier, in seconds.
pub const MIN_SNAPSHOT_INTERVAL_SECS: u64 = 10;
/// Longest interval of a schedule, in seconds (one year).
pub const MAX_SNAPSHOT_INTERVAL_SECS: u64 = 365 * 24 * 3600;
/// Most tiers in one retention policy.
pub const MAX_RETENTION_TIERS: usize = 8;
/// Longest a retention policy may keep a scheduled snapshot, in seconds (one year).
pub const MAX_RETENTION_SECS: u64 = 365 * 24 * 3600;
/// Changes returned by a snapshot diff when the request does not say.
pub const DEFAULT_DIFF_LIMIT: usize = 1000;
/// Most changes one snapshot diff returns; longer diffs are cut and marked `truncated`.
pub const MAX_DIFF_LIMIT: usize = 100_000;

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;
const WEEK: u64 = 7 * DAY;

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// The disk only: a reflink taken with the guest filesystems frozen (crash-consistent).
    Disk,
    /// Memory, device state and disk at one instant.
    Checkpoint,
}

impl SnapshotKind {
    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Disk => "disk",
            SnapshotKind::Checkpoint => "checkpoint",
        }
    }
}

impl fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotTrigger {
    /// Asked for through the API or CLI; kept until deleted.
    Manual,
    /// Taken by the sandbox's snapshot scheduler; pruned by its retention policy.
    Schedule,
    /// Taken to fork the sandbox; kept until deleted.
    Fork,
}

impl SnapshotTrigger {
    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotTrigger::Manual => "manual",
            SnapshotTrigger::Schedule => "schedule",
            SnapshotTrigger::Fork => "fork",
        }
    }
}

impl fmt::Display for SnapshotTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotInfo {
    /// Id.
    pub id: SnapshotId,
    /// The sandbox it is a snapshot of.
    pub sandbox_id: SandboxId,
    /// Disk snapshot or full checkpoint.
    pub kind: SnapshotKind,
    /// Why it was taken.
    pub trigger: SnapshotTrigger,
    /// When it was taken, ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Disk space only this snapshot holds: what deleting it would free. Changes as the
    /// sandbox writes and as other snapshots are deleted.
    pub exclusive_bytes: u64,
    /// Logical size of its files (disk image, saved state).
    pub total_bytes: u64,
    /// Free text given when it was taken (at most 128 printable characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Kept until deleted, also after its sandbox is deleted (then listed by
    /// `GET /v1/snapshots`), and never thinned by retention; new sandboxes can be created
    /// from it either way.
    #[serde(default)]
    pub persistent: bool,
    /// Kept in object storage too (a persistent snapshot of a sandbox whose
    /// `snapshot_storage` is `object_store`): new sandboxes can be created from it on any
    /// node, also once the node that took it is gone.
    #[serde(default)]
    pub stored: bool,
}

/// Why a snapshot label, schedule or retention policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The label is empty, too long, or has control characters.
    #[error("snapshot label must be 1 to {MAX_SNAPSHOT_LABEL_CHARS} printable characters")]
    InvalidLabel,
    /// A retention policy has no tiers or too many.
    #[error("a retention policy needs 1 to {MAX_RETENTION_TIERS} tiers, got {0}")]
    TierCount(usize),
    /// A tier's interval is too short.
    #[error("retention tier {tier}: every_secs must be at least {MIN_SNAPSHOT_INTERVAL_SECS}, got {every_secs}")]
    TierTooFrequent {
        /// Index of the tier (0-based).
        tier: usize,
        /// Its interval.
        every_secs: u64,
    },
    /// A tier keeps snapshots for less than its own interval.
    #[error("retention tier {tier}: keep_for_secs ({keep_for_secs}) must be at least every_secs ({every_secs})")]
    TierKeepsTooLittle {
        /// Index of the tier (0-based).
        tier: usize,
        /// Its interval.
        every_secs: u64,
        /// How long it keeps snapshots.
        keep_for_secs: u64,
    },
    /// Tiers are not ordered from fine to coarse.
    #[error("retention tier {tier}: every_secs and keep_for_secs must both be larger than those of tier {}", tier.saturating_sub(1))]
    TierOrder {
        /// Index (0-based) of the first tier not coarser than the one before it.
        tier: usize,
    },
    /// The policy keeps snapshots for too long.
    #[error("retention policy keeps snapshots for {keep_for_secs} s; at most {MAX_RETENTION_SECS} s (one year)")]
    RetentionTooLong {
        /// The longest keep_for_secs of the policy.
        keep_for_secs: u64,
    },
    /// A schedule interval is out of range.
    #[error("{field} must be between {MIN_SNAPSHOT_INTERVAL_SECS} and {MAX_SNAPSHOT_INTERVAL_SECS} seconds (or null to disable), got {value}")]
    Interval {
        /// The schedule field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

/// Checks a snapshot label: 1..=128 characters, none of them control characters.
pub fn validate_snapshot_label(label: &str) -> Result<(), SnapshotError> {
    let mut n = 0usize;
    for c in label.chars() {
        n += 1;
        if n > MAX_SNAPSHOT_LABEL_CHARS || c.is_control() {
            return Err(SnapshotError::InvalidLabel);
        }
    }
    if n == 0 {
        return Err(SnapshotError::InvalidLabel);
    }
    Ok(())
}

/// One tier of a retention policy: keep one snapshot per `every_secs` for `keep_for_secs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetentionTier {
    /// One snapshot is kept per interval of this many seconds.
    pub every_secs: u64,
    /// For snapshots up to this old, in seconds.
    pub keep_for_secs: u64,
}

impl RetentionTier {
    /// A tier keeping one snapshot per `every_secs` for `keep_for_secs`.
    pub const fn new(every_secs: u64, keep_for_secs: u64) -> Self {
        RetentionTier {
            every_secs,
            keep_for_secs,
        }
    }
}

/// Which scheduled snapshots to keep, thinning out with age: e.g. one per minute for the last
/// hour, one per hour for the last day, one per day for the last week.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Tiers from the finest (shortest interval, shortest window) to the coarsest.
    pub tiers: Vec<RetentionTier>,
}

impl Default for RetentionPolicy {
    /// Every minute for an hour, hourly for a day, daily for a week: about 91 snapshots.
    fn default() -> Self {
        RetentionPolicy {
            tiers: vec![
                RetentionTier::new(MINUTE, HOUR),
                RetentionTier::new(HOUR, DAY),
                RetentionTier::new(DAY, WEEK),
            ],
        }
    }
}

impl RetentionPolicy {
    /// The default for full checkpoints: every 15 minutes for 2 hours, hourly for a day,
    /// daily for a week.
    pub fn checkpoint_default() -> Self {
        RetentionPolicy {
            tiers: vec![
                RetentionTier::new(15 * MINUTE, 2 * HOUR),
                RetentionTier::new(HOUR, DAY),
                RetentionTier::new(DAY, WEEK),
            ],
        }
    }

    /// Checks the policy: 1..=8 tiers, each at least every 10 s and keeping at least one
    /// interval, ordered by strictly increasing interval and window, the whole at most a year.
    pub fn validate(&self) -> Result<(), SnapshotError> {
        if self.tiers.is_empty() || self.tiers.len() > MAX_RETENTION_TIERS {
            return Err(SnapshotError::TierCount(self.tiers.len()));
        }
        for (i, t) in self.tiers.iter().enumerate() {
            if t.every_secs < MIN_SNAPSHOT_INTERVAL_SECS {
                return Err(SnapshotError::TierTooFrequent {
                    tier: i,
                    every_secs: t.every_secs,
                });
            }
            if t.keep_for_secs < t.every_secs {
                return Err(SnapshotError::TierKeepsTooLittle {
                    tier: i,
                    every_secs: t.every_secs,
                    keep_for_secs: t.keep_for_secs,
                });
            }
            if t.keep_for_secs > MAX_RETENTION_SECS {
                return Err(SnapshotError::RetentionTooLong {
                    keep_for_secs: t.keep_for_secs,
                });
            }
            if i > 0 {
                let prev = self.tiers[i - 1];
                if t.every_secs <= prev.every_secs || t.keep_for_secs <= prev.keep_for_secs {
                    return Err(SnapshotError::TierOrder { tier: i });
                }
            }
        }
        Ok(())
    }

    /// The scheduled snapshots to keep at `now_ms`, given every scheduled snapshot of one
    /// kind as `(id, created_at_ms)`; the others are to be deleted.
    ///
    /// Each tier cuts time into buckets of `every_secs` **aligned to the Unix epoch** and,
    /// for every bucket that lies wholly inside its window (the bucket starts at most
    /// `keep_for_secs` before `now_ms`), keeps the oldest snapshot in the bucket. The newest
    /// snapshot is always kept; anything older than the last tier's window is dropped.
    ///
    /// Why buckets aligned to absolute time rather than counted back from `now`: a bucket's
    /// oldest snapshot is fixed as soon as the bucket has one (later snapshots are newer), and
    /// a bucket only ever leaves a window as time passes, never re-enters it. So a snapshot
    /// kept at one run stays kept until its bucket ages out, and a snapshot dropped at one run
    /// would not have been kept at any later run either: pruning every minute gives exactly
    /// the set that applying the policy once to the full history would give, and a dropped
    /// snapshot is never needed again. Buckets counted back from `now` shift at every run, so
    /// which snapshot is "the one of this hour" would keep changing, and a snapshot deleted a
    /// minute ago would be the one wanted now. Counting only buckets wholly inside the window
    /// keeps the same property at the window's edge and guarantees every kept snapshot is at
    /// most `keep_for_secs` old by some tier's reckoning.
    ///
    /// Invalid tiers (zero interval) are ignored rather than panicking; call
    /// [`RetentionPolicy::validate`] on input first.
    pub fn retain(&self, now_ms: i64, snapshots: &[(SnapshotId, i64)]) -> BTreeSet<SnapshotId> {
        let mut keep = BTreeSet::new();
        // Newest first by time; ties broken by id so the result does not depend on input order.
        if let Some((id, _)) = snapshots
            .iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
        {
            keep.insert(id.clone());
        }
        let now = i128::from(now_ms);
        for tier in &self.tiers {
            if tier.every_secs == 0 {
                continue;
            }
            let every = i128::from(tier.every_secs) * 1000;
            let cutoff = now - i128::from(tier.keep_for_secs) * 1000;
            // bucket index -> (created_at_ms, id) of its oldest snapshot
            let mut oldest: BTreeMap<i128, (i64, &SnapshotId)> = BTreeMap::new();
            for (id, at) in snapshots {
                let bucket = i128::from(*at).div_euclid(every);
                if bucket * every < cutoff {
                    continue; // the bucket is not wholly inside the window
                }
                oldest
                    .entry(bucket)
                    .and_modify(|cur| {
                        if (*at, id) < (cur.0, cur.1) {
                            *cur = (*at, id);
                        }
                    })
                    .or_insert((*at, id));
            }
            keep.extend(oldest.into_values().map(|(_, id)| id.clone()));
        }
        keep
    }
}

fn default_disk_every() -> Option<u64> {
    Some(MINUTE)
}

fn default_checkpoint_every() -> Option<u64> {
    Some(15 * MINUTE)
}

/// A sandbox's snapshot scheduler settings. `{}` is the default schedule; an interval of
/// `null` turns that kind of scheduled snapshot off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SnapshotSchedule {
    /// Take a disk snapshot this often, seconds; default 60, `null` for never.
    #[serde(default = "default_disk_every")]
    pub disk_every_secs: Option<u64>,
    /// Take a full checkpoint this often, seconds; default 900, `null` for never.
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every_secs: Option<u64>,
    /// Which scheduled disk snapshots to keep; default every minute for an hour, hourly for
    /// a day, daily for a week.
    #[serde(default)]
    pub disk_retention: RetentionPolicy,
    /// Which scheduled checkpoints to keep; default every 15 minutes for 2 hours, hourly for
    /// a day, daily for a week.
    #[serde(default = "RetentionPolicy::checkpoint_default")]
    pub checkpoint_retention: RetentionPolicy,
}

impl Default for SnapshotSchedule {
    fn default() -> Self {
        SnapshotSchedule {
            disk_every_secs: default_disk_every(),
            checkpoint_every_secs: default_checkpoint_every(),
            disk_retention: RetentionPolicy::default(),
            checkpoint_retention: RetentionPolicy::checkpoint_default(),
        }
    }
}

impl SnapshotSchedule {
    /// No scheduled snapshots at all.
    pub fn disabled() -> Self {
        SnapshotSchedule {
            disk_every_secs: None,
            checkpoint_every_secs: None,
            ..SnapshotSchedule::default()
        }
    }

    /// Checks the intervals (10 s to a year, or off) and both retention policies.
    pub fn validate(&self) -> Result<(), SnapshotError> {
        for (field, value) in [
            ("disk_every_secs", self.disk_every_secs),
            ("checkpoint_every_secs", self.checkpoint_every_secs),
        ] {
            if let Some(v) = value {
                if !(MIN_SNAPSHOT_INTERVAL_SECS..=MAX_SNAPSHOT_INTERVAL_SECS).contains(&v) {
                    return Err(SnapshotError::Interval { field, value: v });
                }
            }
        }
        self.disk_retention.validate()?;
        self.checkpoint_retention.validate()
    }

    /// How often snapshots of `kind` are taken, seconds; `None` when they are off.
    pub fn every_secs(&self, kind: SnapshotKind) -> Option<u64> {
        match kind {
            SnapshotKind::Disk => self.disk_every_secs,
            SnapshotKind::Checkpoint => self.checkpoint_every_secs,
        }
    }

    /// The retention policy for scheduled snapshots of `kind`.
    pub fn retention(&self, kind: SnapshotKind) -> &RetentionPolicy {
        match kind {
            SnapshotKind::Disk => &self.disk_retention,
            SnapshotKind::Checkpoint => &self.checkpoint_retention,
        }
    }

    /// Whether a scheduled snapshot of `kind` is due at `now_ms`, the last one having been
    /// taken at `last_ms` (`None`: never). Never due when that kind is off. A clock that went
    /// backwards (`now_ms < last_ms`) makes it due, so a clock step does not stop the
    /// schedule until the clock catches up.
    pub fn due(&self, kind: SnapshotKind, last_ms: Option<i64>, now_ms: i64) -> bool {
        let Some(every) = self.every_secs(kind) else {
            return false;
        };
        let Some(last) = last_ms else {
            return true;
        };
        let elapsed = i128::from(now_ms) - i128::from(last);
        elapsed < 0 || elapsed >= i128::from(every) * 1000
    }
}

/// How a path differs between two disk snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileChangeKind {
    /// Only in the newer snapshot.
    Added,
    /// Only in the older snapshot.
    Removed,
    /// In both, same type, different size, mode, owner, mtime or symlink target.
    Modified,
    /// In both, but of another type (e.g. a file replaced by a directory).
    TypeChanged,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileChange {
    /// Absolute path inside the guest filesystem (bytes that are not UTF-8 are replaced).
    pub path: String,
    /// What changed.
    pub kind: FileChangeKind,
    /// Size in the older snapshot (absent if the path was not there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_before: Option<u64>,
    /// Size in the newer snapshot (absent if the path is not there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_after: Option<u64>,
}

/// Files changed between two disk snapshots of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotDiff {
    /// The older snapshot.
    pub from: SnapshotId,
    /// The newer snapshot.
    pub to: SnapshotId,
    /// Changed paths, in path order (component by component, as a tree walk visits them).
    pub changes: Vec<FileChange>,
    /// The list was cut short (at the limit asked for, or at the walk's bounds); more paths
    /// may have changed.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<SnapshotId> {
        (0..n).map(|_| SnapshotId::generate()).collect()
    }

    #[test]
    fn kinds_and_triggers_serialise_snake_case() {
        assert_eq!(
            serde_json::to_string(&SnapshotKind::Checkpoint).unwrap(),
            "\"checkpoint\""
        );
        assert_eq!(
            serde_json::from_str::<SnapshotKind>("\"disk\"").unwrap(),
            SnapshotKind::Disk
        );
        assert_eq!(
            serde_json::to_string(&SnapshotTrigger::Schedule).unwrap(),
            "\"schedule\""
        );
        assert_eq!(
            serde_json::to_string(&FileChangeKind::TypeChanged).unwrap(),
            "\"type_changed\""
        );
        assert!(serde_json::from_str::<SnapshotKind>("\"memory\"").is_err());
    }

    #[test]
    fn info_round_trips_without_label() {
        let info = SnapshotInfo {
            id: SnapshotId::generate(),
            sandbox_id: SandboxId::generate(),
            kind: SnapshotKind::Disk,
            trigger: SnapshotTrigger::Manual,
            created_at_ms: 1_700_000_000_000,
            exclusive_bytes: 0,
            total_bytes: 1 << 30,
            label: None,
            persistent: false,
            stored: false,
        };
        let json = serde_json::to_string(&info).unwrap();
        assert!(!json.contains("label"), "{json}");
        assert_eq!(serde_json::from_str::<SnapshotInfo>(&json).unwrap(), info);
    }

    #[test]
    fn labels_are_bounded_and_printable() {
        assert!(validate_snapshot_label("before rm -rf").is_ok());
        assert!(validate_snapshot_label(&"é".repeat(128)).is_ok());
        assert_eq!(
            validate_snapshot_label(&"x".repeat(129)),
            Err(SnapshotError::InvalidLabel)
        );
        assert!(validate_snapshot_label("").is_err());
        assert!(validate_snapshot_label("a\nb").is_err());
        assert!(validate_snapshot_label("bell\u{7}").is_err());
    }

    #[test]
    fn default_policies_are_valid() {
        RetentionPolicy::default().validate().unwrap();
        RetentionPolicy::checkpoint_default().validate().unwrap();
        SnapshotSchedule::default().validate().unwrap();
        SnapshotSchedule::disabled().validate().unwrap();
    }

    #[test]
    fn bad_policies_are_refused_with_a_clear_message() {
        let p = |tiers: &[(u64, u64)]| RetentionPolicy {
            tiers: tiers
                .iter()
                .map(|&(e, k)| RetentionTier::new(e, k))
                .collect(),
        };
        assert_eq!(p(&[]).validate(), Err(SnapshotError::TierCount(0)));
        assert_eq!(
            p(&[(60, 3600); 9]).validate(),
            Err(SnapshotError::TierCount(9))
        );
        let err = p(&[(5, 3600)]).validate().unwrap_err();
        assert!(err.to_string().contains("at least 10"), "{err}");
        let err = p(&[(3600, 60)]).validate().unwrap_err();
        assert!(
            matches!(err, SnapshotError::TierKeepsTooLittle { .. }),
            "{err}"
        );
        let err = p(&[(60, 3600), (60, 7200)]).validate().unwrap_err();
        assert_eq!(err, SnapshotError::TierOrder { tier: 1 });
        assert!(err.to_string().contains("than those of tier 0"), "{err}");
        assert_eq!(
            p(&[(60, 7200), (3600, 3600)]).validate(),
            Err(SnapshotError::TierOrder { tier: 1 })
        );
        assert!(matches!(
            p(&[(DAY, 400 * DAY)]).validate(),
            Err(SnapshotError::RetentionTooLong { .. })
        ));
        p(&[(DAY, 365 * DAY)]).validate().unwrap();
    }

    #[test]
    fn schedule_defaults_from_empty_json() {
        let s: SnapshotSchedule = serde_json::from_str("{}").unwrap();
        assert_eq!(s, SnapshotSchedule::default());
        assert_eq!(s.disk_every_secs, Some(60));
        assert_eq!(s.checkpoint_every_secs, Some(900));
        assert_eq!(
            s.checkpoint_retention.tiers[0],
            RetentionTier::new(900, 7200)
        );
        // null turns a kind off; a partial override keeps the other defaults.
        let s: SnapshotSchedule =
            serde_json::from_str(r#"{"checkpoint_every_secs": null, "disk_every_secs": 30}"#)
                .unwrap();
        assert_eq!(s.checkpoint_every_secs, None);
        assert_eq!(s.disk_every_secs, Some(30));
        assert_eq!(s.disk_retention, RetentionPolicy::default());
        assert!(serde_json::from_str::<SnapshotSchedule>(r#"{"disk_every": 30}"#).is_err());
        let round: SnapshotSchedule =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(round, s);
    }

    #[test]
    fn schedule_validation() {
        let mut s = SnapshotSchedule {
            disk_every_secs: Some(5),
            ..Default::default()
        };
        let err = s.validate().unwrap_err();
        assert!(err.to_string().contains("disk_every_secs"), "{err}");
        s.disk_every_secs = Some(10);
        s.validate().unwrap();
        s.checkpoint_every_secs = Some(u64::MAX);
        assert!(s.validate().is_err());
        s.checkpoint_every_secs = None;
        s.disk_retention.tiers.clear();
        assert!(s.validate().is_err());
    }

    #[test]
    fn due() {
        let s = SnapshotSchedule::default();
        let t = 1_700_000_000_000;
        assert!(s.due(SnapshotKind::Disk, None, t));
        assert!(!s.due(SnapshotKind::Disk, Some(t), t + 59_999));
        assert!(s.due(SnapshotKind::Disk, Some(t), t + 60_000));
        assert!(!s.due(SnapshotKind::Checkpoint, Some(t), t + 60_000));
        assert!(s.due(SnapshotKind::Checkpoint, Some(t), t + 900_000));
        assert!(
            s.due(SnapshotKind::Disk, Some(t), t - 1),
            "clock stepped back"
        );
        let off = SnapshotSchedule::disabled();
        assert!(!off.due(SnapshotKind::Disk, None, t));
        assert!(!off.due(SnapshotKind::Checkpoint, Some(0), t));
        // Extreme values do not overflow.
        assert!(s.due(SnapshotKind::Disk, Some(i64::MIN), i64::MAX));
    }

    #[test]
    fn retain_keeps_newest_and_drops_the_very_old() {
        let p = RetentionPolicy::default();
        let id = ids(3);
        let now = 100 * WEEK as i64 * 1000;
        // Everything far older than a week: only the newest survives.
        let old = vec![
            (id[0].clone(), now - 30 * DAY as i64 * 1000),
            (id[1].clone(), now - 20 * DAY as i64 * 1000),
        ];
        assert_eq!(p.retain(now, &old), BTreeSet::from([id[1].clone()]));
        assert!(p.retain(now, &[]).is_empty());
        // Two snapshots in one minute bucket: the oldest of it is kept, and the newest.
        let m = now - now.rem_euclid(60_000);
        let same = vec![
            (id[0].clone(), m + 1_000),
            (id[1].clone(), m + 2_000),
            (id[2].clone(), m + 3_000),
        ];
        assert_eq!(
            p.retain(now.max(m + 3_000), &same),
            BTreeSet::from([id[0].clone(), id[2].clone()])
        );
        // A zero-interval tier (not validated) does not panic.
        let bad = RetentionPolicy {
            tiers: vec![RetentionTier::new(0, 0)],
        };
        assert_eq!(bad.retain(now, &same).len(), 1);
    }

    /// A week (plus a day) of one snapshot a minute, pruned every minute as the scheduler
    /// does. The count stays near 60 + 24 + 7, and the pruned set is always exactly what the
    /// policy keeps from the full, never-pruned history: nothing dropped is ever wanted again.
    #[test]
    fn week_of_minute_snapshots_pruned_every_minute_is_stable() {
        let p = RetentionPolicy::default();
        // Start at an odd offset so buckets and snapshot times are not trivially aligned.
        let start: i64 = 1_700_000_000_000 + 17_345;
        let minutes = (WEEK + DAY) / MINUTE;
        let mut full: Vec<(SnapshotId, i64)> = Vec::new();
        let mut live: Vec<(SnapshotId, i64)> = Vec::new();
        let mut dropped: BTreeSet<SnapshotId> = BTreeSet::new();
        let mut max_count = 0;
        for i in 0..minutes as i64 {
            // A little jitter, as a real scheduler has.
            let now = start + i * 60_000 + (i * 7919 % 1500);
            let snap = (SnapshotId::generate(), now);
            full.push(snap.clone());
            live.push(snap);
            let keep = p.retain(now, &live);
            for (id, _) in &live {
                if !keep.contains(id) {
                    dropped.insert(id.clone());
                }
            }
            live.retain(|(id, _)| keep.contains(id));
            assert!(keep.iter().all(|id| !dropped.contains(id)));
            max_count = max_count.max(live.len());
            if i % 97 == 0 || i == minutes as i64 - 1 {
                let ideal = p.retain(now, &full);
                let got: BTreeSet<_> = live.iter().map(|(id, _)| id.clone()).collect();
                assert_eq!(got, ideal, "minute {i}: pruned set differs from the ideal");
            }
            if i as u64 >= WEEK / MINUTE {
                // A full week in: one per minute of the last hour, per hour of the last day,
                // per day of the last week (the tiers overlap at aligned boundaries).
                assert!(
                    (85..=92).contains(&live.len()),
                    "minute {i}: {} snapshots kept",
                    live.len()
                );
            }
        }
        assert!(max_count <= 92, "peak {max_count}");
        // Every kept snapshot is younger than the last tier's window, except the newest.
        let now = live.last().unwrap().1;
        assert!(live.iter().all(|(_, at)| now - at <= (WEEK * 1000) as i64));
        // The minute tier: one per minute of the last hour.
        let last_hour = live
            .iter()
            .filter(|(_, at)| now - at < (HOUR * 1000) as i64)
            .count();
        assert!((59..=61).contains(&last_hour), "{last_hour}");
    }

    /// The same stability with snapshots at irregular times (scheduler pauses, bursts of
    /// snapshots) and pruning at irregular times.
    #[test]
    fn irregular_history_prunes_stably() {
        let p = RetentionPolicy::checkpoint_default();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut now: i64 = 1_600_000_000_000;
        let mut full = Vec::new();
        let mut live: Vec<(SnapshotId, i64)> = Vec::new();
        for step in 0..3000 {
            now += match rand(10) {
                0 => (rand(3 * DAY) * 1000) as i64, // a long pause
                1..=3 => rand(2000) as i64,         // a burst
                _ => (rand(30 * MINUTE) * 1000) as i64,
            };
            let snap = (SnapshotId::generate(), now);
            full.push(snap.clone());
            live.push(snap);
            if rand(3) == 0 {
                let keep = p.retain(now, &live);
                live.retain(|(id, _)| keep.contains(id));
            }
            if step % 50 == 0 {
                let ideal = p.retain(now, &full);
                let got = p.retain(now, &live);
                assert_eq!(got, ideal, "step {step}");
            }
        }
    }
}
