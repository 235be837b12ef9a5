//! What a create gives a new sandbox beside what it starts from: one [`SandboxSettings`] for
//! both kinds of create (from a template, [`crate::CreateSandbox`], and from a snapshot,
//! [`crate::CreateFromSnapshot`]), and the one place that validates the settings and writes
//! them into the new sandbox's record. Pure.

use std::collections::BTreeMap;

use space_core::egress::{EgressCeiling, EgressPolicy};
use space_secrets::ProjectId;

use crate::{NodeError, SandboxRecord, SandboxSettings};

/// What a new sandbox inherits where its settings say nothing: from a template, nothing but
/// the node's default egress policy; from a snapshot, its source sandbox's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inherited {
    pub env: BTreeMap<String, String>,
    pub project: Option<ProjectId>,
    pub egress: EgressPolicy,
}

/// Validates the `settings` over what the sandbox inherits (its egress policy within the
/// operator's `ceiling`) and writes them into its `record`; on an error the record is
/// left as it was.
pub(crate) fn apply(
    settings: &SandboxSettings,
    inherited: Inherited,
    ceiling: &EgressCeiling,
    record: &mut SandboxRecord,
) -> Result<(), NodeError> {
    let mut env = inherited.env;
    env.extend(settings.env.clone());
    space_core::process::validate_env(&env)
        .map_err(|k| NodeError::Invalid(format!("bad environment variable {k:?}")))?;
    let egress = settings.egress.clone().unwrap_or(inherited.egress);
    ceiling.check(&egress)?;
    let schedule = settings.snapshots.clone().unwrap_or_default();
    schedule
        .validate()
        .map_err(|e| NodeError::Invalid(format!("bad snapshot schedule: {e}")))?;
    record.env = env;
    record.on_crash = settings.on_crash;
    record.auto_pause_secs = settings.auto_pause_secs;
    record.snapshots = schedule;
    record.tenant = Some(settings.tenant.clone());
    record.project = settings.project.clone().or(inherited.project);
    record.egress = egress;
    record.seal_at_rest = settings.seal_at_rest;
    Ok(())
}

#[cfg(test)]
mod tests {
    use space_core::sandbox::CrashPolicy;
    use space_core::{Resources, SandboxId, SandboxState, SnapshotSchedule, TenantId};

    use super::*;

    fn record() -> SandboxRecord {
        SandboxRecord::new(
            SandboxId::generate(),
            "base".into(),
            "digest".into(),
            Resources::default(),
            SandboxState::Creating,
        )
    }

    fn settings() -> SandboxSettings {
        SandboxSettings {
            env: BTreeMap::from([("A".into(), "mine".into())]),
            on_crash: CrashPolicy::default(),
            auto_pause_secs: Some(600),
            snapshots: None,
            tenant: TenantId::generate(),
            project: None,
            egress: None,
            seal_at_rest: false,
        }
    }

    #[test]
    fn settings_win_and_what_they_leave_unset_is_inherited() {
        let inherited = Inherited {
            env: BTreeMap::from([("A".into(), "theirs".into()), ("B".into(), "kept".into())]),
            project: Some("apollo".parse().expect("project")),
            egress: EgressPolicy::allow_all_public(),
        };
        let s = settings();
        let mut rec = record();
        apply(&s, inherited.clone(), &EgressCeiling::default(), &mut rec).expect("valid");
        assert_eq!(rec.env["A"], "mine");
        assert_eq!(rec.env["B"], "kept");
        assert_eq!(rec.project, inherited.project);
        assert_eq!(rec.egress, inherited.egress);
        assert_eq!(rec.tenant.as_ref(), Some(&s.tenant));
        assert_eq!(rec.auto_pause_secs, Some(600));
        assert_eq!(rec.snapshots, SnapshotSchedule::default());

        let own = SandboxSettings {
            project: Some("hermes".parse().expect("project")),
            egress: Some(EgressPolicy::default()),
            ..settings()
        };
        apply(&own, inherited, &EgressCeiling::default(), &mut rec).expect("valid");
        assert_eq!(rec.project, own.project);
        assert_eq!(Some(rec.egress), own.egress);
    }

    #[test]
    fn bad_settings_are_refused_and_change_nothing() {
        let before = record();
        let mut rec = before.clone();
        let bad_env = SandboxSettings {
            env: BTreeMap::from([("NOT=OK".into(), "x".into())]),
            ..settings()
        };
        let ceiling = EgressCeiling::default();
        let err = apply(&bad_env, Inherited::default(), &ceiling, &mut rec).unwrap_err();
        assert!(matches!(err, NodeError::Invalid(m) if m.contains("NOT=OK")));
        // An inherited variable is checked too: the merged environment is what runs.
        let inherited = Inherited {
            env: BTreeMap::from([("".into(), "x".into())]),
            ..Inherited::default()
        };
        assert!(apply(&settings(), inherited, &EgressCeiling::default(), &mut rec).is_err());
        let bad_schedule = SandboxSettings {
            snapshots: Some(SnapshotSchedule {
                disk_every_secs: Some(1),
                ..SnapshotSchedule::default()
            }),
            ..settings()
        };
        let err = apply(&bad_schedule, Inherited::default(), &ceiling, &mut rec).unwrap_err();
        assert!(matches!(err, NodeError::Invalid(m) if m.contains("schedule")));
        // A policy beyond the operator's ceiling (loopback, unless granted).
        let beyond = SandboxSettings {
            egress: Some(EgressPolicy {
                mode: space_core::egress::EgressMode::Allowlist,
                rules: vec![space_core::egress::EgressRule::allow(
                    "127.0.0.1/32".parse::<ipnet::IpNet>().expect("cidr"),
                )],
            }),
            ..settings()
        };
        let err = apply(&beyond, Inherited::default(), &ceiling, &mut rec).unwrap_err();
        assert!(matches!(err, NodeError::BeyondCeiling(_)), "{err}");
        assert_eq!(err.code(), space_core::ErrorCode::EgressBeyondCeiling);
        assert_eq!(rec, before);
    }
}
