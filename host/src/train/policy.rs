//! The policy a run trains, as one part: the model with its tokenizer and files, its reference,
//! adapters and optimizer, the
//! objective, the sampling settings, and the run's seat at the engine, through which every
//! sampler call and scoring pass goes (the engine picks the implementation and stacks a pack's
//! jobs; the policy says once in train.log when they ran stacked).

use anyhow::Result;
use tch::{Device, Kind, Tensor};

use super::TrainConfig;
use crate::adapters::{AdapterConfig, AdapterKind, FORGET, set_base_trainable};
use crate::engine::{Done, ScoreJob, Seat};
use crate::grpo::Objective;
use crate::model::generate::{Generation, SamplingParams};
use crate::model::linear::AdapterCtl;
use crate::model::{self, Llama, ModelFiles, Tokenizer};
use crate::optim::{AdamW, AdamWConfig};
use crate::rng;
use crate::runlog::RunLog;

/// One call of the policy's sampler: `prompt_ids` at adapter `scales`, seeded by `seed`.
pub(super) struct SampleRequest {
    pub scales: Vec<f64>,
    pub prompt_ids: Vec<Vec<u32>>,
    pub seed: u64,
}

pub(super) struct Policy {
    pub model: Llama,
    pub tokenizer: Tokenizer,
    /// Where the model was read from (the checkpoint names its source; full fine-tuning copies
    /// its tokenizer file).
    pub files: ModelFiles,
    /// Full fine-tuning only: the frozen starting model (with adapters the reference is the
    /// model with its adapters switched off).
    pub reference: Option<Llama>,
    pub adapters: AdapterConfig,
    pub optimizer: AdamW,
    /// The run's place at the engine that samples, scores and trains it (alone, or shared by
    /// the runs of a pack).
    pub seat: Seat,
    pub objective: Objective,
    /// Training's and evaluation's: the run's temperature, top_k and top_p.
    pub sampling: SamplingParams,
    /// The engine's stacked calls this run's train.log has mentioned (once each).
    announced: Vec<&'static str>,
}

/// Loads the run's model onto `device` in `kind`, with its adapters attached (seeded) or, for
/// full fine-tuning, a frozen copy as the reference; the policy sits at `seat`.
pub(super) fn load(cfg: &TrainConfig, device: Device, kind: Kind, mut seat: Seat) -> Result<Policy> {
    seat.set_sampler_dtype(cfg.sampler_dtype);
    let adapters = cfg.adapter_config()?;
    let loaded = model::load(&cfg.model, &cfg.revision, device, kind)?;
    let mut model = loaded.model;
    // Mixed precision (`train_dtype`): the policy's, the reference's and the old policy's passes alike.
    model.autocast = cfg.train_dtype.matmul_kind();
    let reference = match adapters.kind {
        AdapterKind::Full => {
            let frozen = model.frozen_copy();
            set_base_trainable(&mut model, true);
            Some(frozen)
        }
        _ => {
            adapters.attach(&mut model, rng::derive(cfg.seed, "adapter-init", 0))?;
            None
        }
    };
    let optimizer = AdamW::new(
        adapters.trainable(&model),
        AdamWConfig { beta1: cfg.adam_beta1, beta2: cfg.adam_beta2, eps: cfg.adam_epsilon, weight_decay: cfg.weight_decay },
    );
    let (tokenizer, files) = (loaded.tokenizer, loaded.files);
    Ok(Policy { model, tokenizer, files, reference, adapters, optimizer, seat, objective: cfg.objective()?, sampling: super::sampling_params(cfg), announced: Vec::new() })
}

impl Policy {
    /// The temperature the policy samples at and its log-probabilities are taken at.
    pub fn temperature(&self) -> f64 {
        self.sampling.temperature
    }

    /// Whether the loss has a KL term, whose reference log-probabilities a rollout holds (as
    /// TRL, no reference pass with beta = 0).
    pub fn needs_reference(&self) -> bool {
        self.objective.kl.is_some()
    }

    /// The sampler calls of a batch: the routed rows with every adapter on, then the last
    /// `coherence_rows` (if any) with the forget adapter off (the original samples coherence
    /// rows at the deployed retain-only scales), each with its own seed.
    pub fn sample_requests(&self, prompt_ids: &[Vec<u32>], coherence_rows: usize, step: usize, run_seed: u64) -> Vec<SampleRequest> {
        let routed_rows = prompt_ids.len() - coherence_rows;
        let seed = |purpose| rng::derive(run_seed, purpose, step as u64);
        let mut scales = vec![1.0; self.adapters.slots.len()];
        let mut requests = vec![SampleRequest { scales: scales.clone(), prompt_ids: prompt_ids[..routed_rows].to_vec(), seed: seed("sample") }];
        if coherence_rows > 0 {
            scales[FORGET] = 0.0;
            requests.push(SampleRequest { scales, prompt_ids: prompt_ids[routed_rows..].to_vec(), seed: seed("sample_coherence") });
        }
        requests
    }

    /// Samples `requests` and joins their generations; returns it and this run's share of the
    /// sampling time.
    pub fn sample(&mut self, requests: Vec<SampleRequest>, log: &mut RunLog) -> Result<(Generation, f64)> {
        let mut seconds = 0.0;
        let mut parts = Vec::with_capacity(requests.len());
        for request in requests {
            let done = self.seat.sample(&self.model, &request.scales, &request.prompt_ids, &self.sampling, request.seed)?;
            if done.runs > 1 {
                self.announce(log, "sample", || format!("sampling stacked with {} packed runs (one batched decode; the same tokens as alone)", done.runs));
            }
            seconds += done.seconds;
            parts.push(done.value);
        }
        Ok((self.joined(parts), seconds))
    }

    /// A batch's generations (routed rows, then coherence rows) as one.
    pub fn joined(&self, parts: Vec<Generation>) -> Generation {
        let eos = self.model.config.eos_token_id as i64;
        let mut parts = parts.into_iter();
        let first = parts.next().expect("at least the routed rows are sampled");
        parts.fold(first, |joined, part| joined.concat(part, eos))
    }

    /// Log-probabilities of the completions under the reference policy: the frozen starting
    /// model (full fine-tuning), or the model with its adapters off (the engine picks the native
    /// scorer where it serves, or stacks the pass with other runs').
    pub fn reference_logprobs(&mut self, generation: &Generation, log: &mut RunLog) -> Result<Done<Tensor>> {
        let off: Vec<AdapterCtl> = self.adapters.slots.iter().map(|_| AdapterCtl::off()).collect();
        let (model, ctl) = match &self.reference {
            Some(reference) => (reference, &[][..]),
            None => (&self.model, &off[..]),
        };
        let done = self.seat.reference(ScoreJob::new(model, ctl, generation, self.sampling.temperature))?;
        if done.runs > 1 {
            self.announce(log, "reference", || format!("reference log-probabilities stacked with {} packed runs (one batched forward pass)", done.runs));
        }
        Ok(done)
    }

    /// The ratio's old policy: the completions' log-probabilities under the policy as it is
    /// now, with the batch's routed adapter controls `ctl`.
    pub fn old_logprobs(&mut self, generation: &Generation, ctl: &[AdapterCtl]) -> Result<Tensor> {
        let job = ScoreJob::new(&self.model, ctl, generation, self.sampling.temperature);
        Ok(self.seat.old_logprobs(job)?.value)
    }

    /// Says `line` in train.log the first time this run's jobs of `kind` run as the engine
    /// reports (stacked with other runs', or alone in a pack that stacks).
    pub fn announce(&mut self, log: &mut RunLog, kind: &'static str, line: impl FnOnce() -> String) {
        if self.announced.contains(&kind) {
            return;
        }
        self.announced.push(kind);
        if let Err(error) = log.line(&line()) {
            eprintln!("warning: {error:#}");
        }
    }
}
