//! Test infrastructure: shared btrfs store and template, server start, wait_until, leak checks.
