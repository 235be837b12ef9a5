//! Starts the Garage server a whole test run shares (`./scripts/test`): a one-node cluster
//! in DIR, described in EXPORT for the tests (`test_support::s3::shared_bucket`); runs until
//! it gets SIGTERM or SIGINT, then stops the server.
//!
//!     space-test-garage DIR EXPORT

use std::path::PathBuf;

fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), Some(export)) = (args.next(), args.next()) else {
        eprintln!("usage: space-test-garage DIR EXPORT");
        std::process::exit(2);
    };
    let garage = test_support::s3::Garage::create(&PathBuf::from(dir));
    garage.export(&PathBuf::from(export));
    println!("READY");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let _ = space_control::server::wait_for_signal().await;
    });
    drop(garage);
}
