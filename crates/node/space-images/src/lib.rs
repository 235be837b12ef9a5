//! Builds guest artifacts: the kernel bundle (kernel + initramfs with spaced) and template root filesystems.
