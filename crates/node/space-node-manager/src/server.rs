//! `space node-manager`: the only root process of a node, serving [`crate::protocol`] on a
//! Unix socket to the sandbox manager's uid alone.
//!
//! The caller is untrusted too. Its uid is checked on every connection (`SO_PEERCRED`),
//! every frame is bounded, every path is confined ([`crate::confine`]), every name checked,
//! and every network namespace must be this node's. A refused or failed request gets a
//! [`Refusal`] and is logged; the connection goes on (but for a frame too large to skip),
//! and the server always does. Each connection is served on a thread of its own, at most
//! [`MAX_CONNECTIONS`] at once; operations that wait for a VM run on the server's runtime.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use space_net::datapath::GuestLink;
use space_storage::{ExistingDisk, Store};
use space_vmm::{FileOwner, GuestMemory, ProcessEnd, ReleasedVm, RestoreFrom, VmConfig};

use crate::confine::{Access, Areas};
use crate::ownership;
use crate::protocol::{
    check_name, Area, Existing, MemorySpec, NodePath, Refusal, RefusalCode, Request, Response,
    TemplateBuild, VmEnd, VmSpec, MAX_PROGRESS_LINE, MAX_REQUEST_BYTES, PROTOCOL_VERSION,
};
use crate::wire::{self, WireError};
use crate::{LocalNodeManager, NodeManager, NodeManagerError};

/// Most connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// How long `vm_exit` waits for the reaper of a VMM that has just ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(5);
/// How long a launch waits for the previous VMM of the same VM to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(30);
/// How long a connection may sit between requests, or stall inside one, before it is closed.
const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// What the node manager is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The socket to listen on.
    pub socket: PathBuf,
    /// The node's data directory (store and run directory beneath it).
    pub data_dir: PathBuf,
    /// Size of the store's btrfs image when the data directory is not on btrfs.
    pub loop_size: u64,
    /// The only uid served, the sandbox manager's, and the uid and gid that the files made
    /// for it are handed to.
    pub client: FileOwner,
    /// Jail every VMM (false only to measure what the jail costs).
    pub jail: bool,
}

/// Why the node manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(#[from] space_storage::StorageError),
    /// A file system step failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data directory is laid out so that serving it would let the client steer root.
    #[error("refusing to serve {path}: {reason}")]
    Unsafe {
        /// The offending path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A running node manager; dropping it stops accepting (VMMs it launched keep running).
pub struct RunningServer {
    socket: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RunningServer {
    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Opens the store, binds the socket (mode 0600, owned by the client uid) and serves it on
/// a thread; `runtime` drives the VMs. Must run as root.
pub fn start(
    cfg: ServerConfig,
    runtime: tokio::runtime::Handle,
) -> Result<RunningServer, ServerError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| ServerError::Io { what, path, source }
    };
    let data_dir = std::path::absolute(&cfg.data_dir).map_err(io("resolve", &cfg.data_dir))?;
    ownership::prepare_data_dir(&data_dir, cfg.client)?;
    let store = Store::open(&data_dir, cfg.loop_size)?;
    ownership::prepare_store(&store, cfg.client)?;
    // As the sandbox manager names it (absolute, not canonical): namespace and fork image
    // names are derived from this path on both sides.
    let run_root = data_dir.join("run");
    let host = Arc::new(Host {
        areas: Areas::new(
            store.root(),
            &run_root,
            std::path::Path::new(crate::FORK_IMAGE_ROOT),
        ),
        netns_prefix: crate::netns_prefix(&run_root),
        local: LocalNodeManager::qemu(&run_root, cfg.jail, cfg.client),
        client: cfg.client,
        store,
        loop_size: cfg.loop_size,
        released: Mutex::new(HashMap::new()),
        ended: Mutex::new(HashMap::new()),
        runtime,
    });
    // VMMs an earlier node manager launched run on; their consoles are copied again.
    let running = host.local.vm_names_under(&run_root);
    let taken = host
        .runtime
        .block_on(host.local.take_over_orphans(&run_root, &running));
    if taken > 0 {
        tracing::info!(vms = taken, "took over running VMMs");
    }
    let listener = bind(&cfg.socket, cfg.client)?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let client_uid = cfg.client.uid;
    std::thread::Builder::new()
        .name("node-manager-accept".into())
        .spawn(move || accept_loop(listener, host, client_uid, &stopping))
        .map_err(io("spawn the accept thread for", &cfg.socket))?;
    tracing::info!(socket = %cfg.socket.display(), client_uid, "node manager serving");
    Ok(RunningServer {
        socket: cfg.socket,
        stop,
    })
}

/// Binds `socket`, replacing a stale socket file (never another kind of file).
fn bind(socket: &Path, client: FileOwner) -> Result<UnixListener, ServerError> {
    let io = |what, source| ServerError::Io {
        what,
        path: socket.to_owned(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
        // The client must be able to reach the socket (which is its alone, 0600); a
        // directory it cannot search (or one above it) is the operator's to open, not the
        // node manager's. Asked of the kernel, acting as the client.
        let reachable = client
            .act_as(|| std::fs::metadata(dir.join(".")))
            .map_err(|e| io("inspect the directory of", e))?;
        if let Err(e) = reachable {
            return Err(ServerError::Unsafe {
                path: dir.to_owned(),
                reason: format!(
                    "uid {} cannot reach a socket in it ({e}): allow it to search the directory (chmod 0755) or choose another --socket",
                    client.uid
                ),
            });
        }
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(socket).map_err(|e| io("remove the stale socket", e))?;
        }
        Ok(_) => {
            return Err(io(
                "refusing to replace a non-socket at",
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(socket).map_err(|e| io("bind", e))?;
    client.give(socket, 0o600).map_err(|e| io("hand over", e))?;
    Ok(listener)
}

fn accept_loop(
    listener: UnixListener,
    host: Arc<Host>,
    client_uid: u32,
    stop: &std::sync::atomic::AtomicBool,
) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "node manager: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            refuse_and_close(&stream, RefusalCode::Forbidden, "too many connections");
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let (host, open) = (host.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("node-manager-conn".into())
            .spawn(move || {
                serve_connection(&stream, &host, client_uid);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "node manager: cannot spawn a connection thread");
        }
    }
}

fn refuse_and_close(stream: &UnixStream, code: RefusalCode, message: &str) {
    let _ = wire::send(stream, &Response::Refused(Refusal::new(code, message)), &[]);
}

/// The peer's uid, from the kernel (`SO_PEERCRED`), as it was when it connected.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(std::io::Error::from)?;
    Ok(cred.uid())
}

fn serve_connection(stream: &UnixStream, host: &Host, client_uid: u32) {
    match peer_uid(stream) {
        Ok(uid) if uid == client_uid => {}
        Ok(uid) => {
            tracing::warn!(
                uid,
                client_uid,
                "node manager: refused a connection from another uid"
            );
            refuse_and_close(
                stream,
                RefusalCode::Forbidden,
                &format!("uid {uid} may not use the node manager"),
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "node manager: cannot read the peer's credentials");
            return;
        }
    }
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut greeted = false;
    loop {
        let frame = match wire::recv(stream, MAX_REQUEST_BYTES) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(WireError::TooLarge { len, max }) => {
                tracing::warn!(
                    len,
                    max,
                    "node manager: oversized request; closing the connection"
                );
                refuse_and_close(
                    stream,
                    RefusalCode::TooLarge,
                    &format!("a request of {len} bytes exceeds the limit of {max}"),
                );
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "node manager: connection ended");
                return;
            }
        };
        // Descriptors are never part of a request.
        drop(frame.fds);
        let (response, fds) = match serde_json::from_slice::<Request>(&frame.body) {
            Err(e) => {
                tracing::warn!(error = %e, "node manager: malformed request");
                (
                    Response::Refused(Refusal::new(
                        RefusalCode::BadRequest,
                        format!("malformed request: {e}"),
                    )),
                    Vec::new(),
                )
            }
            Ok(Request::Hello { version }) => {
                if version != PROTOCOL_VERSION {
                    refuse_and_close(
                        stream,
                        RefusalCode::UnsupportedVersion,
                        &format!("protocol version {version}; this node manager speaks {PROTOCOL_VERSION}"),
                    );
                    return;
                }
                greeted = true;
                (
                    Response::Welcome {
                        version: PROTOCOL_VERSION,
                    },
                    Vec::new(),
                )
            }
            Ok(_) if !greeted => {
                refuse_and_close(stream, RefusalCode::BadRequest, "say hello first");
                return;
            }
            Ok(request) => {
                let op = request.op();
                let t0 = Instant::now();
                let handled = match request {
                    // The one request answered in several frames.
                    Request::BuildTemplate { staged, build } => {
                        host.build_template(stream, &staged, &build)
                    }
                    request => host.handle(request),
                };
                match handled {
                    Ok(done) => {
                        tracing::debug!(
                            op,
                            ms = t0.elapsed().as_millis() as u64,
                            "node manager: done"
                        );
                        done
                    }
                    Err(refusal) => {
                        tracing::warn!(op, code = %refusal.code, message = %refusal.message, "node manager: refused");
                        (Response::Refused(refusal), Vec::new())
                    }
                }
            }
        };
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if let Err(e) = wire::send(stream, &response, &borrowed) {
            tracing::debug!(error = %e, "node manager: cannot answer; connection ended");
            return;
        }
    }
}

/// The node manager's state: its store, areas, and the VMMs it launched and released.
struct Host {
    local: LocalNodeManager,
    /// The sandbox manager, to whom the files made for it are handed.
    client: FileOwner,
    store: Store,
    loop_size: u64,
    areas: Areas,
    netns_prefix: String,
    released: Mutex<HashMap<String, ReleasedVm>>,
    /// How killed VMMs ended (their entries left `released`), for [`Request::VmExit`].
    ended: Mutex<HashMap<String, ProcessEnd>>,
    runtime: tokio::runtime::Handle,
}

/// Ends of killed VMMs remembered; past this the memory starts over (the sandbox manager
/// asks right after the kill, so only a storm of kills loses one, to `unknown`).
const MAX_REMEMBERED_ENDS: usize = 1024;

type Handled = Result<(Response, Vec<OwnedFd>), Refusal>;

fn done() -> Handled {
    Ok((Response::Done, Vec::new()))
}

fn answer(r: Response) -> Handled {
    Ok((r, Vec::new()))
}

impl Host {
    fn handle(&self, request: Request) -> Handled {
        let (read, write) = (Access::Read, Access::Write);
        match request {
            Request::Hello { .. } => answer(Response::Welcome {
                version: PROTOCOL_VERSION,
            }),
            // Streamed: see `build_template`.
            Request::BuildTemplate { .. } => Err(Refusal::new(
                RefusalCode::BadRequest,
                "build_template is answered in frames of its own".to_owned(),
            )),
            Request::OpenStore => {
                self.local
                    .open_store(self.store.data_dir(), self.loop_size)
                    .map_err(refusal)?;
                done()
            }
            Request::CreateSandboxDisk {
                sandbox,
                image,
                disk_mib,
            } => {
                let image = self.areas.resolve(&image, read)?;
                self.as_client(|| {
                    self.local
                        .create_sandbox_disk(&self.store, &sandbox, &image, disk_mib)
                })?;
                done()
            }
            Request::CloneDisk {
                src,
                dst,
                disk_mib,
                existing,
            } => {
                let src = self.areas.resolve(&src, read)?;
                let dst = self.areas.resolve(&dst, write)?;
                let existing = match existing {
                    Existing::Refuse => ExistingDisk::Refuse,
                    Existing::Replace => ExistingDisk::Replace,
                };
                self.as_client(|| {
                    self.local
                        .clone_disk(&self.store, &src, &dst, disk_mib, existing)
                })?;
                done()
            }
            Request::SnapshotDisk {
                sandbox,
                snapshot,
                disk,
            } => {
                let disk = self.areas.resolve(&disk, read)?;
                self.as_client(|| {
                    self.store
                        .reflink_pending_snapshot_disk(&sandbox, &snapshot, &disk)
                        .map(drop)
                        .map_err(NodeManagerError::from)
                })?;
                done()
            }
            Request::LinkDisk { src, dst } => {
                // A second name for a template would let a VM write it: both ends writable.
                let src = self.areas.resolve(&src, write)?;
                let dst = self.areas.resolve(&dst, write)?;
                self.as_client(|| self.local.link_disk(&src, &dst))?;
                done()
            }
            Request::InstallTemplate {
                staged,
                template,
                named,
            } => {
                let staged = self.staged(&staged)?;
                let image = self
                    .as_client(|| crate::local::open_staged(&staged, space_storage::IMAGE_FILE))?;
                // Root writes the template from the descriptors opened as the client.
                let template = crate::local::install(&self.store, &template, &image, named)
                    .map_err(refusal)?;
                answer(Response::Template {
                    template: Box::new(template),
                })
            }
            Request::NameTemplate { name, digest } => {
                // The store validates both (a name of plain characters, a hex digest).
                self.local
                    .name_template(&self.store, &name, &digest)
                    .map_err(refusal)?;
                done()
            }
            Request::RemoveTemplateName { name } => {
                let value = self
                    .local
                    .remove_template_name(&self.store, &name)
                    .map_err(refusal)?;
                answer(Response::Flag { value })
            }
            Request::RemoveUnnamedTemplate { digest } => {
                // The store validates the digest (hex) before touching anything.
                let value = self
                    .local
                    .remove_unnamed_template(&self.store, &digest)
                    .map_err(refusal)?;
                answer(Response::Flag { value })
            }
            Request::InstallKernel { staged, kernel } => {
                let staged = self.staged(&staged)?;
                let (vmlinuz, initramfs) = self.as_client(|| {
                    Ok((
                        crate::local::open_staged(&staged, space_storage::VMLINUZ_FILE)?,
                        crate::local::open_staged(&staged, space_storage::INITRAMFS_FILE)?,
                    ))
                })?;
                self.store
                    .kernels()
                    .install(&kernel, &vmlinuz, &initramfs)
                    .map_err(|e| refusal(e.into()))?;
                done()
            }
            Request::RemoveDir { dir } => {
                let in_run = dir.area == Area::Run;
                let dir = self.areas.resolve(&dir, write)?;
                if in_run {
                    // Root's own directory, where the client can plant nothing.
                    self.local.remove_run_dir(&dir).map_err(refusal)?;
                } else {
                    self.as_client(|| self.local.remove_run_dir(&dir))?;
                }
                done()
            }
            Request::ForgetMemoryImage { image } => {
                check_name("in-memory image", &image)?;
                self.local.forget_memory_image(&image).map_err(refusal)?;
                done()
            }
            Request::RemoveSandboxFiles { sandbox, run_dir } => {
                if run_dir.area != Area::Run {
                    return Err(Refusal::new(
                        RefusalCode::Confinement,
                        format!("{run_dir} is not a run directory"),
                    ));
                }
                let run_dir = self.areas.resolve(&run_dir, write)?;
                self.as_client(|| {
                    self.store
                        .remove_sandbox_dir(&sandbox)
                        .map_err(NodeManagerError::from)
                })?;
                self.local.remove_run_dir(&run_dir).map_err(refusal)?;
                done()
            }
            Request::LaunchVm { spec } => self.launch(&spec),
            Request::KillVm { name } => {
                check_name("VM name", &name)?;
                let released = self.released_vms().remove(&name);
                match released {
                    Some(vm) => {
                        self.runtime
                            .block_on(async {
                                vm.kill().await?;
                                vm.reaped().await;
                                Ok::<_, space_vmm::VmmError>(())
                            })
                            .map_err(|e| refusal(e.into()))?;
                        // Asked for next, by the sandbox manager's exit monitor.
                        self.remember_end(&name, vm.end());
                    }
                    // Launched before this node manager started: found by its command line.
                    None => {
                        self.runtime
                            .block_on(self.local.kill_stray_vms(&name, self.areas.root(Area::Run)))
                            .map_err(refusal)?;
                    }
                }
                done()
            }
            Request::VmExit { name } => {
                check_name("VM name", &name)?;
                answer(Response::VmEnded {
                    end: self.vm_end(&name),
                })
            }
            Request::KillStrayVms { name } => {
                check_name("VM name", &name)?;
                // Its own node's VMMs only (those under its run directory).
                let n = self
                    .runtime
                    .block_on(self.local.kill_stray_vms(&name, self.areas.root(Area::Run)))
                    .map_err(refusal)?;
                answer(Response::Count { value: n as u64 })
            }
            Request::VmNames => answer(Response::Names {
                names: self.local.vm_names_under(self.areas.root(Area::Run)),
            }),
            Request::RemoveStaleVmConfinement => answer(Response::Count {
                value: self.local.remove_stale_vm_confinement() as u64,
            }),
            Request::EnsureVmNetwork { netns } => {
                self.check_netns(&netns)?;
                let net = self.local.ensure_vm_network(&netns).map_err(refusal)?;
                answer(Response::VmNetwork {
                    tap: net.tap,
                    mac: net.mac,
                })
            }
            Request::RemoveVmNetwork { netns } => {
                self.check_netns(&netns)?;
                self.local.remove_vm_network(&netns).map_err(refusal)?;
                done()
            }
            Request::VmNetworks => answer(Response::Names {
                names: self.local.vm_networks(&self.netns_prefix),
            }),
            Request::OpenUdpFlow { netns, dst, guest } => {
                self.check_netns(&netns)?;
                // The one guest of a sandbox namespace; a destination a datagram can go to.
                let link = GuestLink::default();
                let dst_ip = *dst.ip();
                if *guest.ip() != link.guest
                    || dst_ip.is_unspecified()
                    || dst_ip.is_broadcast()
                    || dst_ip.is_multicast()
                    || dst.port() == 0
                {
                    return Err(Refusal::new(
                        RefusalCode::BadRequest,
                        format!("no UDP flow from {guest} to {dst} in a sandbox"),
                    ));
                }
                let socket = self
                    .local
                    .open_udp_flow(&netns, dst, guest)
                    .map_err(refusal)?;
                Ok((Response::UdpFlowSocket, vec![OwnedFd::from(socket)]))
            }
            Request::GuardUplink {
                netns,
                granted,
                node_addresses,
            } => {
                crate::check_uplink_netns(&netns)?;
                let most = space_core::egress::MAX_CEILING_GRANTS;
                if granted.len() > most || node_addresses.len() > most {
                    return Err(Refusal::new(
                        RefusalCode::BadRequest,
                        format!(
                            "{} granted networks and {} node addresses; at most {most} of each",
                            granted.len(),
                            node_addresses.len()
                        ),
                    ));
                }
                self.local
                    .guard_uplink(&netns, &granted, &node_addresses)
                    .map_err(refusal)?;
                done()
            }
            Request::UnguardUplink { netns } => {
                crate::check_uplink_netns(&netns)?;
                self.local.unguard_uplink(&netns).map_err(refusal)?;
                done()
            }
            Request::OpenUplinkSockets { netns, kind, count } => {
                crate::check_uplink_netns(&netns)?;
                if !(1..=crate::MAX_UPLINK_SOCKETS).contains(&count) {
                    return Err(Refusal::new(
                        RefusalCode::BadRequest,
                        format!("{count} uplink sockets; 1 to {}", crate::MAX_UPLINK_SOCKETS),
                    ));
                }
                let fds = self
                    .local
                    .open_uplink_sockets(&netns, kind, count)
                    .map_err(refusal)?;
                Ok((Response::UplinkSockets, fds))
            }
            Request::OpenGatewaySockets { netns } => {
                self.check_netns(&netns)?;
                let s = self.local.open_gateway_sockets(&netns).map_err(refusal)?;
                Ok((
                    Response::GatewaySockets,
                    vec![
                        OwnedFd::from(s.dns_udp),
                        OwnedFd::from(s.dns_tcp),
                        OwnedFd::from(s.proxy),
                        s.udp_relay,
                    ],
                ))
            }
        }
    }

    /// Runs `f` acting as the sandbox manager ([`FileOwner::act_as`]): for work in the
    /// directories it may write, where a symlink of its making must lead nowhere it could
    /// not go itself. What `f` makes is the sandbox manager's.
    /// A directory of fetched files in the store's `incoming/`.
    /// Builds a template from an image the client staged, sending the build's lines as
    /// [`Response::Progress`] frames on `stream` as they come.
    fn build_template(
        &self,
        stream: &UnixStream,
        staged: &NodePath,
        build: &TemplateBuild,
    ) -> Handled {
        if build
            .name
            .as_deref()
            .is_some_and(|n| !space_core::template::validate_template_name(n))
        {
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                "invalid template name".to_owned(),
            ));
        }
        if build
            .user
            .as_deref()
            .is_some_and(|u| !space_core::template::validate_default_user(u))
        {
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                "invalid default user".to_owned(),
            ));
        }
        let staged = self.staged(staged)?;
        // Everything the client staged is read as the client, through descriptors.
        let input = self.as_client(|| crate::local::open_staged_image(&staged))?;
        let progress = |line: &str| {
            let frame = Response::Progress {
                line: space_core::text::prefix_at_char_boundary(line, MAX_PROGRESS_LINE).to_owned(),
            };
            // A client gone mid-build loses its lines; the build finishes and is stored.
            let _ = wire::send(stream, &frame, &[]);
        };
        let template = crate::local::build_staged_template(&self.store, &input, build, &progress)
            .map_err(refusal)?;
        answer(Response::Template {
            template: Box::new(template),
        })
    }

    fn staged(&self, p: &NodePath) -> Result<PathBuf, Refusal> {
        if p.area != Area::Store || !p.rel.is_under(space_storage::INCOMING_DIR) {
            return Err(Refusal::new(
                RefusalCode::Confinement,
                format!("{p} is not a directory of fetched files"),
            ));
        }
        self.areas.resolve(p, Access::Read)
    }

    fn as_client<T>(&self, f: impl FnOnce() -> Result<T, NodeManagerError>) -> Result<T, Refusal> {
        self.client
            .act_as(f)
            .map_err(|e| {
                Refusal::new(
                    RefusalCode::Io,
                    format!("cannot act as the sandbox manager: {e}"),
                )
            })?
            .map_err(refusal)
    }

    fn released_vms(&self) -> std::sync::MutexGuard<'_, HashMap<String, ReleasedVm>> {
        self.released.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember_end(&self, name: &str, end: Option<ProcessEnd>) {
        if let Some(end) = end {
            let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            if ended.len() >= MAX_REMEMBERED_ENDS {
                ended.clear();
            }
            ended.insert(name.to_owned(), end);
        }
    }

    /// How VM `name`'s VMM ended, waiting a little for its reaping.
    fn vm_end(&self, name: &str) -> VmEnd {
        let reaping = self.released_vms().get(name).map(|vm| vm.reaped());
        let end = match reaping {
            // Ended a moment ago (the caller saw it go): the reaper is about to report.
            Some(reaped) => self
                .runtime
                .block_on(async { tokio::time::timeout(EXIT_STATUS_WAIT, reaped).await })
                .ok()
                .flatten(),
            None => self
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name),
        };
        match end {
            Some(ProcessEnd::Code(code)) => VmEnd::Code { code },
            Some(ProcessEnd::Signal(signal)) => VmEnd::Signal { signal },
            Some(ProcessEnd::Unknown) | None => VmEnd::Unknown,
        }
    }

    /// Only this node's namespaces, by name.
    fn check_netns(&self, netns: &str) -> Result<(), Refusal> {
        check_name("network namespace", netns)?;
        if !netns.starts_with(&self.netns_prefix) {
            return Err(Refusal::new(
                RefusalCode::Confinement,
                format!("network namespace {netns:?} is not this node's"),
            ));
        }
        Ok(())
    }

    /// Launches a jailed VMM, releases it to the caller and keeps reaping it.
    fn launch(&self, spec: &VmSpec) -> Handled {
        spec.check()?;
        // The VM's previous VMM (a rollback or crash restore relaunches under the same
        // name) must have given back what it was lent before the files are lent again.
        let previous = self.released_vms().remove(&spec.name);
        if let Some(old) = previous {
            let waited = self
                .runtime
                .block_on(async { tokio::time::timeout(REAP_WAIT, old.reaped()).await });
            if waited.is_err() {
                return Err(Refusal::new(
                    RefusalCode::Vmm,
                    format!(
                        "the previous VMM of {} (pid {}) still runs",
                        spec.name,
                        old.pid()
                    ),
                ));
            }
        }
        let cfg = self.vm_config(spec)?;
        let vm = self
            .runtime
            .block_on(self.local.launch_vm(&cfg))
            .map_err(refusal)?;
        let pid = vm.pid();
        let mut released = self.released_vms();
        // Entries of VMMs that ended by themselves (the client saw them go by pidfd), once
        // nothing of theirs is left to undo; how they ended is kept for `vm_exit`.
        let reaped: Vec<String> = released
            .iter()
            .filter(|(_, vm)| vm.is_reaped())
            .map(|(name, _)| name.clone())
            .collect();
        for name in reaped {
            if let Some(vm) = released.remove(&name) {
                self.remember_end(&name, vm.end());
            }
        }
        released.insert(spec.name.clone(), vm.release());
        answer(Response::Launched { pid })
    }

    /// The [`VmConfig`] of `spec`, every path confined.
    fn vm_config(&self, spec: &VmSpec) -> Result<VmConfig, Refusal> {
        let (read, write) = (Access::Read, Access::Write);
        let resolve = |p: &NodePath, a| self.areas.resolve(p, a);
        let memory = match &spec.memory {
            MemorySpec::Anonymous => GuestMemory::Anonymous,
            MemorySpec::File { path, shared } => GuestMemory::File {
                path: resolve(path, if *shared { write } else { read })?,
                shared: *shared,
            },
            MemorySpec::InMemory { image, shared } => GuestMemory::InMemory {
                image: image.clone(),
                shared: *shared,
            },
        };
        let restore = spec.restore.as_ref().map(|r| RestoreFrom {
            ignore_shared: r.ignore_shared,
        });
        let network = match &spec.netns {
            Some(ns) => {
                self.check_netns(ns)?;
                Some(self.local.ensure_vm_network(ns).map_err(refusal)?)
            }
            None => None,
        };
        Ok(VmConfig {
            name: spec.name.clone(),
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel: resolve(&spec.kernel, read)?,
            initrd: resolve(&spec.initrd, read)?,
            cmdline: spec.cmdline.clone(),
            root_disk: resolve(&spec.root_disk, write)?,
            run_dir: resolve(&spec.run_dir, write)?,
            accel: spec
                .accel
                .parse()
                .map_err(|e| Refusal::new(RefusalCode::BadRequest, format!("accelerator: {e}")))?,
            tcg_tb_size_mib: spec.tcg_tb_size_mib,
            memory,
            restore,
            network,
        })
    }
}

/// A failed operation as the caller sees it (the message is the error's, which names paths
/// but never secrets: the node manager holds none).
fn refusal(e: NodeManagerError) -> Refusal {
    let code = match &e {
        NodeManagerError::Storage(space_storage::StorageError::NotFound { .. }) => {
            RefusalCode::NotFound
        }
        NodeManagerError::Storage(_) => RefusalCode::Storage,
        NodeManagerError::Vmm(space_vmm::VmmError::InvalidConfig(_)) => RefusalCode::BadRequest,
        NodeManagerError::Vmm(space_vmm::VmmError::InMemoryImage(
            space_vmm::InMemoryImageError::Missing(_),
        )) => RefusalCode::NotFound,
        NodeManagerError::Vmm(space_vmm::VmmError::InMemoryImage(
            space_vmm::InMemoryImageError::Exists(_)
            | space_vmm::InMemoryImageError::StillFilling(_)
            | space_vmm::InMemoryImageError::TooMany,
        )) => RefusalCode::BadRequest,
        NodeManagerError::Vmm(_) => RefusalCode::Vmm,
        NodeManagerError::Network(_) => RefusalCode::Network,
        NodeManagerError::Io { .. } => RefusalCode::Io,
        NodeManagerError::Image(space_images::ImageError::Oci(_)) => RefusalCode::BadImage,
        NodeManagerError::Image(space_images::ImageError::Storage(_)) => RefusalCode::Storage,
        NodeManagerError::Image(_) => RefusalCode::Io,
        NodeManagerError::Refused(r) => r.code,
        NodeManagerError::Connection(_) => RefusalCode::Io,
    };
    Refusal::new(code, e.to_string())
}
