//! A reward plugin that misbehaves in the way its `mode` parameter says, so the sandbox tests
//! can check that the host turns each failure into a clear error and keeps working.
//! Never use it in a config: it exists only under `target/test-plugins/`.
use smallrl_plugin_sdk::{Param, Params, Plugin, Reward, Sample};

pub struct Misbehaving {
    mode: String,
}

impl Plugin for Misbehaving {
    const NAME: &'static str = "misbehaving";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "test plugin: ok | loop | memory_bomb | panic | wrong_count | nan | inf | error";

    fn params() -> Vec<Param> {
        vec![Param::string("mode", "ok", "how to misbehave when scoring")]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { mode: params.string("mode") })
    }
}

impl Reward for Misbehaving {
    fn score(&self, _sample: &Sample) -> f64 {
        0.5
    }

    fn score_batch(&self, batch: &[Sample]) -> Result<Vec<f64>, String> {
        let mut scores = vec![0.5; batch.len()];
        match self.mode.as_str() {
            "ok" => {}
            "loop" => spin_forever(),
            "memory_bomb" => allocate_forever(),
            "panic" => panic!("deliberate panic while scoring {} samples", batch.len()),
            "wrong_count" => scores.push(0.5),
            "nan" => scores[0] = f64::NAN,
            "inf" => scores[0] = f64::INFINITY,
            "error" => return Err("deliberate error: the judge is on strike".to_string()),
            other => return Err(format!("unknown mode {other:?}")),
        }
        Ok(scores)
    }
}

fn spin_forever() -> ! {
    let mut counter = 0u64;
    loop {
        counter = std::hint::black_box(counter.wrapping_add(1));
    }
}

fn allocate_forever() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
    }
}

smallrl_plugin_sdk::export_reward!(Misbehaving);
