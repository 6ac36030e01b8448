//! A reward that gives no score (contract 0.5's none, through the SDK's
//! `Reward::score_batch_optional`) to a completion that contains "skip", and otherwise the
//! number of "happy" in it (hand-checkable).
use smallrl_plugin_sdk::{Params, Plugin, Reward, Sample};

pub struct NoScore;

impl Plugin for NoScore {
    const NAME: &'static str = "no_score";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "count of \"happy\"; no score for a completion containing \"skip\" (test plugin)";

    fn from_params(_params: &Params) -> Result<Self, String> {
        Ok(Self)
    }
}

impl Reward for NoScore {
    fn score(&self, sample: &Sample) -> f64 {
        sample.completion.matches("happy").count() as f64
    }

    fn score_batch_optional(&self, batch: &[Sample]) -> Result<Vec<Option<f64>>, String> {
        Ok(batch.iter().map(|sample| (!sample.completion.contains("skip")).then(|| self.score(sample))).collect())
    }
}

smallrl_plugin_sdk::export_reward!(NoScore);
