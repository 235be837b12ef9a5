//! The Vmm backend trait and its QEMU microvm implementation.
