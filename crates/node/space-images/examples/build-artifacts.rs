//! Builds a kernel bundle and templates into a data directory by hand, printing progress with
//! timings (until the `space` CLI has a command for it).
//!
//! `cargo run -p space-images --example build-artifacts -- DATA_DIR SPACED [TEMPLATE...] [--mirror URL] [--unmount]`

use std::path::PathBuf;
use std::time::Instant;

use space_images::{build_kernel_bundle, build_template, BuildOpts, KernelOpts};
use space_storage::Store;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut positional = Vec::new();
    let mut opts = BuildOpts::default();
    let mut unmount = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mirror" => opts.mirror = Some(args.next().ok_or("--mirror needs a URL")?),
            "--unmount" => unmount = true,
            _ => positional.push(a),
        }
    }
    if positional.len() < 2 {
        return Err(
            "usage: build-artifacts DATA_DIR SPACED [TEMPLATE...] [--mirror URL] [--unmount]"
                .into(),
        );
    }
    let start = Instant::now();
    let progress = |l: &str| println!("[{:7.1}s] {l}", start.elapsed().as_secs_f64());
    let store = Store::open(&PathBuf::from(&positional[0]), 16 << 30)?;
    progress(&format!(
        "store at {} ({:?})",
        store.root().display(),
        store.backing()
    ));

    let t = Instant::now();
    let kernel = build_kernel_bundle(&store, &KernelOpts::new(&positional[1]), &progress)?;
    progress(&format!(
        "kernel bundle {} in {:.2}s",
        kernel.digest,
        t.elapsed().as_secs_f64()
    ));
    for name in &positional[2..] {
        let t = Instant::now();
        let info = build_template(&store, name, &kernel.digest, &opts, &progress)?;
        let image = store.templates().image_path(&info);
        progress(&format!(
            "template {name} in {:.2}s: {} ({} MiB, sha256 {})",
            t.elapsed().as_secs_f64(),
            image.display(),
            info.image_size_mib,
            info.image_sha256
        ));
    }
    if unmount {
        store.unmount()?;
    }
    Ok(())
}
