//! The policy a run trains, as one part: the model with its tokenizer and files, its reference,
//! adapters and optimizer, the
//! objective, the sampling settings, and the run's seat at the engine, through which every
//! sampler call and scoring pass goes (the engine picks the implementation and stacks a pack's
//! jobs; the policy says once in train.log when they ran stacked). The step asks the policy for
//! what changes or probes it (`train`, `update`, the absorption norms) rather than reaching into
//! its optimizer, adapters or seat.

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use super::TrainConfig;
use crate::adapters::{AdapterConfig, AdapterKind, FORGET, set_base_trainable};
use super::metrics::key;
use super::rollout::Rollout;
use std::collections::BTreeMap;

use crate::engine::{Ahead, BackwardPass, Done, LossBatch, OwnPassesJob, Passes, RescoreJob, ScoreJob, Seat, Sequences, SketchJob, TokenLogprobs, TrainJob};
use crate::model::decode::DecodeModel;
use crate::grpo::{self, Objective};
use crate::model::generate::{Generation, SamplingParams};
use crate::model::linear::AdapterCtl;
use crate::model::{self, Llama, ModelFiles, Tokenizer};
use crate::optim::{AdamW, AdamWConfig};
use crate::{rng, routing};
use crate::runlog::RunLog;

/// One call of the policy's sampler: `prompt_ids` at adapter `scales`, seeded by `seed`.
pub(super) struct SampleRequest {
    pub scales: Vec<f64>,
    pub prompt_ids: Vec<Vec<u32>>,
    pub seed: u64,
}

/// A batch [`Policy::sample`] drew: the joined generation, this run's share of the sampling
/// time, and the fingerprint of the weights that sampled its first rows (the routed ones).
pub(super) struct SampledBatch {
    pub generation: Generation,
    pub seconds: f64,
    pub fingerprint: f64,
}

/// Its fields are its own: the step, the draw, evaluation and checkpoints ask it through
/// methods, so what reaches the model, the optimizer and the seat is said here.
pub(super) struct Policy {
    model: Llama,
    tokenizer: Tokenizer,
    /// Where the model was read from (the checkpoint names its source; full fine-tuning copies
    /// its tokenizer file).
    files: ModelFiles,
    /// Full fine-tuning only: the frozen starting model (with adapters the reference is the
    /// model with its adapters switched off).
    reference: Option<Llama>,
    adapters: AdapterConfig,
    optimizer: AdamW,
    /// The run's place at the engine that samples, scores and trains it (alone, or shared by
    /// the runs of a pack).
    seat: Seat,
    objective: Objective,
    /// Training's and evaluation's: the run's temperature, top_k and top_p.
    sampling: SamplingParams,
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

/// What the run reads of the policy, and the seat's housekeeping, asked of the policy rather
/// than of its fields.
impl Policy {
    /// The model as it is now (its trained weights the optimizer's).
    pub fn model(&self) -> &Llama {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The training batches' sampling settings.
    pub fn sampling(&self) -> &SamplingParams {
        &self.sampling
    }

    /// Where the model was read from.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    pub fn adapters(&self) -> &AdapterConfig {
        &self.adapters
    }

    pub fn objective(&self) -> &Objective {
        &self.objective
    }

    /// The policy's version: the optimizer steps it has taken (a batch sampled now is of it).
    pub fn version(&self) -> usize {
        self.optimizer.step
    }

    /// The trained parameters by name (the checkpoint's weights).
    pub fn trained_params(&self) -> &[(String, Tensor)] {
        self.optimizer.params()
    }

    /// The optimizer's moments by name (the checkpoint's optimizer state).
    pub fn optimizer_state(&self) -> Vec<(String, Tensor)> {
        self.optimizer.state_tensors()
    }

    /// Resumes from a checkpoint (`source`, for errors): its trained `weights`, then the
    /// optimizer's state at `step`.
    pub fn restore(&mut self, weights: &BTreeMap<String, Tensor>, optimizer: &BTreeMap<String, Tensor>, step: usize, source: &str) -> Result<()> {
        crate::adapters::load_trainable(self.optimizer.params(), weights, source)?;
        self.optimizer.load_state(optimizer, step, source)
    }

    /// Waits for the seat's turn to work (before the run's first step).
    pub fn start_working(&mut self) {
        self.seat.start_working();
    }

    /// Runs seated at the policy's engine so far ([`Seat::runs`]).
    pub fn runs(&self) -> usize {
        self.seat.runs()
    }

    /// The decoders the run holds at its seat ([`Seat::decoders`]).
    pub fn decoders(&self) -> usize {
        self.seat.decoders()
    }

    /// A test hook ([`Seat::break_weight_refresh_for_tests`]).
    pub fn break_weight_refresh_for_tests(&mut self) {
        self.seat.break_weight_refresh_for_tests();
    }

    /// Starts sampling `request` ahead on the seat's sampler thread from the weights as they
    /// are; returns their fingerprint.
    pub fn sample_ahead(&mut self, request: SampleRequest) -> Result<f64> {
        self.seat.sample_ahead(&self.model, &request.scales, request.prompt_ids, self.sampling, request.seed)
    }

    /// Starts playing a batch ahead on the seat's sampler thread (`play`: its multi-turn
    /// episodes) from the weights as they are, at adapter `scales`; returns their fingerprint.
    pub fn play_ahead(&mut self, scales: &[f64], play: crate::engine::Play) -> Result<f64> {
        self.seat.play_ahead(&self.model, scales, play)
    }

    /// The oldest generation [`Policy::sample_ahead`] started, waiting for it if need be.
    pub fn take_ahead(&mut self) -> Result<Ahead> {
        self.seat.take_ahead()
    }

    /// The run's decoder at `scales` (refreshed from the weights and checked) and the
    /// fingerprint of the weights it holds, with the tokenizer and sampling settings, for the
    /// multi-turn episodes.
    pub fn episode_sampler(&mut self, scales: &[f64]) -> Result<(&DecodeModel, f64, &Tokenizer, &SamplingParams)> {
        let (decoder, fingerprint) = self.seat.decoder(&self.model, scales)?;
        Ok((decoder, fingerprint, &self.tokenizer, &self.sampling))
    }

    /// Evaluation's sampler through the run's seat (its decoders kept and shared with
    /// training's), with the tokenizer.
    pub fn eval_sampler(&mut self) -> (&Tokenizer, impl FnMut(&[f64], &[Vec<u32>], &SamplingParams, u64) -> Result<Generation> + '_) {
        let Policy { tokenizer, seat, model, .. } = self;
        (tokenizer, move |scales: &[f64], prompts: &[Vec<u32>], params: &SamplingParams, seed: u64| seat.sample(model, scales, prompts, params, seed).map(|done| done.value.generation))
    }

    /// The step's own backward passes over `batch` with the probes' hooks (the seat's
    /// own-passes job, [`crate::engine::backward_passes`]).
    pub fn backward_passes(&self, batch: LossBatch, passes: Passes, before_backward: &mut dyn FnMut(&TokenLogprobs, grpo::TokenMasks), after_backward: &mut dyn FnMut()) -> BackwardPass {
        let job = OwnPassesJob { model: &self.model, batch, temperature: self.sampling.temperature, objective: &self.objective, passes, before_backward, after_backward };
        self.seat.own_passes(job).value
    }

    /// The completions' log-probabilities and entropies under the policy as it is, with
    /// adapter controls `ctl`, no gradient (the seat's re-scoring job).
    pub fn rescore(&self, seqs: Sequences, ctl: &[AdapterCtl]) -> TokenLogprobs {
        self.seat.rescore(RescoreJob { model: &self.model, seqs, ctl, temperature: self.sampling.temperature }).value
    }

    /// The sketches of each sequence's gradient of its log-probability over its model tokens
    /// (an episode's observations not counted) with respect to the trained parameters `params`
    /// (the seat's sketch job; the Fisher kernel's).
    pub fn sketch_sequences(&self, generation: &Generation, ctl: &[AdapterCtl], params: &[Tensor], project: &dyn Fn(&[Tensor]) -> Tensor) -> Tensor {
        let counted = generation.model_tokens();
        self.seat.sketch(SketchJob { model: &self.model, seqs: generation.into(), counted: &counted, ctl, temperature: self.sampling.temperature, params, project }).value
    }

    /// The jobs this run handed its seat so far, by kind ([`Seat::jobs`]), as a log line's text.
    pub fn engine_jobs(&self) -> String {
        self.seat.jobs().iter().map(|(kind, count)| format!("{kind} {count}")).collect::<Vec<_>>().join(", ")
    }
}

impl Policy {
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

    /// Samples `requests` and joins their generations, with this run's share of the sampling
    /// time and the fingerprint of the weights that sampled the first rows.
    pub fn sample(&mut self, requests: Vec<SampleRequest>, log: &mut RunLog) -> Result<SampledBatch> {
        let (mut seconds, mut fingerprint) = (0.0, None);
        let mut parts = Vec::with_capacity(requests.len());
        for request in requests {
            let done = self.seat.sample(&self.model, &request.scales, &request.prompt_ids, &self.sampling, request.seed)?;
            if done.runs > 1 {
                self.announce(log, "sample", || format!("sampling stacked with {} packed runs (one batched decode; the same tokens as alone)", done.runs));
            }
            seconds += done.seconds;
            fingerprint = fingerprint.or(Some(done.value.fingerprint));
            parts.push(done.value.generation);
        }
        let fingerprint = fingerprint.context("internal error: a batch drawn without a sampler call")?;
        Ok(SampledBatch { generation: self.joined(parts), seconds, fingerprint })
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

    /// Whether the run trains two adapters (retain and forget), whose norms the absorption
    /// diagnostics log per slot.
    pub fn is_dual(&self) -> bool {
        self.adapters.is_dual()
    }

    /// Whether a batch's kept token sets are replayed in the loss (top_k/top_p sampling with
    /// sampling replay).
    pub fn replays_kept_sets(&self) -> bool {
        crate::model::generate::kept_capacity(&self.sampling, self.model.config.vocab_size).is_some()
    }

    /// Whether the objective takes its ratio to the sampler's log-probabilities.
    pub fn ratio_to_sampler(&self) -> bool {
        self.objective.ratio_to == crate::grpo::RatioTo::Sampler
    }

    /// Starts a rollout: drops the set-up time the seat measured for evaluations since the
    /// last one (not this batch's).
    pub fn begin_rollout(&mut self) {
        self.seat.take_setup_seconds();
    }

    /// The sampler's set-up time since the last call (inside the sampling time).
    pub fn take_setup_seconds(&mut self) -> f64 {
        self.seat.take_setup_seconds()
    }

    pub fn zero_grad(&mut self) {
        self.optimizer.zero_grad();
    }

    /// The trained parameters (views), whose gradients the probes read between passes.
    pub fn trained_tensors(&self) -> Vec<Tensor> {
        self.optimizer.params().iter().map(|(_, t)| t.shallow_clone()).collect()
    }

    /// Whether this run's backward passes would run stacked with other packed runs' (so a run
    /// that needs its own passes says it leaves the stack).
    pub fn stacks_passes_in_a_pack(&self) -> bool {
        self.seat.stacks_passes_in_a_pack(&self.model)
    }

    /// One plain backward pass over `batch` through the engine (stacked with other runs' in a
    /// pack that stacks).
    pub fn train(&mut self, batch: LossBatch<'_>, log: &mut RunLog) -> Result<Done<BackwardPass>> {
        let job = TrainJob { model: &self.model, batch, temperature: self.sampling.temperature, objective: &self.objective };
        let done = self.seat.train(job)?;
        if done.runs > 1 {
            self.announce(log, "train", || format!("training stacked with {} packed runs (one batched forward and backward pass; each run's own loss and optimizer)", done.runs));
        }
        Ok(done)
    }

    /// The optimizer step on the gradients in the parameters: clipped to `max_grad_norm`
    /// (with `split_moment`, `natural` gradients clipped by the same factor and fed to the
    /// second moment), AdamW at `learning_rate`; returns the norm before clipping. With two
    /// adapters, each slot's gradient, weight and update norms go to `absorption`.
    pub fn update(&mut self, learning_rate: f64, max_grad_norm: f64, natural: Option<&mut Vec<Tensor>>, absorption: &mut Vec<(String, f64)>) -> f64 {
        let before = self.is_dual().then(|| self.absorption_before_step(absorption));
        let grad_norm = match natural {
            Some(natural) => {
                let grad_norm = self.optimizer.clip_grad_norm_also(max_grad_norm, natural);
                self.optimizer.step_split_moment(learning_rate, natural);
                grad_norm
            }
            None => {
                let grad_norm = self.optimizer.clip_grad_norm(max_grad_norm);
                self.optimizer.step(learning_rate);
                grad_norm
            }
        };
        if let Some(before) = before {
            self.absorption_after_step(&before, absorption);
        }
        grad_norm
    }

    /// Each adapter's gradient norm from the flagged and from the unflagged samples' loss terms
    /// alone: the step's token weights kept on each set of rows, two losses that add up to the
    /// step's for every loss type; one extra backward pass each through the step's graph
    /// (kept), into fresh tensors, so the step's own gradient is untouched.
    pub fn gradient_norms_by_class(&self, rollout: &Rollout, current: &TokenLogprobs, masks: grpo::TokenMasks) -> Vec<(String, f64)> {
        let flagged = routing::row_mask(&rollout.flagged, current.logprobs.device());
        let mut out = Vec::new();
        for (quantity, rows) in [(key::ABSORPTION_GRAD_NORM_FLAGGED, flagged.shallow_clone()), (key::ABSORPTION_GRAD_NORM_UNFLAGGED, 1.0 - &flagged)] {
            let weights = grpo::row_token_weights(masks.loss, &rollout.plan.classes, self.objective.aggregation, &rows);
            let logprobs = grpo::LossLogprobs {
                current: &current.logprobs,
                old: rollout.old_logprobs.as_ref(),
                reference: rollout.ref_logprobs.as_ref(),
                sampler: Some(&rollout.generation.sampling_logprobs),
                replayed: current.replayed.as_ref(),
                old_is_sampler: rollout.old_is_sampler,
            };
            let loss = grpo::sampled_loss(logprobs, &rollout.advantages, masks, &weights, &self.objective).loss;
            out.extend(self.slot_values(quantity, self.adapters.slot_gradient_norms(&self.model, &loss)));
        }
        out
    }

    /// Records each adapter's gradient norm (before clipping) and returns a copy of the adapter
    /// weights, for the update's norm.
    fn absorption_before_step(&self, absorption: &mut Vec<(String, f64)>) -> Vec<(String, Tensor)> {
        let params = self.adapters.trainable(&self.model);
        let grads: Vec<(String, Tensor)> = params.iter().map(|(name, t)| (name.clone(), crate::adapters::gradient_or_zeros(t.grad(), t))).collect();
        absorption.extend(self.slot_values(key::ABSORPTION_GRAD_NORM, self.adapters.slot_norms(&grads)));
        params.into_iter().map(|(name, t)| (name, t.detach().copy())).collect()
    }

    /// Each adapter's weight norm after the step and the norm of the step's change.
    fn absorption_after_step(&self, before: &[(String, Tensor)], absorption: &mut Vec<(String, f64)>) {
        let after = self.adapters.trainable(&self.model);
        let updates: Vec<(String, Tensor)> = after.iter().zip(before).map(|((name, now), (_, then))| (name.clone(), now.detach() - then)).collect();
        absorption.extend(self.slot_values(key::ABSORPTION_PARAM_NORM, self.adapters.slot_norms(&after)));
        absorption.extend(self.slot_values(key::ABSORPTION_UPDATE_NORM, self.adapters.slot_norms(&updates)));
    }

    /// `absorption/<slot>/<quantity>` for each adapter slot's value.
    fn slot_values(&self, quantity: &str, values: Vec<f64>) -> Vec<(String, f64)> {
        self.adapters.slots.iter().zip(values).map(|(slot, value)| (key::absorption(slot, quantity), value)).collect()
    }
}
