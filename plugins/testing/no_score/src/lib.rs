//! A reward that gives no score (contract 0.5's none, through the SDK's
//! `Reward::score_batch_optional`) to a completion that contains "skip", and to the samples at
//! the batch positions `none_at` lists; otherwise the number of "happy" in the completion, or
//! with `score: chars` its length in characters (hand-checkable, and different from sample to
//! sample, so a training step's advantages are not all 0), or with `score: happy_count` the
//! standard happy_count's min(count / 5, 1) (what `plugin bench --path` compares with).
use smallrl_plugin_sdk::{Param, Params, Plugin, Reward, Sample};

pub struct NoScore {
    none_at: Vec<usize>,
    score: Score,
}

enum Score {
    Happy,
    Chars,
    HappyCount,
}

impl Plugin for NoScore {
    const NAME: &'static str = "no_score";
    const VERSION: &'static str = "0.2.0";
    const DESCRIPTION: &'static str = "count of \"happy\" (or characters); no score for a completion containing \"skip\" or at the positions none_at (test plugin)";

    fn params() -> Vec<Param> {
        vec![
            Param::string_list("none_at", &[], "batch positions (0-based, as decimal strings) of the samples given no score"),
            Param::string("score", "happy", "happy (the count of \"happy\"), chars (the completion's length in characters) or happy_count (min(count / 5, 1))"),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        let none_at = params.string_list("none_at").iter().map(|at| at.parse().map_err(|_| format!("none_at: {at:?} is not a batch position"))).collect::<Result<_, _>>()?;
        let score = match params.string("score").as_str() {
            "happy" => Score::Happy,
            "chars" => Score::Chars,
            "happy_count" => Score::HappyCount,
            other => return Err(format!("score must be happy, chars or happy_count, got {other:?}")),
        };
        Ok(Self { none_at, score })
    }
}

impl Reward for NoScore {
    fn score(&self, sample: &Sample) -> f64 {
        let happy = sample.completion.matches("happy").count() as f64;
        match self.score {
            Score::Happy => happy,
            Score::Chars => sample.completion.chars().count() as f64,
            Score::HappyCount => (happy / 5.0).min(1.0),
        }
    }

    fn score_batch_optional(&self, batch: &[Sample]) -> Result<Vec<Option<f64>>, String> {
        let unscored = |at: usize, sample: &Sample| sample.completion.contains("skip") || self.none_at.contains(&at);
        Ok(batch.iter().enumerate().map(|(at, sample)| (!unscored(at, sample)).then(|| self.score(sample))).collect())
    }
}

smallrl_plugin_sdk::export_reward!(NoScore);
