//! The node's side of membership (`space_node_proto::cluster`): joining the cluster once,
//! then heartbeating, and rejoining when the control plane says the node is fenced.
//!
//! What joining leaves in the node's cluster directory (0700), read at every start:
//! `node.key` (0600, made here, never sent anywhere), `node.pem` (the certificate the
//! control plane signed), `ca.pem` (the cluster CA, checked against the token's pin) and
//! `membership.json` (name, addresses, generation).

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use space_core::{ErrorBody, ErrorCode, SandboxState};
use space_node_proto::api::NodeApi;
use space_node_proto::cluster::{
    Heartbeat, HeartbeatReply, JoinRequest, JoinResponse, JoinToken, LiveSandbox, RejoinRequest,
    RejoinResponse, HEARTBEAT_PATH, JOIN_PATH, REJOIN_PATH,
};
use space_node_proto::identity::{
    ca_fingerprint, join_client_config, node_client_config, node_key_and_request, Identity,
    IdentityError, CONTROL_PLANE_DNS_NAME,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const KEY_FILE: &str = "node.key";
const CERT_FILE: &str = "node.pem";
const CA_FILE: &str = "ca.pem";
const STATE_FILE: &str = "membership.json";
/// The cluster's credential placeholder key (raw, 32 bytes), given at join.
const PLACEHOLDER_KEY_FILE: &str = "placeholder.key";
/// Longest a membership call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read from the control plane.
const MAX_ANSWER: usize = 1 << 20;

/// Why joining or heartbeating failed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// A file of the cluster directory.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The node has joined already (its cluster directory holds an identity).
    #[error("{0} already holds this node's cluster identity (it joined already)")]
    AlreadyJoined(PathBuf),
    /// The node has not joined (no identity).
    #[error("{0} holds no cluster identity: join first (space node join)")]
    NotJoined(PathBuf),
    /// The control plane cannot be reached or answered out of protocol.
    #[error("control plane {addr}: {reason}")]
    Unreachable {
        /// Where.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The control plane refused the request.
    #[error("the control plane refused: {} ({})", .0.message, .0.code.as_str())]
    Refused(ErrorBody),
    /// An identity is unusable, or the answer's CA is not the pinned one.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The answer's CA is not the one the token pins.
    #[error("the control plane answered with a CA other than the one the join token names")]
    WrongCa,
    /// The identity has no placeholder key (it joined before clusters shared one).
    #[error("{0} holds no cluster placeholder key: this node joined before the cluster shared one; remove the directory and join again")]
    NoPlaceholderKey(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MembershipError + '_ {
    move |source| MembershipError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a node remembers of its membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembershipState {
    /// The node's name.
    pub name: String,
    /// Where the control plane reaches its agent.
    pub advertise: String,
    /// `host:port` of the control plane's cluster listener.
    pub control_plane: String,
    /// The generation to heartbeat with.
    pub generation: u64,
}

/// A node that has joined: its identity and membership.
#[derive(Clone)]
pub struct Joined {
    /// The cluster directory.
    pub dir: PathBuf,
    /// Its certificate and key.
    pub identity: Identity,
    /// The cluster CA.
    pub ca_pem: String,
    /// Name, addresses, generation.
    pub state: MembershipState,
}

impl Joined {
    /// The cluster's credential placeholder key file, for [`space_node::NodeConfig`]'s
    /// `placeholder_key`.
    pub fn placeholder_key_file(&self) -> PathBuf {
        self.dir.join(PLACEHOLDER_KEY_FILE)
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), MembershipError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Resolves `host:port` to one address.
async fn resolve(addr: &str) -> Result<SocketAddr, MembershipError> {
    let unreachable = |reason: String| MembershipError::Unreachable {
        addr: addr.to_owned(),
        reason,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| unreachable(format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| unreachable("resolves to no address".into()))
}

/// A client of the control plane at `addr` with `tls`, checking its certificate names
/// the control plane (whatever name `addr` has).
async fn client(
    addr: &str,
    tls: rustls::ClientConfig,
) -> Result<(reqwest::Client, String), MembershipError> {
    let socket = resolve(addr).await?;
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(CONTROL_PLANE_DNS_NAME, socket)
        .timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| MembershipError::Unreachable {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })?;
    Ok((
        client,
        format!("https://{CONTROL_PLANE_DNS_NAME}:{}", socket.port()),
    ))
}

/// One JSON call, given `timeout` for the whole of it; an error answer is
/// [`MembershipError::Refused`] with its body.
async fn call<Req: Serialize, Resp: DeserializeOwned>(
    client: &reqwest::Client,
    base: &str,
    addr: &str,
    path: &str,
    body: &Req,
    timeout: Duration,
) -> Result<Resp, MembershipError> {
    let unreachable = |reason: String| MembershipError::Unreachable {
        addr: addr.to_owned(),
        reason,
    };
    let resp = client
        .post(format!("{base}{path}"))
        .timeout(timeout)
        .json(body)
        .send()
        .await
        .map_err(|e| unreachable(chain(&e)))?;
    let status = resp.status();
    let mut bytes = Vec::new();
    let mut resp = resp;
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| unreachable(format!("reading the answer: {e}")))?
    {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(unreachable("answer too large".into()));
        }
        bytes.extend_from_slice(&chunk);
    }
    if status.is_success() {
        serde_json::from_slice(&bytes).map_err(|e| unreachable(format!("malformed answer: {e}")))
    } else {
        let body = serde_json::from_slice::<ErrorBody>(&bytes)
            .unwrap_or_else(|_| ErrorBody::new(ErrorCode::Internal, format!("status {status}")));
        Err(MembershipError::Refused(body.sanitised()))
    }
}

/// An error with its causes (reqwest's own message leaves out why a connection failed,
/// e.g. a refused certificate).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Joins the cluster whose control plane listens at `control_plane` with `token`, as node
/// `name` reachable at `advertise`; saves the identity in `dir`.
pub async fn join(
    dir: &Path,
    control_plane: &str,
    token: &JoinToken,
    name: &str,
    advertise: &str,
) -> Result<Joined, MembershipError> {
    if dir.join(CERT_FILE).exists() {
        return Err(MembershipError::AlreadyJoined(dir.to_owned()));
    }
    let (key_pem, csr_pem) = node_key_and_request(name)?;
    let (client, base) = client(control_plane, join_client_config(&token.ca_fingerprint)?).await?;
    let answer: JoinResponse = call(
        &client,
        &base,
        control_plane,
        JOIN_PATH,
        &JoinRequest {
            token_id: token.id.clone(),
            token_secret: token.secret.clone(),
            name: name.to_owned(),
            advertise: advertise.to_owned(),
            csr_pem,
        },
        CALL_TIMEOUT,
    )
    .await?;
    if ca_fingerprint(&answer.ca_pem)? != token.ca_fingerprint {
        return Err(MembershipError::WrongCa);
    }
    let placeholder_key = zeroize::Zeroizing::new(
        hex::decode(&answer.placeholder_key)
            .ok()
            .filter(|k| k.len() == space_secrets::keyfile::KEY_LEN)
            .ok_or_else(|| MembershipError::Unreachable {
                addr: control_plane.to_owned(),
                reason: "malformed answer: placeholder_key is not 32 bytes in hex".into(),
            })?,
    );
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    let state = MembershipState {
        name: name.to_owned(),
        advertise: advertise.to_owned(),
        control_plane: control_plane.to_owned(),
        generation: answer.generation,
    };
    write_private(&dir.join(KEY_FILE), key_pem.as_bytes())?;
    write_private(&dir.join(CA_FILE), answer.ca_pem.as_bytes())?;
    save_state(dir, &state)?;
    write_private(&dir.join(PLACEHOLDER_KEY_FILE), &placeholder_key)?;
    // The certificate last: its presence means "joined".
    write_private(&dir.join(CERT_FILE), answer.cert_pem.as_bytes())?;
    Ok(Joined {
        dir: dir.to_owned(),
        identity: Identity {
            cert_pem: answer.cert_pem,
            key_pem,
        },
        ca_pem: answer.ca_pem,
        state,
    })
}

fn save_state(dir: &Path, state: &MembershipState) -> Result<(), MembershipError> {
    let json = serde_json::to_vec_pretty(state).map_err(|e| MembershipError::Io {
        path: dir.join(STATE_FILE),
        source: std::io::Error::other(e),
    })?;
    write_private(&dir.join(STATE_FILE), &json)
}

/// The membership a node saved when it joined.
pub fn load(dir: &Path) -> Result<Joined, MembershipError> {
    let cert = dir.join(CERT_FILE);
    if !cert.exists() {
        return Err(MembershipError::NotJoined(dir.to_owned()));
    }
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(io(&path))
    };
    if !dir.join(PLACEHOLDER_KEY_FILE).exists() {
        return Err(MembershipError::NoPlaceholderKey(dir.to_owned()));
    }
    let state_path = dir.join(STATE_FILE);
    let state: MembershipState =
        serde_json::from_str(&read(STATE_FILE)?).map_err(|e| MembershipError::Io {
            path: state_path,
            source: std::io::Error::other(e),
        })?;
    Ok(Joined {
        dir: dir.to_owned(),
        identity: Identity {
            cert_pem: read(CERT_FILE)?,
            key_pem: read(KEY_FILE)?,
        },
        ca_pem: read(CA_FILE)?,
        state,
    })
}

/// The heartbeat of `node` as `joined` describes it.
async fn beat(node: &dyn NodeApi, generation: u64) -> Result<Heartbeat, MembershipError> {
    let unavailable = |e: space_node_proto::NodeCallError| MembershipError::Unreachable {
        addr: "the node itself".into(),
        reason: e.to_string(),
    };
    let status = node.status().await.map_err(unavailable)?;
    let sandboxes = node
        .sandboxes()
        .await
        .map_err(unavailable)?
        .into_iter()
        .filter(|v| v.state != SandboxState::Deleted)
        .map(|v| LiveSandbox {
            id: v.id,
            state: v.state,
        })
        .collect();
    Ok(Heartbeat {
        generation,
        status,
        sandboxes,
    })
}

/// How long a heartbeat may take before it is logged as slow: a few intervals.
fn slow_beat(interval: Duration) -> Duration {
    (interval * 2).max(Duration::from_millis(500))
}

/// Heartbeats `node` to the control plane every `interval` until `stop` turns true; when
/// told the node is fenced, asks to rejoin (the control plane reconciles it first) and
/// heartbeats with the generation it is given. Failures are logged and retried: a node
/// keeps serving its sandboxes whatever the control plane does, except those restored
/// elsewhere if it is declared lost, which it pauses while cut off ([`crate::fence`]).
pub async fn spawn_heartbeat(
    mut joined: Joined,
    node: Arc<dyn NodeApi>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, MembershipError> {
    let tls = node_client_config(&joined.identity, &joined.ca_pem)?;
    let addr = joined.state.control_plane.clone();
    let (client, base) = client(&addr, tls).await?;
    let fence = Arc::new(crate::fence::Fence::default());
    let fence_watch = fence.clone().watch(node.clone(), stop.clone());
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // A dropped sender is a stop too (else `changed` returns at once, forever).
                changed = stop.changed() => if changed.is_err() { break; },
            }
            if *stop.borrow() {
                break;
            }
            let started = std::time::Instant::now();
            let hb = match beat(node.as_ref(), joined.state.generation).await {
                Ok(hb) => hb,
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat: cannot describe the node");
                    continue;
                }
            };
            let described = started.elapsed();
            let result: Result<HeartbeatReply, _> = call(
                &client,
                &base,
                &addr,
                HEARTBEAT_PATH,
                &hb,
                fence.call_timeout(CALL_TIMEOUT),
            )
            .await;
            // A beat that takes a good part of the lost timeout brings the node near being
            // declared lost while it is fine: say where the time went.
            let took = started.elapsed();
            if took > slow_beat(interval) {
                tracing::warn!(
                    describe = ?described,
                    call = ?(took - described),
                    "slow heartbeat"
                );
            }
            match result {
                Ok(reply) => {
                    if !reply.not_yours.is_empty() {
                        tracing::warn!(not_yours = ?reply.not_yours, "the control plane says these sandboxes are not placed here");
                    }
                    fence.answered(Duration::from_millis(reply.lost_after_ms), reply.restorable);
                    fence.release(node.as_ref()).await;
                }
                Err(MembershipError::Refused(body)) if body.code == ErrorCode::NodeFenced => {
                    tracing::warn!(
                        generation = joined.state.generation,
                        "fenced by the control plane (declared lost); rejoining"
                    );
                    let req = RejoinRequest {
                        generation: joined.state.generation,
                    };
                    match call::<_, RejoinResponse>(
                        &client,
                        &base,
                        &addr,
                        REJOIN_PATH,
                        &req,
                        CALL_TIMEOUT,
                    )
                    .await
                    {
                        Ok(r) => {
                            joined.state.generation = r.generation;
                            if let Err(e) = save_state(&joined.dir, &joined.state) {
                                tracing::warn!(error = %e, "cannot save the new generation");
                            }
                            tracing::info!(generation = r.generation, "rejoined the cluster");
                            // Reconciled: what was restored elsewhere is gone from here;
                            // the next answered heartbeat resumes the rest.
                        }
                        Err(e) => tracing::warn!(error = %e, "rejoin failed; retrying"),
                    }
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed; retrying"),
            }
        }
        let _ = fence_watch.await;
    }))
}
