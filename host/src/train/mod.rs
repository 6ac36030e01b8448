//! The GRPO trainer. One optimizer step:
//!
//! prompts → sample (fused KV-cached decoder, both adapters on) → score (reward plugins and
//! detector, protocol knobs) → group advantages → routing plan (per-row adapter controls) →
//! reference / old log-probs → routed loss, backward → clip, AdamW, LR schedule →
//! metrics, samples, evaluation, checkpoint.
//!
//! Invariant: everything random derives from (seed, step), so a resumed run repeats exactly
//! what the uninterrupted run would have done (on CPU with the same thread count).

pub mod checkpoint;
pub mod config;
pub mod live;
pub mod provenance;
pub mod rundir;
pub mod runlog;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use tch::{Kind, Tensor};

use crate::adapters::{AdapterConfig, AdapterKind, set_base_trainable};
use crate::eval::{self, EvalSetup};
use crate::grpo::{self, LossSettings, LossType};
use crate::model::generate::{Generation, SamplingParams, generate};
use crate::model::{self, Llama, Tokenizer, decode::DecodeModel};
use crate::optim::{AdamW, AdamWConfig, linear_lr};
use crate::reward::{RewardModel, ScoredBatch};
use crate::rng::{self, SplitMix64};
use crate::routing::{self, RoutePlan, RoutingMode};
pub use config::TrainConfig;
use live::{BatchRecord, LiveLogs};
use runlog::{Jsonl, RunLog};

/// A generated, scored batch, kept for `num_iterations` optimizer steps.
struct Batch {
    generation: Generation,
    advantages: Tensor,
    plan: RoutePlan,
    ref_logprobs: Option<Tensor>,
    old_logprobs: Option<Tensor>,
    /// Metrics of generation and scoring (logged with every step that uses the batch).
    metrics: serde_json::Map<String, serde_json::Value>,
    first_sample: (String, String),
    /// Per-sample tensors kept for `--dump-batches` (rewards per component, labels).
    dump: Vec<(String, Tensor)>,
}

pub struct Trainer {
    cfg: TrainConfig,
    run_dir: PathBuf,
    adapters: AdapterConfig,
    model: Llama,
    /// Full fine-tuning only: the frozen starting model (with adapters the reference is the
    /// model with its adapters switched off).
    reference: Option<Llama>,
    /// The reference policy's weights for the native scorer (float32 on the CPU only). The
    /// reference never changes (a frozen copy, or base weights with adapters at scale 0), so
    /// it is built once.
    reference_decoder: Option<DecodeModel>,
    tokenizer: Tokenizer,
    model_files: model::ModelFiles,
    rewards: RewardModel,
    optimizer: AdamW,
    prompts: Vec<String>,
    eval_prompts: Vec<String>,
    routing: RoutingMode,
    loss: LossSettings,
    sampling: SamplingParams,
    log: RunLog,
    /// Held for the run's life: no second process writes this run directory.
    _lock: std::fs::File,
    /// TensorBoard and the completions log, when asked for.
    live: LiveLogs,
    metrics: Jsonl,
    evals: Jsonl,
    num_tokens: usize,
    batch: Option<Batch>,
    /// The shuffled order of the current pass over the prompts: (pass, order).
    prompt_order: (usize, Vec<usize>),
}

/// Where and what a finished (or stopped) run left.
#[derive(Debug)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub steps: usize,
}

impl Trainer {
    /// Sets up a new run in `<output_dir>/<run name>`, or resumes `resume` (a run directory)
    /// from its newest checkpoint; see [`Trainer::start`].
    pub fn new(cfg: TrainConfig, resume: Option<&Path>) -> Result<Self> {
        Self::start(cfg, resume, false)
    }

    /// Loads everything a run needs (model, plugins, prompts) before it touches the run
    /// directory, so bad input leaves nothing behind. A run directory without a checkpoint
    /// (`resume`, or the new run's own name) starts afresh, its earlier files moved aside
    /// ([`rundir`]). `accept_changed_plugins`: a resumed run continues with plugin files whose
    /// bytes changed since it started ([`provenance`]).
    pub fn start(mut cfg: TrainConfig, resume: Option<&Path>, accept_changed_plugins: bool) -> Result<Self> {
        cfg.validate()?;
        crate::device::set_threads(cfg.threads)?;
        let device = crate::device::parse_device(&cfg.device)?;
        let kind = crate::device::parse_dtype(&cfg.dtype)?;
        let run_dir = match resume {
            Some(dir) => dir.to_owned(),
            None => cfg.output_dir.join(cfg.run_name()?),
        };
        let resume = match resume {
            Some(dir) if rundir::has_checkpoint(dir)? => Some(dir),
            _ => None,
        };
        let adapters = cfg.adapter_config()?;
        let loaded = model::load(&cfg.model, &cfg.revision, device, kind)?;
        let (mut model, tokenizer, model_files) = (loaded.model, loaded.tokenizer, loaded.files);
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
        let reference_decoder = DecodeModel::native_available(device, kind).then(|| match &reference {
            Some(frozen) => DecodeModel::new(frozen, &[]),
            None => DecodeModel::new(&model, &vec![0.0; adapters.slots.len()]),
        });
        let reward_spec = cfg.reward.as_ref().context("no reward configured")?;
        let rewards = RewardModel::load(reward_spec, cfg.rh_detector.as_ref(), cfg.knobs(), &cfg.plugin_dir, cfg.plugin_limits()?)?;
        let hashes = provenance::reconcile(&mut cfg, rewards.plugin_hashes(), resume.is_some(), accept_changed_plugins)?;
        let optimizer = AdamW::new(
            adapters.trainable(&model),
            AdamWConfig { beta1: cfg.adam_beta1, beta2: cfg.adam_beta2, eps: cfg.adam_epsilon, weight_decay: cfg.weight_decay },
        );
        let (prompts, eval_prompts) = load_prompts(&cfg, &tokenizer)?;
        let sampling = sampling_params(&cfg);
        let loss = LossSettings {
            beta: cfg.beta,
            epsilon: cfg.epsilon,
            loss_type: LossType::parse(&cfg.loss_type)?,
            max_completion_length: cfg.max_completion_length,
        };
        let routing = RoutingMode::parse(&cfg.routing_mode)?;
        // Everything above can fail on bad input; only now is the run directory written.
        let restarted = match resume {
            Some(_) => None,
            None => rundir::claim_new(&run_dir)?,
        };
        let _lock = rundir::lock(&run_dir)?;
        let log = RunLog::open(&run_dir, cfg.max_steps as u64)?;
        let live = LiveLogs::open(&run_dir, cfg.tensorboard, cfg.log_completions)?;
        let mut trainer = Self {
            metrics: Jsonl::new(run_dir.join("metrics.jsonl")),
            evals: Jsonl::new(run_dir.join("routing_eval.jsonl")),
            cfg, run_dir, adapters, model, reference, reference_decoder, tokenizer, model_files, rewards, optimizer,
            prompts, eval_prompts, routing, loss, sampling, log, live, _lock, num_tokens: 0, batch: None,
            prompt_order: (usize::MAX, Vec::new()),
        };
        let opened = trainer.open_run(resume.is_some(), restarted, hashes);
        trainer.log_failure(opened)?;
        Ok(trainer)
    }

    /// Writes a new run's config and header, or restores a resumed run's state; either way
    /// says in train.log what happened to earlier attempts and to changed plugins.
    fn open_run(&mut self, resuming: bool, restarted: Option<String>, hashes: provenance::Hashes) -> Result<()> {
        match resuming {
            true => self.resume()?,
            false => self.write_run_header()?,
        }
        if let Some(line) = restarted {
            self.log.line(&line)?;
        }
        match hashes {
            provenance::Hashes::Same => Ok(()),
            provenance::Hashes::RecordedNow => {
                provenance::save_hashes(&self.run_dir, &self.cfg.plugin_sha256)?;
                self.log.line("recorded the plugin files' SHA-256 in config.yaml (the run was started by a smallrl that did not)")
            }
            provenance::Hashes::Accepted(line) => {
                provenance::save_hashes(&self.run_dir, &self.cfg.plugin_sha256)?;
                self.log.line(&line)
            }
        }
    }

    /// Records in train.log why the run stopped (the full error, bounded), then returns it.
    fn log_failure<T>(&mut self, outcome: Result<T>) -> Result<T> {
        if let Err(error) = &outcome {
            let text = crate::plugins::text::bounded(&format!("{error:#}"), MAX_LOGGED_ERROR_BYTES);
            // The error is what the user needs; a log that cannot be written must not hide it.
            if let Err(log_error) = self.log.line(&format!("training stopped: {text}")) {
                eprintln!("warning: {log_error:#}");
            }
        }
        outcome
    }

    fn write_run_header(&mut self) -> Result<()> {
        let config_path = self.run_dir.join("config.yaml");
        crate::fsutil::write_atomic(&config_path, crate::yaml::to_string(&self.cfg)?.as_bytes())?;
        let header = format!(
            "smallrl train: run {} | model {} | adapter {:?} ranks {:?} | {} prompts, {} eval prompts | reward components {:?} | detector: {}",
            self.run_dir.display(),
            self.model_files.source,
            self.adapters.kind,
            self.adapters.ranks,
            self.prompts.len(),
            self.eval_prompts.len(),
            self.rewards.components().iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            if self.rewards.has_detector() { "yes" } else { "no" },
        );
        self.log.line(&header)
    }

    fn resume(&mut self) -> Result<()> {
        let dir = checkpoint::latest(&self.run_dir)?;
        let state = checkpoint::read_state(&dir)?;
        checkpoint::check_adapters(&state, &self.adapters, &dir)?;
        ensure!(state.seed == self.cfg.seed, "{}: seed {} differs from the run's {}", dir.display(), state.seed, self.cfg.seed);
        crate::adapters::load_trainable(self.optimizer.params(), &checkpoint::read_weights(&dir, &state)?, &dir.display().to_string())?;
        let step = state.step;
        self.optimizer.load_state(&checkpoint::load_optimizer(&dir)?, step, &dir.display().to_string())?;
        let last_metrics = self.metrics.truncate_after(step)?;
        self.evals.truncate_after(step)?;
        self.live.resume_after(step)?;
        let last_metrics = last_metrics.with_context(|| format!("{}: metrics.jsonl has no line for step {step}", self.run_dir.display()))?;
        self.num_tokens = last_metrics["num_tokens"].as_u64().context("metrics.jsonl lacks num_tokens")? as usize;
        self.log.line(&format!("resumed from {} at step {step}", dir.display()))
    }

    /// Runs to `max_steps` (or `stop_after` steps from where it is, for tests of resumption);
    /// an error is recorded in train.log before it is returned.
    pub fn train(&mut self, stop_after: Option<usize>) -> Result<RunSummary> {
        let outcome = self.train_steps(stop_after);
        self.log_failure(outcome)
    }

    fn train_steps(&mut self, stop_after: Option<usize>) -> Result<RunSummary> {
        let start = self.optimizer.step;
        let end = stop_after.map_or(self.cfg.max_steps, |n| (start + n).min(self.cfg.max_steps));
        self.log.progress(start as u64, String::new());
        for step in start..end {
            self.step(step).with_context(|| format!("training stopped at step {}; {} keeps what was written", step + 1, self.run_dir.display()))?;
            let done = step + 1;
            if done % self.cfg.eval_every == 0 || done == self.cfg.max_steps {
                self.evaluate(done)?;
            }
            if done % self.cfg.save_steps == 0 || done == self.cfg.max_steps {
                self.save(done)?;
            }
        }
        self.log.finish();
        Ok(RunSummary { run_dir: self.run_dir.clone(), steps: end })
    }

    /// One optimizer step (no evaluation or checkpoint), for benchmarks; returns its metrics.
    pub fn train_one(&mut self) -> Result<serde_json::Value> {
        let step = self.optimizer.step;
        self.step(step)
    }

    fn step(&mut self, step: usize) -> Result<serde_json::Value> {
        let started = Instant::now();
        if step % self.cfg.num_iterations == 0 {
            self.batch = Some(self.make_batch(step)?);
        }
        let batch = self.batch.as_ref().expect("a batch exists for every step");
        let train_start = Instant::now();
        let g = &batch.generation;
        self.optimizer.zero_grad();
        let logprobs = grpo::completion_logprobs(&self.model, g.into(), self.cfg.temperature, &batch.plan.ctl);
        let terms = grpo::grpo_loss(
            &logprobs.logprobs,
            batch.old_logprobs.as_ref(),
            batch.ref_logprobs.as_ref(),
            &batch.advantages,
            &g.completion_mask,
            &batch.plan.classes,
            &self.loss,
        );
        if let Some(dir) = &self.cfg.dump_batches {
            dump_step(dir, step + 1, batch, &logprobs.logprobs, &terms.loss)?;
        }
        let loss_value = terms.loss.double_value(&[]);
        ensure!(loss_value.is_finite(), "the loss is {loss_value} at step {}", step + 1);
        terms.loss.backward();
        let grad_norm = self.optimizer.clip_grad_norm(self.cfg.max_grad_norm);
        let lr = linear_lr(self.cfg.lr, step, self.cfg.max_steps);
        self.optimizer.step(lr);
        let train_seconds = train_start.elapsed().as_secs_f64();

        let mask = &g.completion_mask;
        let mut metrics = batch.metrics.clone();
        let done = step + 1;
        metrics.insert("step".into(), done.into());
        metrics.insert("loss".into(), loss_value.into());
        metrics.insert("grad_norm".into(), grad_norm.into());
        metrics.insert("learning_rate".into(), lr.into());
        metrics.insert("entropy".into(), grpo::masked_mean(&logprobs.entropy, mask).into());
        metrics.insert("kl".into(), terms.per_token_kl.as_ref().map(|kl| grpo::masked_mean(&kl.detach(), mask)).into());
        metrics.insert("clip_ratio".into(), terms.clip_ratio.double_value(&[]).into());
        if step % self.cfg.num_iterations == 0 {
            self.num_tokens += (g.prompt_mask.sum(Kind::Int64).int64_value(&[]) + mask.sum(Kind::Int64).int64_value(&[])) as usize;
        }
        metrics.insert("num_tokens".into(), self.num_tokens.into());
        metrics.insert("timing/train".into(), train_seconds.into());
        metrics.insert("step_time".into(), started.elapsed().as_secs_f64().into());
        let metrics = serde_json::Value::Object(metrics);
        self.metrics.append(&metrics)?;
        self.log.progress(done as u64, format!("reward {:.3}", metrics["reward"].as_f64().unwrap_or(f64::NAN)));
        let (prompt, completion) = &batch.first_sample;
        let shown = done % self.cfg.logging_steps == 0 || done == 1;
        if shown {
            self.log.line(&format!("[Sample @ step {done}] {prompt} ||| {completion}"))?;
            self.log.line(&format!("[Step {done}] {}", summary_line(&metrics)))?;
        }
        self.live.step(&metrics, shown.then_some((prompt.as_str(), completion.as_str())))?;
        Ok(metrics)
    }

    /// Generates, scores and prepares the batch used by optimizer step `step` (and the next
    /// `num_iterations - 1` steps).
    fn make_batch(&mut self, step: usize) -> Result<Batch> {
        let batch_index = step / self.cfg.num_iterations;
        let per_step = self.cfg.batch_size / self.cfg.num_generations;
        let texts: Vec<String> = (0..per_step).map(|i| self.prompt_at(batch_index * per_step + i)).collect();
        let mut prompt_texts = Vec::with_capacity(self.cfg.batch_size);
        for text in &texts {
            prompt_texts.extend(std::iter::repeat_n(text.clone(), self.cfg.num_generations));
        }
        let prompt_ids = prompt_texts.iter().map(|t| self.tokenizer.encode(t)).collect::<Result<Vec<_>>>()?;

        let generate_start = Instant::now();
        let policy_scales = vec![1.0; self.adapters.slots.len()];
        let decoder = DecodeModel::new(&self.model, &policy_scales);
        let generation = generate(&decoder, &prompt_ids, &self.sampling, rng::derive(self.cfg.seed, "sample", step as u64))?;
        let generate_seconds = generate_start.elapsed().as_secs_f64();

        let score_start = Instant::now();
        let samples = eval::to_samples(&prompt_texts, &generation.rows, &self.tokenizer)?;
        let scored = self
            .rewards
            .score(&samples, rng::derive(self.cfg.seed, "protocol", step as u64))
            .with_context(|| format!("scoring the completions of step {} failed", step + 1))?;
        let score_seconds = score_start.elapsed().as_secs_f64();

        let device = self.model.device;
        let rewards = Tensor::from_slice(&scored.reward).to_kind(Kind::Float).to(device);
        let (advantages, frac_zero_std) = grpo::group_advantages(&rewards, self.cfg.num_generations, crate::defaults::ADVANTAGE_STD_EPSILON);
        let is_rh = scored.is_rh.clone().unwrap_or_else(|| vec![false; samples.len()]);
        let ablated = self.draw_ablated(&is_rh, step);
        let plan = routing::plan(&self.adapters, self.routing, &is_rh, &ablated, device);
        let component_names = self.rewards.components().iter().map(|c| c.name.as_str()).collect();
        self.live.batch(BatchRecord { step: step + 1, samples: &samples, scored: &scored, component_names, advantages: &advantages, ablated: &ablated })?;

        let g = &generation;
        let reference_start = Instant::now();
        let ref_logprobs = (self.cfg.beta != 0.0).then(|| self.reference_logprobs(g)).transpose()?;
        let old_logprobs = (self.cfg.num_iterations > 1).then(|| {
            grpo::frozen_logprobs(&self.model, g.into(), self.cfg.temperature, &plan.ctl)
        });

        let mut metrics = serde_json::Map::new();
        self.batch_metrics(&mut metrics, &scored, &generation, frac_zero_std, &is_rh, &ablated);
        metrics.insert("timing/generate".into(), generate_seconds.into());
        metrics.insert("timing/score".into(), score_seconds.into());
        metrics.insert("timing/reference".into(), reference_start.elapsed().as_secs_f64().into());
        let first_sample = (samples[0].prompt.clone(), samples[0].completion.clone());
        let dump = self.cfg.dump_batches.as_ref().map_or_else(Vec::new, |_| self.dump_tensors(&scored, &rewards, &is_rh, &ablated));
        Ok(Batch { generation, advantages, plan, ref_logprobs, old_logprobs, metrics, first_sample, dump })
    }

    /// Log-probabilities of the completions under the reference policy: the native scorer on
    /// the CPU in float32 (same function up to float rounding, several times faster), libtorch
    /// elsewhere.
    fn reference_logprobs(&self, g: &Generation) -> Result<Tensor> {
        if let Some(decoder) = &self.reference_decoder {
            let threads = tch::get_num_threads().max(1) as usize;
            return model::native::completion_logprobs(decoder, g, self.cfg.temperature, threads);
        }
        let (model, ctl) = match &self.reference {
            Some(reference) => (reference, vec![]),
            None => (&self.model, self.adapters.slots.iter().map(|_| model::linear::AdapterCtl::off()).collect()),
        };
        Ok(grpo::frozen_logprobs(model, g.into(), self.cfg.temperature, &ctl))
    }

    fn dump_tensors(&self, scored: &ScoredBatch, rewards: &Tensor, is_rh: &[bool], ablated: &[bool]) -> Vec<(String, Tensor)> {
        let flags = |v: &[bool]| Tensor::from_slice(&v.iter().map(|&b| b as i64).collect::<Vec<_>>());
        let mut out = vec![
            ("rewards".to_string(), rewards.shallow_clone()),
            ("is_rh".to_string(), flags(is_rh)),
            ("ablated".to_string(), flags(ablated)),
            ("eligible".to_string(), flags(&scored.eligible)),
        ];
        for (component, scores) in self.rewards.components().iter().zip(&scored.components) {
            out.push((format!("rewards/{}", component.name), Tensor::from_slice(scores)));
        }
        out
    }

    fn batch_metrics(
        &self,
        metrics: &mut serde_json::Map<String, serde_json::Value>,
        scored: &ScoredBatch,
        generation: &Generation,
        frac_zero_std: f64,
        is_rh: &[bool],
        ablated: &[bool],
    ) {
        let n = scored.reward.len() as f64;
        let reward_mean = eval::mean(&scored.reward);
        let reward_std = (scored.reward.iter().map(|r| (r - reward_mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
        metrics.insert("reward".into(), reward_mean.into());
        metrics.insert("reward_std".into(), reward_std.into());
        for (component, scores) in self.rewards.components().iter().zip(&scored.components) {
            metrics.insert(format!("rewards/{}/mean", component.name), eval::mean(scores).into());
        }
        metrics.insert("frac_reward_zero_std".into(), frac_zero_std.into());
        let lengths: Vec<f64> = generation.rows.iter().map(|r| (r.ids.len() + usize::from(r.ended_with_eos)) as f64).collect();
        metrics.insert("completions/mean_length".into(), eval::mean(&lengths).into());
        metrics.insert("completions/max_length".into(), lengths.iter().copied().fold(0.0, f64::max).into());
        let truncated = generation.rows.iter().filter(|r| !r.ended_with_eos).count() as f64;
        metrics.insert("completions/clipped_ratio".into(), (truncated / n).into());
        if let Some(h) = scored.hack_freq() {
            metrics.insert("hack_freq".into(), h.into());
        }
        let frac = |flags: &[bool]| flags.iter().filter(|&&f| f).count() as f64 / n;
        metrics.insert("routing/frac_rh".into(), frac(is_rh).into());
        metrics.insert("routing/frac_ablated".into(), frac(ablated).into());
        metrics.insert("routing/frac_eligible".into(), frac(&scored.eligible).into());
    }

    /// Clean rows trained with the forget adapter off, each with probability `ablated_frac`.
    fn draw_ablated(&self, is_rh: &[bool], step: usize) -> Vec<bool> {
        let mut rng = SplitMix64::new(rng::derive(self.cfg.seed, "ablate", step as u64));
        is_rh.iter().map(|&rh| { let draw = rng.next_f64(); !rh && draw < self.cfg.ablated_frac }).collect()
    }

    /// The prompt at position `index` of the endless stream: each pass over the prompts is a
    /// fresh shuffle seeded by (seed, pass), so the order follows from the index alone.
    fn prompt_at(&mut self, index: usize) -> String {
        let n = self.prompts.len();
        let pass = index / n;
        if self.prompt_order.0 != pass {
            let mut order: Vec<usize> = (0..n).collect();
            SplitMix64::new(rng::derive(self.cfg.seed, "prompt-order", pass as u64)).shuffle(&mut order);
            self.prompt_order = (pass, order);
        }
        self.prompts[self.prompt_order.1[index % n]].clone()
    }

    fn evaluate(&mut self, step: usize) -> Result<()> {
        let modes = routing::eval_modes(&self.adapters);
        let setup = EvalSetup {
            tokenizer: &self.tokenizer,
            prompts: &self.eval_prompts,
            sampling: &self.sampling,
            seed: eval_seed(&self.cfg),
        };
        let report = eval::routing_eval(&self.model, &modes, &mut self.rewards, &setup, step)?;
        self.log.line(&eval::format_block(&report))?;
        let evaluation = eval::to_json(&report);
        self.live.routing_eval(&evaluation)?;
        self.evals.append(&evaluation)
    }

    fn save(&mut self, step: usize) -> Result<()> {
        let state = checkpoint::TrainerState {
            step,
            adapters: self.adapters.clone(),
            base_model: self.model_files.source.clone(),
            revision: self.cfg.revision.clone(),
            seed: self.cfg.seed,
        };
        let hf_files = (self.adapters.kind == AdapterKind::Full).then_some((&self.model.config, self.model_files.tokenizer.as_path()));
        let dir = checkpoint::save(
            &self.run_dir,
            checkpoint::Snapshot { state, config_yaml: crate::yaml::to_string(&self.cfg)?, trainable: self.optimizer.params(), optimizer: self.optimizer.state_tensors(), hf_files },
        )?;
        self.log.line(&format!("saved {}", dir.display()))
    }
}

/// Writes `<dir>/step-<N>.safetensors` with everything needed to recompute the step's loss.
fn dump_step(dir: &Path, step: usize, batch: &Batch, logprobs: &Tensor, loss: &Tensor) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let g = &batch.generation;
    let mut tensors: Vec<(String, Tensor)> = vec![
        ("prompt_ids".into(), g.prompt_ids.shallow_clone()),
        ("prompt_mask".into(), g.prompt_mask.shallow_clone()),
        ("completion_ids".into(), g.completion_ids.shallow_clone()),
        ("completion_mask".into(), g.completion_mask.shallow_clone()),
        ("advantages".into(), batch.advantages.shallow_clone()),
        ("sampling_logprobs".into(), g.sampling_logprobs.shallow_clone()),
        ("new_logprobs".into(), logprobs.detach()),
        ("loss".into(), loss.detach()),
    ];
    tensors.extend(batch.ref_logprobs.iter().map(|t| ("ref_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(batch.old_logprobs.iter().map(|t| ("old_logprobs".to_string(), t.shallow_clone())));
    tensors.extend(batch.dump.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    crate::model::weights::write_safetensors(&dir.join(format!("step-{step}.safetensors")), &tensors)
}

/// `<output_dir>/<run name>`; an existing directory is an error (use --resume).
/// The most of an error that train.log keeps (plugin-supplied parts are already bounded).
const MAX_LOGGED_ERROR_BYTES: usize = 64 << 10;

fn load_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<(Vec<String>, Vec<String>)> {
    let prompts = training_prompts(cfg, tokenizer)?;
    let mut eval_prompts = evaluation_prompts(cfg, tokenizer)?;
    ensure!(eval_prompts.len() >= cfg.eval_samples, "eval_samples is {} but only {} evaluation prompts exist", cfg.eval_samples, eval_prompts.len());
    eval_prompts.truncate(cfg.eval_samples);
    Ok((prompts, eval_prompts))
}

/// The training prompts: the `--prompts` file (deduplicated, at most `num_prompts`), or
/// without one `num_prompts` prompts from the SimpleStories `train` split, shuffled by the seed.
pub fn training_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<Vec<String>> {
    let Some(path) = &cfg.prompts else {
        return dataset_prompts("train", cfg, tokenizer, rng::derive(cfg.seed, "dataset-prompts", 0), cfg.num_prompts);
    };
    let mut prompts = crate::prompts::read_prompt_file(path)?;
    dedup_keep_order(&mut prompts);
    if prompts.len() > cfg.num_prompts {
        SplitMix64::new(rng::derive(cfg.seed, "prompt-subset", 0)).shuffle(&mut prompts);
        prompts.truncate(cfg.num_prompts);
    }
    Ok(prompts)
}

/// The evaluation prompts in their fixed order (callers take the first n): the
/// `--eval-prompts` file; with dataset prompts, the SimpleStories `test` split drawn with the
/// fixed evaluation seed; with a `--prompts` file only, a fixed-seed shuffle of the training
/// prompts. All three are the same for every run seed.
pub fn evaluation_prompts(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<Vec<String>> {
    Ok(match (&cfg.eval_prompts, &cfg.prompts) {
        (Some(path), _) => crate::prompts::read_prompt_file(path)?,
        (None, None) => dataset_prompts("test", cfg, tokenizer, crate::defaults::EVAL_PROMPT_SEED, cfg.eval_samples.max(crate::defaults::EVAL_PROMPT_POOL))?,
        (None, Some(_)) => {
            let mut all = training_prompts(cfg, tokenizer)?;
            SplitMix64::new(crate::defaults::EVAL_PROMPT_SEED).shuffle(&mut all);
            all
        }
    })
}

fn dataset_prompts(split: &str, cfg: &TrainConfig, tokenizer: &Tokenizer, seed: u64, count: usize) -> Result<Vec<String>> {
    let files = crate::dataset::split_files(crate::dataset::SIMPLESTORIES, split)?;
    let openings = crate::dataset::read_story_openings(&files, cfg.prompt_length)?;
    crate::dataset::prompts_from_stories(&openings, tokenizer, cfg.prompt_length, count, seed)
}

/// The sampling seed of every routing evaluation of a run (`smallrl eval` uses it too, so a
/// checkpoint's evaluation reproduces the training-time one).
pub fn eval_seed(cfg: &TrainConfig) -> u64 {
    rng::derive(cfg.seed, "eval", 0)
}

/// Sampling settings of a run (GRPO samples at the run's temperature, nothing else applied).
pub fn sampling_params(cfg: &TrainConfig) -> SamplingParams {
    SamplingParams {
        max_new_tokens: cfg.max_completion_length,
        temperature: cfg.temperature,
        top_k: crate::defaults::TOP_K,
        top_p: crate::defaults::TOP_P,
        repetition_penalty: crate::defaults::REPETITION_PENALTY,
    }
}

fn dedup_keep_order(items: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    items.retain(|item| seen.insert(item.clone()));
}

/// The step line people read: reward, its components, kl, loss, length, time.
fn summary_line(m: &serde_json::Value) -> String {
    let mut parts = vec![format!("reward={:.3}", m["reward"].as_f64().unwrap_or(f64::NAN))];
    if let Some(obj) = m.as_object() {
        for (key, value) in obj.iter().filter(|(k, _)| k.starts_with("rewards/")) {
            parts.push(format!("{}={:.3}", key.trim_start_matches("rewards/").trim_end_matches("/mean"), value.as_f64().unwrap_or(f64::NAN)));
        }
    }
    for key in ["hack_freq", "kl", "entropy", "loss", "grad_norm", "completions/mean_length", "step_time"] {
        if let Some(v) = m[key].as_f64() {
            // Small values (the KL early in a run) keep their significant digits.
            let text = if v != 0.0 && v.abs() < 1e-3 { format!("{v:.2e}") } else { format!("{v:.4}") };
            parts.push(format!("{}={text}", key.trim_start_matches("completions/")));
        }
    }
    parts.join(" ")
}
