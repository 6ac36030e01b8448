//! A reward plugin that imports `wasi:random`: the host gives it the deterministic WASI, so its
//! "random" coin is a function of the plugin and the call (tests/plugins_sandbox.rs).
wit_bindgen::generate!({ world: "sneaky-reward", generate_all });

use exports::smallrl::reward::{plugin, scorer};
use smallrl::reward::types::{PluginInfo, PluginKind, Sample};

struct RandomReward;

impl plugin::Guest for RandomReward {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "random".into(),
            version: "0.1.0".into(),
            kind: PluginKind::Reward,
            description: "scores at random (forbidden)".into(),
            params: Vec::new(),
        }
    }

    fn configure(_params_json: String) -> Result<(), String> {
        Ok(())
    }
}

impl scorer::Guest for RandomReward {
    fn score(batch: Vec<Sample>) -> Result<Vec<Option<f64>>, String> {
        let coin = wasi::random::random::get_random_u64();
        Ok(batch.iter().map(|_| Some((coin % 2) as f64)).collect())
    }
}

export!(RandomReward);
