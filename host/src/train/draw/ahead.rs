//! Off-policy training (`max_steps_off_policy` k > 0), as tinker's `AsyncConfig`: the batch of
//! step n is sampled by the run's sampler thread (`engine::Seat::sample_ahead`) with the
//! weights of step max(0, n - k), while steps n - k .. n - 1 train. When step n takes its
//! batch it posts step n + k's, from the weights as they are then, so every batch is exactly
//! min(n, k) steps stale and none is ever older than the limit (the `dropped` count stays 0;
//! tinker drops rollouts only because its samplers race).
//!
//! With `stream_minibatches` (tinker's StreamMinibatchConfig) the same queue streams a batch's
//! mini-batches: at the batch's first step the others are posted from its weights, and step
//! n + j takes its mini-batch (j steps stale) as soon as the thread has sampled it.
//!
//! Architecture invariant: which weights sample which step depends only on the keys and the step, and
//! a checkpoint saves the batches posted but not yet trained on (`in_flight.*`), which a resumed
//! run trains on instead of sampling them again, so a resumed run equals the uninterrupted one.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{Draw, Drawing, tokenized};
use crate::model::Tokenizer;
use crate::model::generate::Generation;
use crate::train::metrics::OffPolicy;
use crate::train::policy::Policy;

/// A step's batch posted to the sampler thread (or restored from a checkpoint).
struct Queued {
    /// The optimizer step (0-based) that trains on it.
    step: usize,
    /// The weights' version it was sampled with: optimizer steps done before.
    version: usize,
    prompt_ids: Vec<Vec<u32>>,
    parts: Parts,
    /// The fingerprint of the weights that sampled its first rows (`engine::Seat::sample_ahead`).
    fingerprint: Option<f64>,
}

enum Parts {
    /// Sampler calls still with the thread (routed rows, then coherence rows).
    Posted(usize),
    Ready(Vec<Generation>),
}

/// The run's batches sampled ahead, oldest first (ready ones before posted ones).
#[derive(Default)]
pub(super) struct AheadQueue {
    queued: VecDeque<Queued>,
    /// The next step whose batch is not yet posted.
    next_step: usize,
}

/// `in_flight.json` of a checkpoint: the saved batches' steps and versions, in order.
#[derive(Serialize, Deserialize)]
struct SavedBatch {
    step: usize,
    policy_version: usize,
    parts: usize,
    /// Absent from checkpoints written before smallrl recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weights_fingerprint: Option<f64>,
}

const IN_FLIGHT_TENSORS: &str = "in_flight.safetensors";
const IN_FLIGHT_INDEX: &str = "in_flight.json";

impl Draw {
    /// Step `step`'s batch sampled ahead (or now, for the first step of a run or of an
    /// extension), then the batches of the steps up to `step + k` posted from the current
    /// weights. `prompt_ids` are the step's own, which the batch must have been sampled for.
    pub(super) fn sample_off_policy(&mut self, prompt_ids: &[Vec<u32>], step: usize, with: &mut Drawing) -> Result<(Generation, f64, OffPolicy)> {
        let taken = match self.ahead.queued.front() {
            Some(queued) if queued.step == step => Some(self.take_queued(prompt_ids, with.policy)?),
            Some(queued) => bail!("internal error: step {} found the batch of step {} first among those sampled ahead", step + 1, queued.step + 1),
            None => None,
        };
        let sampled = match taken {
            Some(sampled) => sampled,
            None => {
                let version = with.policy.optimizer.step;
                let requests = with.policy.sample_requests(prompt_ids, self.keys.coherence.rows_at(step), step, self.keys.seed);
                let (generation, seconds) = with.policy.sample(requests, with.log)?;
                let weights_fingerprint = with.policy.seat.take_fingerprints().first().copied();
                (generation, seconds, OffPolicy { policy_version: version, staleness: step - version, staleness_mean: (step - version) as f64, wait_seconds: 0.0, sampler_idle_seconds: 0.0, weights_fingerprint })
            }
        };
        self.post_ahead(step, with.policy)?;
        Ok(sampled)
    }

    /// Takes the oldest batch of the queue (waiting for the thread where it is still posted).
    fn take_queued(&mut self, prompt_ids: &[Vec<u32>], policy: &mut Policy) -> Result<(Generation, f64, OffPolicy)> {
        let queued = self.ahead.queued.pop_front().expect("the caller saw it");
        ensure!(queued.prompt_ids == prompt_ids, "internal error: the batch sampled ahead for step {} has other prompts than the step", queued.step + 1);
        let waiting = Instant::now();
        let (mut seconds, mut idle) = (0.0, 0.0);
        let parts = match queued.parts {
            Parts::Ready(parts) => parts,
            Parts::Posted(calls) => {
                let mut parts = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let ahead = policy.seat.take_ahead().with_context(|| format!("sampling the batch of step {} ahead failed", queued.step + 1))?;
                    (seconds, idle) = (seconds + ahead.done.seconds, idle + ahead.sampler_idle_seconds);
                    parts.push(ahead.done.value);
                }
                parts
            }
        };
        let wait_seconds = waiting.elapsed().as_secs_f64();
        ensure!(!parts.is_empty(), "internal error: a batch sampled ahead without rows");
        let generation = policy.joined(parts);
        let off_policy = OffPolicy { policy_version: queued.version, staleness: queued.step - queued.version, staleness_mean: (queued.step - queued.version) as f64, wait_seconds, sampler_idle_seconds: idle, weights_fingerprint: queued.fingerprint };
        Ok((generation, seconds, off_policy))
    }

    /// Posts the batches of the steps after `step` up to its horizon (`step + k`, or the end of
    /// a streamed batch; at most the run's last step) that are not yet posted, sampled from the
    /// weights as they are now.
    fn post_ahead(&mut self, step: usize, policy: &mut Policy) -> Result<()> {
        let last = self.keys.ahead.last_posted_by(step).min(self.keys.max_steps.saturating_sub(1));
        let mut next = self.ahead.next_step.max(step + 1);
        while next <= last {
            let prompts = self.step_prompts(next);
            let prompt_ids = tokenized(&policy.tokenizer, &prompts)?;
            let requests = policy.sample_requests(&prompt_ids, self.keys.coherence.rows_at(next), next, self.keys.seed);
            let calls = requests.len();
            let mut fingerprints = Vec::with_capacity(calls);
            for request in requests {
                fingerprints.push(policy.seat.sample_ahead(&policy.model, &request.scales, request.prompt_ids, policy.sampling, request.seed)?);
            }
            let fingerprint = fingerprints.first().copied();
            self.ahead.queued.push_back(Queued { step: next, version: policy.optimizer.step, prompt_ids, parts: Parts::Posted(calls), fingerprint });
            next += 1;
        }
        self.ahead.next_step = next;
        Ok(())
    }

    /// The batches posted but not yet trained on, for a checkpoint (waiting for the thread to
    /// finish them): tensors and the index, or `None` when there are none.
    pub(in crate::train) fn in_flight(&mut self, policy: &mut Policy) -> Result<Option<(Vec<(String, Tensor)>, String)>> {
        if let (true, super::AheadHorizon::Pipeline { .. }) = (self.keys.samples_ahead, self.keys.ahead) {
            return self.pipeline_in_flight(policy).map(Some);
        }
        if self.ahead.queued.is_empty() {
            return Ok(None);
        }
        for i in 0..self.ahead.queued.len() {
            if let Parts::Posted(calls) = self.ahead.queued[i].parts {
                let parts = (0..calls).map(|_| policy.seat.take_ahead().map(|ahead| ahead.done.value)).collect::<Result<Vec<_>>>()?;
                self.ahead.queued[i].parts = Parts::Ready(parts);
            }
        }
        let mut tensors = Vec::new();
        let mut index = Vec::new();
        for (i, queued) in self.ahead.queued.iter().enumerate() {
            let Parts::Ready(parts) = &queued.parts else { unreachable!("all made ready above") };
            for (j, part) in parts.iter().enumerate() {
                tensors.extend(part.to_saved(&format!("{i}.{j}.")));
            }
            index.push(SavedBatch { step: queued.step, policy_version: queued.version, parts: parts.len(), weights_fingerprint: queued.fingerprint });
        }
        Ok(Some((tensors, serde_json::to_string_pretty(&index)?)))
    }

    /// Restores the batches a checkpoint saved as in flight (none when it has no `in_flight.*`).
    pub(in crate::train) fn restore_in_flight(&mut self, dir: &Path, tokenizer: &Tokenizer, device: tch::Device) -> Result<()> {
        let index_path = dir.join(IN_FLIGHT_INDEX);
        if !index_path.exists() {
            return Ok(());
        }
        if let (true, super::AheadHorizon::Pipeline { .. }) = (self.keys.samples_ahead, self.keys.ahead) {
            return self.restore_pipeline(&index_path, &dir.join(IN_FLIGHT_TENSORS), device);
        }
        let text = std::fs::read_to_string(&index_path).with_context(|| format!("cannot read {}", index_path.display()))?;
        let index: Vec<SavedBatch> = serde_json::from_str(&text).with_context(|| format!("{} is corrupt", index_path.display()))?;
        let tensors: BTreeMap<String, Tensor> = crate::model::weights::read_safetensors(&dir.join(IN_FLIGHT_TENSORS))?;
        for (i, saved) in index.into_iter().enumerate() {
            let parts = (0..saved.parts)
                .map(|j| Generation::from_saved(&tensors, &format!("{i}.{j}."), device))
                .collect::<Result<Vec<_>>>()
                .with_context(|| format!("{}: the batch of step {} sampled ahead", dir.display(), saved.step + 1))?;
            let prompts = self.step_prompts(saved.step);
            let prompt_ids = tokenized(tokenizer, &prompts)?;
            let fingerprint = saved.weights_fingerprint;
            self.ahead.queued.push_back(Queued { step: saved.step, version: saved.policy_version, prompt_ids, parts: Parts::Ready(parts), fingerprint });
            self.ahead.next_step = saved.step + 1;
        }
        Ok(())
    }
}

/// Writes a checkpoint's in-flight batches ([`Draw::in_flight`]) into its directory.
pub(in crate::train) fn write_in_flight(dir: &Path, in_flight: &(Vec<(String, Tensor)>, String)) -> Result<()> {
    crate::model::weights::write_safetensors(&dir.join(IN_FLIGHT_TENSORS), &in_flight.0)?;
    std::fs::write(dir.join(IN_FLIGHT_INDEX), &in_flight.1)?;
    Ok(())
}
