# Shared by the scripts in scripts/: finding the repo, installing what is missing, building.
# Sourced, not run.

set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
# spaced runs inside guests whose root file system may have no C library: link it statically.
SPACED_TARGET=x86_64-unknown-linux-gnu
SPACED_BIN="$TARGET_DIR/$SPACED_TARGET/release/spaced"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf '\033[1;31merror: %s\033[0m\n' "$*" >&2; exit 1; }

# Debian packages SPACE needs on a node. Kept in one list so install and docs agree.
APT_PACKAGES=(
    qemu-system-x86      # the VMM (QEMU microvm)
    linux-image-cloud-amd64  # guest kernel for the kernel bundle
    btrfs-progs          # node store (mkfs.btrfs)
    e2fsprogs            # template images (mkfs.ext4 -d)
    debootstrap          # the `base` template
    busybox-static       # initramfs and the `busybox` template
    iproute2             # sandbox network namespaces, TAP devices
    nftables             # the default-deny firewall of every sandbox namespace
    util-linux           # losetup, mount
    kmod                 # modules.dep of the guest kernel
    bash                 # copied into the `busybox` template (the E2B SDKs run commands with /bin/bash)
    curl                 # copied into the `busybox` template, with libcurl4 and its libraries
    openssl              # copied into the `busybox` template, with libssl3 (and openssl.cnf)
    ca-certificates
)

# Installs the Debian packages that are missing (needs root).
install_packages() {
    local missing=()
    for p in "${APT_PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Builds the static guest daemon.
build_spaced() {
    say "building spaced (static)"
    (cd "$REPO" && CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --quiet --release -p spaced --target "$SPACED_TARGET")
    export SPACE_SPACED_BIN="$SPACED_BIN"
}

# Builds the `space` binary (release) and sets SPACE to its path.
build_space() {
    say "building space"
    (cd "$REPO" && cargo build --quiet --release -p space-cli)
    SPACE="$TARGET_DIR/release/space"
}

require_root() {
    if [[ $EUID -ne 0 ]]; then
        echo "error: $0 must run as root (it installs packages, mounts btrfs and starts VMs)" >&2
        exit 1
    fi
}

# Starts a throwaway PostgreSQL listening only on a Unix socket in a fresh directory, and
# sets PG_URL to reach it; `stop_postgres` stops it and removes the directory (call it from
# the caller's EXIT trap). Installs the server package if it is missing.
start_postgres() {
    install_packages postgresql
    PG_DIR="$(mktemp -d /tmp/space-pg.XXXXXX)"
    chown postgres "$PG_DIR"
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
    runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
        -o "-k $PG_DIR -c listen_addresses='' -c fsync=off" start >/dev/null
    PG_URL="postgres://postgres@localhost/postgres?host=$PG_DIR"
}

stop_postgres() {
    [[ -n "${PG_DIR:-}" ]] || return 0
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
}

# Garage, the S3-compatible server the tests store objects in (AGPL: a separate test
# server, never linked). Built from crates.io once per version (about 10 minutes on two
# cores) into a cache directory; sets GARAGE_BIN.
GARAGE_VERSION=2.5.0
GARAGE_ROOT="${SPACE_CACHE_DIR:-/var/cache/space-test}/garage-$GARAGE_VERSION"
install_garage() {
    GARAGE_BIN="$GARAGE_ROOT/bin/garage"
    if [[ ! -x $GARAGE_BIN ]]; then
        say "installing Garage $GARAGE_VERSION, the S3 test server (once; about 10 minutes)"
        cargo install garage --locked --quiet --version "$GARAGE_VERSION" --root "$GARAGE_ROOT"
    fi
}
