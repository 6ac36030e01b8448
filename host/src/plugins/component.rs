//! Reading a plugin file into a compiled component: the messages for files that are not
//! components (a Python module, a core module, not WebAssembly at all) name what to do.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use wasmtime::component::Component;

use super::runtime::Runtime;

/// Reads and compiles (or fetches from the cache) a component, with helpful messages for files
/// that are not components; also returns the file's SHA-256 and, for a Python component that
/// carries its module's files (`python_sources.rs`), the directory holding them: what is compiled
/// is then the file less those files, the base its build shares with every rebuild.
pub(super) fn compile(runtime: &Runtime, path: &Path) -> Result<(Component, String, Option<super::python_sources::SourcesDir>)> {
    ensure!(
        path.extension().is_none_or(|extension| extension != "py"),
        "{} is a Python module, not a component: build it with `smallrl plugin build {}` and use the .wasm it writes",
        path.display(),
        path.display()
    );
    let bytes = std::fs::read(path).with_context(|| {
        format!("cannot read plugin {}: build the standard plugins with `make plugins`, or check the path", path.display())
    })?;
    check_header(path, &bytes)?;
    let (base, carried) = super::python_sources::split(path, &bytes)?;
    let sources = carried.as_ref().map(super::python_sources::directory).transpose()?;
    let component = Component::new(&runtime.engine, &base)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("plugin {} is not a valid WebAssembly component", path.display()))?;
    Ok((component, super::sha256_hex(&bytes), sources))
}

fn check_header(path: &Path, bytes: &[u8]) -> Result<()> {
    const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];
    const COMPONENT_VERSION: [u8; 4] = [0x0d, 0, 1, 0];
    ensure!(
        bytes.len() >= 8 && bytes.starts_with(b"\0asm"),
        "plugin {} is not a WebAssembly file (it does not start with `\\0asm`): a plugin is a .wasm component, see `smallrl plugin new`",
        path.display()
    );
    match <[u8; 4]>::try_from(&bytes[4..8]).expect("length checked above") {
        COMPONENT_VERSION => Ok(()),
        CORE_MODULE_VERSION => bail!(
            "plugin {} is a core WebAssembly module, not a component: wrap it with \
             `cargo run -p smallrl-componentize -- {}=OUT.wasm` (see plugins/README.md)",
            path.display(),
            path.display()
        ),
        version => bail!("plugin {} has an unsupported WebAssembly binary version {version:?}", path.display()),
    }
}
