//! Durable sandbox records: one JSON file per sandbox, rewritten atomically on every
//! lifecycle transition, so the node knows after a crash what each sandbox was doing.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use space_core::SandboxId;

use crate::SandboxRecord;

/// Directory of `<sandbox id>.json` files.
#[derive(Debug, Clone)]
pub struct RecordStore {
    dir: PathBuf,
}

impl RecordStore {
    /// Opens (creating) the directory.
    pub fn open(dir: &Path) -> std::io::Result<RecordStore> {
        fs::create_dir_all(dir)?;
        Ok(RecordStore {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes the record atomically (temp file, fsync, rename).
    pub fn save(&self, record: &SandboxRecord) -> std::io::Result<()> {
        let path = self.path(&record.id);
        let tmp = self.dir.join(format!(".{}.tmp", record.id));
        let json = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Every readable record; unreadable files are reported and skipped (never fatal).
    pub fn load_all(&self) -> std::io::Result<Vec<SandboxRecord>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match fs::read(&path).map_err(|e| e.to_string()).and_then(|b| {
                serde_json::from_slice::<SandboxRecord>(&b).map_err(|e| e.to_string())
            }) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "skipping unreadable sandbox record")
                }
            }
        }
        Ok(out)
    }

    /// Removes a record file (used when pruning old deleted sandboxes).
    pub fn remove(&self, id: &SandboxId) -> std::io::Result<()> {
        match fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::{Resources, SandboxState};

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path()).unwrap();
        let rec = SandboxRecord {
            id: SandboxId::generate(),
            template: "busybox".into(),
            template_digest: "d".into(),
            resources: Resources::default(),
            state: SandboxState::Creating,
            failure_reason: None,
            created_at_ms: 1,
            create_latency_ms: None,
            vmm_pid: Some(42),
            vm_name: None,
            origin: crate::VmOrigin::Boot,
            env: Default::default(),
            on_crash: Default::default(),
            auto_pause_secs: None,
            paused_by: None,
            stopped_by: Some(crate::StopCause::Timeout),
            rollback_to: None,
            snapshots: Default::default(),
            crash_restores_ms: vec![7],
            tenant: Some(space_core::TenantId::generate()),
            project: Some("apollo".parse().unwrap()),
            egress: space_core::egress::EgressPolicy::allow_all_public(),
            seal_at_rest: false,
            inherited_from: Vec::new(),
            template_build: Some("tb-1".into()),
        };
        store.save(&rec).unwrap();
        fs::write(dir.path().join("junk.json"), b"{not json").unwrap();
        assert_eq!(store.load_all().unwrap(), vec![rec.clone()]);
        store.remove(&rec.id).unwrap();
        store.remove(&rec.id).unwrap();
    }
}
