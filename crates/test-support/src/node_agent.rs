//! A node agent in front of a test server's node, and control-plane clients of it: the
//! node protocol on loopback with a cluster CA of the test's own.

use std::sync::Arc;

use space_control::nodes::remote::{NodeAddress, RemoteNode};
use space_node_proto::api::NodeApi;
use space_node_proto::identity::{
    client_config, node_dns_name, server_config, ClusterCa, Identity, PeerRole, PEER_VALIDITY,
};
use tokio::sync::watch;

/// An agent serving one node on 127.0.0.1.
pub struct AgentFixture {
    /// The cluster's CA.
    pub ca: ClusterCa,
    /// The node's name.
    pub name: String,
    /// Where the agent listens.
    pub addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl AgentFixture {
    /// Serves `node` (named `name`) with a certificate of a new cluster CA.
    pub async fn serve(node: Arc<dyn NodeApi>, name: &str) -> AgentFixture {
        let ca = ClusterCa::generate().expect("cluster CA");
        let id = ca
            .issue(&PeerRole::Node(name.to_owned()), PEER_VALIDITY)
            .expect("node identity");
        let tls = server_config(&id, ca.cert_pem()).expect("agent TLS");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let listener = space_tls::TlsListener::new(tcp, tls).expect("TLS listener");
        let (stop, stop_rx) = watch::channel(false);
        let handle = space_node_agent::spawn(node, listener, stop_rx);
        AgentFixture {
            ca,
            name: name.to_owned(),
            addr,
            stop,
            handle,
        }
    }

    /// A control-plane identity of this cluster.
    pub fn control_plane_identity(&self) -> Identity {
        self.ca
            .issue(&PeerRole::ControlPlane, PEER_VALIDITY)
            .expect("control-plane identity")
    }

    /// A client of the agent presenting `id` (trusting this cluster's CA), expecting the
    /// agent to be node `expect`.
    pub fn client_as(&self, id: &Identity, expect: &str) -> RemoteNode {
        let tls = client_config(id, self.ca.cert_pem()).expect("client TLS");
        RemoteNode::new(NodeAddress {
            name: self.name.clone(),
            addr: self.addr.to_string(),
            server_name: node_dns_name(expect).try_into().expect("server name"),
            tls: Arc::new(tls),
        })
    }

    /// The control plane's client of the agent.
    pub fn client(&self) -> RemoteNode {
        self.client_as(&self.control_plane_identity(), &self.name)
    }

    /// Stops the agent: open connections get a few seconds to finish, then are cut.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.handle)
            .await
            .is_err()
        {
            self.handle.abort();
        }
    }
}

/// `data` as an upload body of 256 KiB chunks.
pub fn upload_body(
    data: &bytes::Bytes,
) -> futures::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>> {
    use futures::StreamExt;
    const CHUNK: usize = 256 * 1024;
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..data.len())
        .step_by(CHUNK)
        .map(|i| Ok(data.slice(i..(i + CHUNK).min(data.len()))))
        .collect();
    futures::stream::iter(chunks).boxed()
}
