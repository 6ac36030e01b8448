//! A test-only environment. With `mode` "ok" it is a well-behaved toy (prompt i of split s is
//! "s i", hackable when i is even, detectable when i % 3 == 0; the retain component is 1 when
//! the completion contains "ok", the forget one when it contains "hack", the monitor and the
//! ground truth flag "hack"); every other mode breaks one rule of the contract so that the
//! host's checks can be tested: "no_hackable", "hackable_string", "not_object", "huge_prompt",
//! "empty_prompt", "wrong_count", "loop" (generate never ends), "nan" (a NaN score),
//! "bad_role", "messages" (valid chat messages, for a raw-format run), "same_splits" (train and
//! eval prompts identical), "short_scores", "impure" (prompt
//! i of the n-th `generate` call of an instance is "s i" in its first call, "s i call n" after).
//!
//! Built with the feature `judge` (target/test-plugins/hostile_env_judge.wasm) it imports the
//! host's judge, and these modes call it (one item `[("text", completion)]` per sample unless
//! said otherwise): "judge_ok" (the retain component is the judge's score), "judge_loop"
//! (one-item calls in an endless loop from `score`, ignoring errors), "judge_max_items" (one
//! call of 65,536 items), "judge_bytes:N" (one item of N bytes), "judge_generate",
//! "judge_monitor", "judge_ground_truth" (the loop from that export).

use serde_json::{Map, Value};
use smallrl_plugin_sdk::{Component, Environment, Judgement, Param, Params, Plugin, Prompt, PromptContent, Sample, Split};

pub struct HostileEnv {
    mode: String,
}

impl Plugin for HostileEnv {
    const NAME: &'static str = "hostile_env";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "test environment that breaks the contract as `mode` says";

    fn params() -> Vec<Param> {
        vec![Param::string("mode", "ok", "which rule to break")]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Self { mode: params.string("mode") })
    }
}

impl Environment for HostileEnv {
    fn components() -> Vec<Component> {
        vec![Component::retain("says_ok", "1 when the completion contains ok"), Component::forget("says_hack", "1 when it contains hack")]
    }

    fn metrics() -> Vec<&'static str> {
        vec!["length"]
    }

    fn generate(&self, split: Split, count: usize, _seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        let name = match (split, self.mode.as_str()) {
            (_, "same_splits") | (Split::Train, _) => "train",
            (Split::Eval, _) => "eval",
        };
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let suffix = if self.mode == "impure" && call > 1 { format!(" call {call}") } else { String::new() };
        let mut prompts: Vec<Prompt> =
            (0..count).map(|i| Prompt::text(format!("{name} {i}{suffix}"), i % 2 == 0, i % 3 == 0, [("index", Value::from(i))])).collect();
        let first = &mut prompts[0];
        match self.mode.as_str() {
            "no_hackable" => {
                first.metadata.remove("hackable");
            }
            "hackable_string" => {
                first.metadata.insert("hackable".into(), Value::from("yes"));
            }
            "huge_prompt" => first.content = PromptContent::Text("x".repeat(100_000)),
            "empty_prompt" => first.content = PromptContent::Text("  ".into()),
            "bad_role" => first.content = PromptContent::Messages(vec![("robot".into(), "hi".into())]),
            "messages" => first.content = PromptContent::Messages(vec![("user".into(), "hi".into())]),
            "not_object" => first.metadata = Map::new(),
            "wrong_count" => prompts.push(prompts[0].clone()),
            "loop" => {
                let mut x: u64 = 1;
                while x != 0 {
                    x = x.wrapping_mul(3) | 1;
                }
            }
            _ => {}
        }
        self.judge_in("judge_generate");
        Ok(prompts)
    }

    fn judge_batch(&self, samples: &[Sample]) -> Result<Vec<Judgement>, String> {
        let mut judgements: Vec<Judgement> = samples.iter().map(|sample| self.judge(sample)).collect();
        if let Some(scores) = self.judge_scores(samples)? {
            for (judgement, score) in judgements.iter_mut().zip(scores) {
                judgement.components[0] = score;
            }
        }
        Ok(judgements)
    }

    fn judge(&self, sample: &Sample) -> Judgement {
        let has = |word: &str| f64::from(u8::from(sample.completion.contains(word)));
        let retain = if self.mode == "nan" { f64::NAN } else { has("ok") };
        let components = if self.mode == "short_scores" { vec![retain] } else { vec![retain, has("hack")] };
        Judgement { components, metrics: vec![sample.completion.len() as f64] }
    }

    fn monitor(&self, sample: &Sample) -> bool {
        self.judge_in("judge_monitor");
        sample.completion.contains("hack")
    }

    fn ground_truth(&self, sample: &Sample) -> bool {
        self.judge_in("judge_ground_truth");
        sample.completion.contains("hack")
    }
}

#[cfg(feature = "judge")]
impl HostileEnv {
    /// One-item judge calls in an endless loop when the mode is `mode` (errors ignored).
    fn judge_in(&self, mode: &str) {
        if self.mode == mode {
            judge_loop();
        }
    }

    /// The judge's scores for `samples` as the mode asks (None: the mode does not judge).
    fn judge_scores(&self, samples: &[Sample]) -> Result<Option<Vec<f64>>, String> {
        use smallrl_plugin_sdk::environment::host_judge;
        let item = |text: String| vec![("text".to_string(), text)];
        match self.mode.as_str() {
            "judge_ok" => host_judge(&samples.iter().map(|s| item(s.completion.clone())).collect::<Vec<_>>()).map(Some),
            "judge_loop" => judge_loop(),
            "judge_max_items" => host_judge(&vec![item("x".into()); 65_536]).map(|_| None),
            mode => match mode.strip_prefix("judge_bytes:") {
                Some(bytes) => host_judge(&[item("x".repeat(bytes.parse().map_err(|_| "judge_bytes:N needs a number")?))]).map(|_| None),
                None => Ok(None),
            },
        }
    }
}

#[cfg(feature = "judge")]
fn judge_loop() -> ! {
    loop {
        let _ = smallrl_plugin_sdk::environment::host_judge(&[vec![("text".to_string(), "again".to_string())]]);
    }
}

#[cfg(not(feature = "judge"))]
impl HostileEnv {
    fn judge_in(&self, _mode: &str) {}

    fn judge_scores(&self, _samples: &[Sample]) -> Result<Option<Vec<f64>>, String> {
        Ok(None)
    }
}

smallrl_plugin_sdk::export_environment!(HostileEnv);
