//! One typed call of the node protocol, carried out on the node: the request names the
//! [`NodeApi`] method, the answer is its result as a [`WireReply`].

use std::time::Duration;

use serde::Serialize;
use space_node_proto::api::{NodeApi, NodeResult};
use space_node_proto::wire::{GuestReady, NodeRequest, WireReply};
use space_node_proto::NodeCallError;
use space_secrets::secret::SecretValue;

/// The answer to `req`, encoded. Never fails: a refusal is in the reply.
pub async fn dispatch(api: &dyn NodeApi, req: NodeRequest) -> Vec<u8> {
    use NodeRequest as R;
    match req {
        R::Status => reply(api.status().await),
        R::CheckEgressPolicy { policy } => reply(api.check_egress_policy(&policy).await),
        R::Sandbox { id } => reply(api.sandbox(&id).await),
        R::Sandboxes => reply(api.sandboxes().await),
        R::CreateSandbox { req } => reply(api.create_sandbox(req).await),
        R::CreateFromSnapshot { req } => reply(api.create_from_snapshot(req).await),
        R::Fork {
            parent,
            children,
            from,
        } => reply(api.fork(&parent, &children, from.as_ref()).await),
        R::Pause { id, cause } => reply(api.pause(&id, cause).await),
        R::Resume { id } => reply(api.resume(&id).await),
        R::Stop { id, cause } => reply(api.stop(&id, cause).await),
        R::Start { id } => reply(api.start(&id).await),
        R::Rollback { id, to } => reply(api.rollback(&id, &to).await),
        R::Delete { id } => reply(api.delete(&id).await),
        R::WakeTimedOut { id } => reply(api.wake_timed_out(&id).await),
        R::Guest { id } => reply(api.guest(&id).await.map(|g| {
            let ready = g.ready();
            GuestReady {
                version: ready.version,
                boot_id: ready.boot_id.clone(),
                daemon_version: ready.daemon_version.clone(),
            }
        })),
        R::ProcessEnv { id } => reply(api.process_env(&id).await),
        R::ConsoleTail { id, max_bytes } => reply(api.console_tail(&id, max_bytes).await),
        R::Events { id } => reply(api.events(&id).await),
        R::Metrics { id } => reply(api.metrics(&id).await),
        R::SetEgressPolicy { id, policy } => reply(api.set_egress_policy(&id, policy).await),
        R::SetDefaultConnections { limit } => reply(api.set_default_connections(limit).await),
        R::SetTenantConnections { tenant, limit } => {
            reply(api.set_tenant_connections(&tenant, limit).await)
        }
        R::Snapshots { id } => reply(api.snapshots(&id).await),
        R::TenantSnapshots { tenant } => reply(api.tenant_snapshots(&tenant).await),
        R::Suspend { req } => reply(api.suspend(req).await),
        R::AbortSuspend { id } => reply(api.abort_suspend(&id).await),
        R::ResumeSuspended { req } => reply(api.resume_suspended(req).await),
        R::StoreSnapshot { req } => reply(api.store_snapshot(req).await),
        R::FetchSnapshot { req } => reply(api.fetch_snapshot(req).await),
        R::CredentialsSynced { revision } => reply(api.credentials_synced(revision).await),
        R::TakeSnapshot { id, req } => reply(api.take_snapshot(&id, req).await),
        R::DeleteSnapshot { id, snapshot } => reply(api.delete_snapshot(&id, &snapshot).await),
        R::DiffSnapshots {
            id,
            from,
            to,
            limit,
        } => reply(api.diff_snapshots(&id, &from, &to, limit).await),
        R::SnapshotOrigin { id, snapshot } => reply(api.snapshot_origin(&id, &snapshot).await),
        R::PersistentSnapshots => reply(api.persistent_snapshots().await),
        R::PersistentSnapshot { snapshot } => reply(api.persistent_snapshot(&snapshot).await),
        R::DeletePersistentSnapshot { snapshot } => {
            reply(api.delete_persistent_snapshot(&snapshot).await)
        }
        R::Templates => reply(api.templates().await),
        R::Template { name } => reply(api.template(&name).await),
        R::StartTemplateBuild { req } => reply(api.start_template_build(req).await),
        R::TemplateBuild { id, logs_from } => reply(api.template_build(&id, logs_from).await),
        R::DeleteTemplate { name } => reply(api.delete_template(&name).await),
        R::CachedTemplates => reply(api.cached_templates().await),
        R::RemoveCachedTemplate {
            digest,
            unused_since_ms,
        } => reply(api.remove_cached_template(&digest, unused_since_ms).await),
        R::PoolStatus => reply(api.pool_status().await),
        R::Credentials => reply(api.credentials().await),
        R::PutCredential { credential, value } => match SecretValue::new(value.0) {
            Ok(value) => reply(api.put_credential(credential, value).await),
            Err(e) => reply::<()>(Err(NodeCallError::refused(
                space_core::ErrorCode::InvalidRequest,
                e.to_string(),
            ))),
        },
        R::DeleteCredential { id } => reply(api.delete_credential(&id).await),
        R::LendArtifactKey {
            tenant,
            key,
            valid_for_ms,
        } => {
            let key = hex::decode(key.0.as_bytes()).ok().and_then(|bytes| {
                space_envelope::DataKey::from_bytes(&zeroize::Zeroizing::new(bytes))
            });
            match key {
                Some(key) => reply(
                    api.lend_artifact_key(&tenant, &key, Duration::from_millis(valid_for_ms))
                        .await,
                ),
                None => reply::<()>(Err(NodeCallError::refused(
                    space_core::ErrorCode::InvalidRequest,
                    "an artifact key is 32 bytes, hex",
                ))),
            }
        }
        R::WithdrawArtifactKey { tenant } => reply(api.withdraw_artifact_key(&tenant).await),
        R::Audit { filter } => reply(api.audit(filter.into()).await),
    }
}

fn reply<T: Serialize>(result: NodeResult<T>) -> Vec<u8> {
    if let Err(NodeCallError::Internal { detail }) = &result {
        // The detail (paths, OS errors) is for this node's log; the control plane logs it too.
        tracing::error!(%detail, "node call failed");
    }
    let wire = match result {
        Ok(v) => WireReply::Ok(v),
        Err(e) => WireReply::Err(e),
    };
    serde_json::to_vec(&wire).unwrap_or_else(|e| {
        // Only a non-string map key could fail here; none of the answers has one.
        let err: WireReply<()> = WireReply::Err(NodeCallError::Internal {
            detail: format!("encoding the answer: {e}"),
        });
        serde_json::to_vec(&err).unwrap_or_default()
    })
}
