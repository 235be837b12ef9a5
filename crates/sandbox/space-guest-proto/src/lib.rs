//! Host-guest channel protocol shared by the guest daemon and the node: handshake, routes, limits.
