//! `smallrl-componentize CORE.wasm=OUT.wasm ...`: wraps each core module built by cargo for
//! `wasm32-unknown-unknown` into a component (the WIT world is read from the custom section
//! wit-bindgen embeds), the same bytes `wasm-tools component new` would write. An output newer
//! than its input is left alone, so `make plugins` is fast when nothing changed.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let pairs: Vec<String> = std::env::args().skip(1).collect();
    if pairs.is_empty() {
        bail!("usage: smallrl-componentize CORE.wasm=OUT.wasm ...");
    }
    for pair in &pairs {
        let (core, out) = pair
            .split_once('=')
            .with_context(|| format!("argument {pair:?} is not CORE.wasm=OUT.wasm"))?;
        componentize_if_stale(Path::new(core), Path::new(out))?;
    }
    Ok(())
}

fn componentize_if_stale(core: &Path, out: &Path) -> Result<()> {
    let modified = |path: &Path| fs::metadata(path).and_then(|meta| meta.modified());
    let core_time = modified(core)
        .with_context(|| format!("cannot read {}: build the plugins first", core.display()))?;
    if modified(out).is_ok_and(|out_time| out_time >= core_time) {
        return Ok(());
    }
    let module = fs::read(core).with_context(|| format!("cannot read {}", core.display()))?;
    let component = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .with_context(|| format!("{} has no usable component-type section", core.display()))?
        .encode()
        .with_context(|| format!("cannot componentize {}", core.display()))?;
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(out, component).with_context(|| format!("cannot write {}", out.display()))?;
    println!("componentized {} -> {}", core.display(), out.display());
    Ok(())
}
