//! Jobs of several runs of a pack run as one pass over their weights stacked on a leading run
//! axis (the engine's [`super::Stacking`]): one group of compatible jobs each, the group's wall
//! time shared among its runs. Which jobs form a group is `shared.rs`'s decision.

use std::collections::HashMap;

use anyhow::{Result, anyhow};

use super::jobs::{Done, Outcome, SampleJob, ScoreJob, TrainJob, timed};
use super::{LossBatch, Sequences, backward_stacked, stacked_frozen_logprobs};
use crate::grpo::Objective;
use crate::model::Llama;
use crate::model::decode::DecodeModel;
use crate::model::generate::{Decoder, Generation, generate_stacked};
use crate::model::linear::AdapterCtl;

pub(super) fn sample_group(group: Vec<(usize, SampleJob)>, decoders: &mut HashMap<Vec<(usize, Vec<u64>)>, DecodeModel>) -> Vec<(usize, Done<Outcome>)> {
    let runs = group.len();
    let key: Vec<(usize, Vec<u64>)> = group.iter().map(|(run, job)| (*run, job.scales.iter().map(|s| s.to_bits()).collect())).collect();
    let parts: Vec<&DecodeModel> = group.iter().map(|(_, job)| job.decoder).collect();
    let (generations, seconds) = timed(runs, || {
        let stacked = match decoders.get_mut(&key) {
            Some(stacked) => {
                stacked.refresh_stacked(&parts);
                stacked
            }
            None => decoders.entry(key.clone()).or_insert_with(|| DecodeModel::stacked(&parts)),
        };
        let expected: Vec<f64> = parts.iter().flat_map(|part| part.fingerprints()).collect();
        super::delivery::check(&stacked.fingerprints(), &expected, "the pack's stacked sampler")?;
        let decoder = if stacked.device.is_cuda() { Decoder::CudaGraphs } else { Decoder::Libtorch };
        let prompts: Vec<&[Vec<u32>]> = group.iter().map(|(_, job)| job.prompts).collect();
        let seeds: Vec<u64> = group.iter().map(|(_, job)| job.seed).collect();
        generate_stacked(decoder, stacked, &prompts, group[0].1.params, &seeds)
    });
    let per_run: Vec<Result<Generation>> = match generations {
        Ok(per_run) => per_run,
        Err(error) => {
            let message = format!("{error:#}");
            (0..runs).map(|_| Err(anyhow!("the stacked decode of {runs} packed runs failed: {message}"))).collect()
        }
    };
    group.iter().zip(per_run).map(|((run, _), value)| (*run, Done { value: Outcome::Sample(value), seconds, runs })).collect()
}

pub(super) fn score_group(group: Vec<(usize, ScoreJob)>) -> Vec<(usize, Done<Outcome>)> {
    let runs = group.len();
    let (logprobs, seconds) = timed(runs, || {
        let models: Vec<&Llama> = group.iter().map(|(_, job)| job.model).collect();
        let ctl: Vec<&[AdapterCtl]> = group.iter().map(|(_, job)| job.ctl).collect();
        let seqs: Vec<Sequences> = group.iter().map(|(_, job)| job.generation.into()).collect();
        let temperatures: Vec<f64> = group.iter().map(|(_, job)| job.temperature).collect();
        stacked_frozen_logprobs(&models, &ctl, &seqs, &temperatures)
    });
    group.iter().zip(logprobs).map(|((run, _), value)| (*run, Done { value: Outcome::Score(Ok(value)), seconds, runs })).collect()
}

pub(super) fn train_group(group: Vec<(usize, TrainJob)>) -> Vec<(usize, Done<Outcome>)> {
    let runs = group.len();
    let (passes, seconds) = timed(runs, || {
        let models: Vec<&Llama> = group.iter().map(|(_, job)| job.model).collect();
        let batches: Vec<LossBatch> = group.iter().map(|(_, job)| job.batch).collect();
        let temperatures: Vec<f64> = group.iter().map(|(_, job)| job.temperature).collect();
        let objectives: Vec<&Objective> = group.iter().map(|(_, job)| job.objective).collect();
        backward_stacked(&models, &batches, &temperatures, &objectives)
    });
    group.iter().zip(passes).map(|((run, _), pass)| (*run, Done { value: Outcome::Train(pass), seconds, runs })).collect()
}
