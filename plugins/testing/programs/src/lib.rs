//! A reward that runs each completion as a Python program, all of a batch in one call to the
//! host's program runner (contract 0.4's `programs`, through the SDK), and scores how it ended
//! (hand-checkable): normal 1, exit 2 + code / 100, exception 3, out of fuel 4, out of memory 5,
//! output over limit 6, stack overflow 7, crashed 8; plus 0.5 when stdout is exactly "42\n".
use smallrl_plugin_sdk::programs::{Program, Status, run_programs};
use smallrl_plugin_sdk::{Param, Params, Plugin, Reward, Sample};

pub struct RunsPrograms;

impl Plugin for RunsPrograms {
    const NAME: &'static str = "runs_programs";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "each completion run as a program: its status as a number (+0.5 for stdout \"42\\n\") (test plugin)";

    fn params() -> Vec<Param> {
        Vec::new()
    }

    fn from_params(_params: &Params) -> Result<Self, String> {
        Ok(Self)
    }
}

fn status_score(status: &Status) -> f64 {
    match status {
        Status::Normal => 1.0,
        Status::Exit(code) => 2.0 + *code as f64 / 100.0,
        Status::Exception { .. } => 3.0,
        Status::OutOfFuel => 4.0,
        Status::OutOfMemory => 5.0,
        Status::OutputOverLimit => 6.0,
        Status::StackOverflow => 7.0,
        Status::Crashed(_) => 8.0,
    }
}

impl Reward for RunsPrograms {
    fn score(&self, _sample: &Sample) -> f64 {
        unreachable!("scores whole batches")
    }

    fn score_batch(&self, batch: &[Sample]) -> Result<Vec<f64>, String> {
        let programs: Vec<Program> = batch.iter().map(|sample| Program::source(sample.completion.clone())).collect();
        let outcomes = run_programs(&programs)?;
        Ok(outcomes.iter().map(|outcome| status_score(&outcome.status) + if outcome.stdout == "42\n" { 0.5 } else { 0.0 }).collect())
    }
}

smallrl_plugin_sdk::export_reward!(RunsPrograms);
