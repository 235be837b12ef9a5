//! Node storage: the btrfs store, template images, sandbox disks (reflinks).
