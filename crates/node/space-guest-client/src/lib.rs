//! Node side of the private host-guest channel: connects to a sandbox's daemon and calls it.
