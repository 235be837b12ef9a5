//! `space pool`.

use crate::{render, Global};

/// `space pool`.
pub async fn run(g: &Global) -> anyhow::Result<u8> {
    let list = g.client()?.pool().await?;
    if g.json {
        render::json(&list)?;
    } else if list.pools.is_empty() {
        eprintln!("the warm pool is empty (it fills per template once creates ask for it)");
    } else {
        render::pool(&list.pools);
    }
    Ok(0)
}
