//! A reward plugin that returns hostile values where the host reads plugin-supplied text or
//! sizes: each Cargo feature selects one (see Cargo.toml). Written against the raw WIT rather
//! than the SDK, which would not produce such values. Exists only under `target/test-plugins/`.
wit_bindgen::generate!({ world: "reward", path: "../../../wit" });

use exports::smallrl::reward::{plugin, scorer};
use smallrl::reward::types::{ParamInfo, PluginInfo, PluginKind, Sample};

/// 20 MiB: far beyond anything a terminal or a log should receive.
const HUGE: usize = 20 << 20;

/// A terminal-driving payload: clear screen, red text, a NUL and a bell.
const ESCAPES: &str = "\u{1b}[2J\u{1b}[31mowned\0\u{7}";

/// 100 MiB of zero-initialised memory: the component's initial memory is over the default
/// 64 MiB limit before any call.
#[cfg(feature = "big_memory")]
static mut BIG: [u8; 100 << 20] = [0; 100 << 20];

struct Hostile;

fn huge_text() -> String {
    let mut text = ESCAPES.repeat(4);
    text.push_str(&"x".repeat(HUGE));
    text
}

fn name() -> String {
    if cfg!(feature = "huge_name") {
        "n".repeat(HUGE)
    } else if cfg!(feature = "control_name") {
        format!("evil{ESCAPES}")
    } else {
        "hostile".to_string()
    }
}

fn params() -> Vec<ParamInfo> {
    let type_name = if cfg!(feature = "bad_type") { "banana" } else { "number" };
    vec![ParamInfo { name: "level".into(), type_name: type_name.into(), default_json: "1".into(), description: "how hostile".into() }]
}

impl plugin::Guest for Hostile {
    fn info() -> PluginInfo {
        #[cfg(feature = "big_memory")]
        // Read one byte so the array is kept in the module's memory.
        let _ = unsafe { core::ptr::read_volatile((&raw const BIG).cast::<u8>().add(12345)) };
        PluginInfo {
            name: name(),
            version: if cfg!(feature = "bad_semver") { "latest".into() } else { "0.1.0".into() },
            kind: PluginKind::Reward,
            description: if cfg!(feature = "huge_description") { huge_text() } else { "test plugin".into() },
            params: params(),
        }
    }

    fn configure(params_json: String) -> Result<(), String> {
        match params_json.contains("reject") {
            true => Err(huge_text()),
            false => Ok(()),
        }
    }
}

impl scorer::Guest for Hostile {
    fn score(batch: Vec<Sample>) -> Result<Vec<Option<f64>>, String> {
        match cfg!(feature = "huge_error") {
            true => Err(huge_text()),
            false => Ok(vec![Some(0.5); batch.len()]),
        }
    }
}

export!(Hostile);
