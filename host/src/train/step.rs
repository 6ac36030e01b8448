//! One optimizer step on a rollout: routed log-probabilities, the GRPO loss, backward, clipping,
//! AdamW with the linear schedule, then the step's metrics line, log lines and live views.

use std::time::Instant;

use anyhow::{Result, ensure};
use tch::Kind;

use super::Trainer;
use super::metrics::{self, StepMetrics, key};
use crate::{grpo, probes};
use crate::optim::linear_lr;

impl Trainer {
    /// Optimizer step `step` (0-based); returns its metrics line.
    pub(super) fn step(&mut self, step: usize) -> Result<serde_json::Value> {
        let started = Instant::now();
        if step % self.cfg.num_iterations == 0 {
            self.rollout = Some(self.rollout(step)?);
        }
        let rollout = self.rollout.as_ref().expect("a rollout exists for every step");
        let train_start = Instant::now();
        let g = &rollout.generation;
        self.optimizer.zero_grad();
        let logprobs = grpo::completion_logprobs(&self.model, g.into(), self.cfg.temperature, &rollout.plan.ctl);
        let terms = grpo::grpo_loss(
            &logprobs.logprobs,
            rollout.old_logprobs.as_ref(),
            rollout.ref_logprobs.as_ref(),
            &rollout.advantages,
            &rollout.loss_mask,
            &rollout.plan.classes,
            &self.loss,
        );
        if let Some(dir) = &self.cfg.dump_batches {
            super::dump::write_step(dir, step + 1, rollout, &logprobs.logprobs, &terms.loss)?;
        }
        let loss = terms.loss.double_value(&[]);
        ensure!(loss.is_finite(), "the loss is {loss} at step {}", step + 1);
        terms.loss.backward();
        let grad_norm = self.optimizer.clip_grad_norm(self.cfg.max_grad_norm);
        let learning_rate = linear_lr(self.cfg.lr, step, self.cfg.lr_horizon(step));
        self.optimizer.step(learning_rate);
        let train_seconds = train_start.elapsed().as_secs_f64();

        if step % self.cfg.num_iterations == 0 {
            self.num_tokens += (g.prompt_mask.sum(Kind::Int64).int64_value(&[]) + g.completion_mask.sum(Kind::Int64).int64_value(&[])) as usize;
        }
        // The loss's statistics over the loss tokens (as TRL), the sampler's over every sampled one.
        let mask = &rollout.loss_mask;
        let clip = &terms.clip_fractions;
        let done = step + 1;
        let measured = StepMetrics {
            step: done,
            loss,
            grad_norm,
            learning_rate,
            entropy: grpo::masked_mean(&logprobs.entropy, mask),
            entropy_quantiles: probes::entropy_quantiles(&logprobs.entropy, mask),
            kl: terms.per_token_kl.as_ref().map(|kl| grpo::masked_mean(&kl.detach(), mask)),
            clip_ratio: terms.clip_ratio.double_value(&[]),
            clip_fractions: [&clip.low, &clip.high, &clip.region].map(|f| f.double_value(&[])),
            kl_sample_train: probes::sampler_learner_kl(&g.sampling_logprobs, &logprobs.logprobs, &g.completion_mask),
            num_tokens: self.num_tokens,
            train_seconds,
            step_seconds: started.elapsed().as_secs_f64(),
        };
        let line = metrics::line(&rollout.metrics, &measured);
        self.metrics.append(&line)?;
        self.log.progress(done as u64, format!("reward {:.3}", line[key::REWARD].as_f64().unwrap_or(f64::NAN)));
        let (prompt, completion) = &rollout.first_sample;
        let shown = done % self.cfg.logging_steps == 0 || done == 1;
        if shown {
            self.log.line(&format!("[Sample @ step {done}] {prompt} ||| {completion}"))?;
            self.log.line(&format!("[Step {done}] {}", metrics::summary_line(&line)))?;
        }
        self.live.step(&line, shown.then_some((prompt.as_str(), completion.as_str())))?;
        Ok(line)
    }
}
