//! The GRPO trainer. One optimizer step is a pipeline of values (`step.rs`):
//!
//! draw (`draw.rs`: prompts → the policy's samples → scores) → prepare (`recipe.rs`: rewards
//! → intervention → advantages → routing plan → loss mask) → reference / old log-probs
//! (`policy.rs`, through the engine) → the mini-batch's backward pass → clip, AdamW, LR
//! schedule → metrics, samples; then evaluation and checkpoint when due (this file).
//!
//! The parts: `config/` (the hyperparameters, resolved once into the parts' keys),
//! `policy.rs` (`Policy`), `draw.rs` (`Draw`), `recipe.rs` (`Recipe`), `metrics.rs`
//! (the `metrics.jsonl` record and its keys), `dump.rs` (`dump_batches`), `checkpoint.rs` and
//! `provenance.rs` (plugin hashes); run directories and their logs are [`crate::rundir`] and
//! [`crate::runlog`], shared with `pretrain` and `sweep`; this file sets a run up, resumes it
//! and runs the loop.
//!
//! Invariant: everything random derives from (seed, step), so a resumed run repeats exactly
//! what the uninterrupted run would have done (on CPU with the same thread count).

pub mod checkpoint;
pub mod config;
mod draw;
mod dump;
pub mod episodes;
mod files;
pub mod fisher;
pub mod metrics;
pub mod live;
pub mod memory;
pub mod prompts;
pub mod provenance;
pub mod packed;
mod policy;
pub mod recipe;
mod rollout;
mod step;
pub mod task;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use crate::adapters::AdapterKind;
use crate::engine::{Engine, Seat};
use crate::eval::{self, EvalSetup};
use crate::model::generate::SamplingParams;
use crate::reward::RewardModel;
use crate::rng;
use crate::routing;
pub use config::TrainConfig;
pub use prompts::{evaluation_prompts, training_prompts};
use config::StepKeys;
use draw::Draw;
use files::RunFiles;
use policy::Policy;
use recipe::Recipe;
use step::StepState;
use crate::rundir;

pub struct Trainer {
    /// The flat configuration, kept to write config.yaml and checkpoints; the parts below
    /// read their keys from it once.
    cfg: TrainConfig,
    /// What a step reads, and when the run evaluates, saves and logs.
    keys: StepKeys,
    /// The run directory's lock, logs and records.
    files: RunFiles,
    /// The model with its tokenizer, reference, adapters and optimizer, the objective and the
    /// seat at the engine through which every pass over them goes.
    policy: Policy,
    /// The rewards, monitor and ground truth (plugins), and the evaluation's prompts.
    rewards: RewardModel,
    eval_prompts: Vec<crate::reward::Prompt>,
    /// The prompt streams and the batches sampled ahead: from them and the policy, a step's
    /// scored batch.
    draw: Draw,
    /// What the run makes of a scored batch (advantages, intervention, routing plan).
    recipe: Recipe,
    /// What a step leaves for the next (the rollout, the token count, running averages).
    state: StepState,
    /// The step's memory estimate and, with gradient_accumulation_steps auto, its plan.
    memory: memory::MemoryPlan,
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
    pub fn start(cfg: TrainConfig, resume: Option<&Path>, accept_changed_plugins: bool) -> Result<Self> {
        Self::start_seated(cfg, resume, accept_changed_plugins, Engine::solo())
    }

    /// [`Trainer::start`] at `seat`, a place at an engine that other runs (a pack) may share.
    pub fn start_seated(mut cfg: TrainConfig, resume: Option<&Path>, accept_changed_plugins: bool, seat: Seat) -> Result<Self> {
        cfg.validate()?;
        ensure!(resume.is_some() || cfg.lr_horizons.is_empty(), "lr_horizons is a record written by `--resume --extend-schedule`; a new run cannot start with it");
        ensure!(resume.is_some() || cfg.planned_micro_batches.is_none(), "planned_micro_batches is the memory planner's record of a run's micro-batches; a new run cannot start with it");
        if resume.is_none() {
            task::name_components(&mut cfg)?;
        }
        crate::device::set_threads(cfg.threads)?;
        let (device, kind) = (cfg.device.resolve()?, cfg.dtype.kind());
        let run_dir = match resume {
            Some(dir) => dir.to_owned(),
            None => cfg.output_dir.join(cfg.run_name()?),
        };
        let resume = match resume {
            Some(dir) if rundir::has_checkpoint(dir)? => Some(dir),
            _ => None,
        };
        let policy = policy::load(&cfg, device, kind, seat)?;
        // The one place a run's prompts, rewards, monitor and ground truth are assembled.
        let render = prompts::PromptRender::for_run(&cfg, policy.files())?;
        let task::Task { mut rewards, prompts, eval_prompts, episode_starts } = task::load(&cfg, policy.tokenizer(), &render)?;
        let episodes = match rewards.is_episodic() {
            true => {
                episodes::refuse_unsupported(&cfg, &format!("{} ({})", rewards.environment_name().unwrap_or("?"), rewards.environment_file().map_or_else(|| "?".into(), |p| p.display().to_string())))?;
                let mut episodes = episodes::Episodes::new(&cfg, episode_starts, &render)?;
                if cfg.samples_ahead() {
                    episodes.sample_ahead(&mut rewards, policy.tokenizer())?;
                }
                Some(episodes)
            }
            false => None,
        };
        // Before any sampling: the step's memory, and with gradient_accumulation_steps auto its
        // micro-batches (refused here, naming the figures, when one row does not fit).
        let memory = memory::plan_policy(&mut cfg, &policy, &[&prompts[..], &eval_prompts[..]], device)?;
        let hashes = provenance::reconcile(&mut cfg, rewards.plugin_hashes(), resume.is_some(), accept_changed_plugins)?;
        let recipe = cfg.recipe(device, rewards.components())?;
        let verifier_prompts = match cfg.rh_detector_verifies_retain_samples {
            true => Some(prompts::verifier_prompts(&prompts)?),
            false => None,
        };
        let draw = Draw::new(cfg.draw_keys(), prompts, verifier_prompts, episodes);
        // Everything above can fail on bad input; only now is the run directory written.
        let restarted = match resume {
            Some(_) => None,
            None => rundir::claim_new(&run_dir)?,
        };
        let files = RunFiles::open(run_dir, &cfg)?;
        let keys = cfg.step_keys();
        let state = StepState { entropy: policy.objective().entropy.map(crate::grpo::EntropyController::new), ..StepState::default() };
        let mut trainer = Self { cfg, keys, files, policy, rewards, eval_prompts, draw, recipe, state, memory };
        let opened = trainer.open_run(resume.is_some(), restarted, hashes).and_then(|()| trainer.files.log.line(&trainer.memory.line));
        trainer.files.log_failure(opened)?;
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
            self.files.log.line(&line)?;
        }
        match hashes {
            provenance::Hashes::Same => Ok(()),
            provenance::Hashes::RecordedNow => {
                provenance::save_hashes(&self.files.dir, &self.cfg.plugin_sha256)?;
                self.files.log.line("recorded the plugin files' SHA-256 in config.yaml (the run was started by a smallrl that did not)")
            }
            provenance::Hashes::Accepted(line) => {
                provenance::save_hashes(&self.files.dir, &self.cfg.plugin_sha256)?;
                self.files.log.line(&line)
            }
        }
    }

    fn write_run_header(&mut self) -> Result<()> {
        let config_path = self.files.dir.join("config.yaml");
        crate::fsutil::write_atomic(&config_path, crate::yaml::to_string(&self.cfg)?.as_bytes())?;
        let header = format!(
            "smallrl train: run {} | model {} | adapter {:?} ranks {:?} | {} prompts, {} eval prompts | reward components {:?} | detector: {}{}",
            self.files.dir.display(),
            self.policy.files().source,
            self.policy.adapters().kind,
            self.policy.adapters().ranks,
            self.draw.prompts.len(),
            self.eval_prompts.len(),
            self.rewards.components().iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            if self.rewards.has_detector() { "yes" } else { "no" },
            self.hackable_note(),
        );
        self.files.log.line(&header)?;
        self.files.log.line(&format!("libtorch: {} threads, {}", tch::get_num_threads(), crate::device::openmp_wait()))?;
        match self.cfg.sampler_ratio() {
            Some(ratio) if self.cfg.sampler_dtype != crate::model::folded::SamplerDtype::Float32 => {
                self.files.log.line(&format!("sampler_dtype {}: samples from bfloat16 weights while the policy is {}; {ratio}; kl_sample_train and sampling/* show the mismatch", self.cfg.sampler_dtype, self.cfg.dtype))
            }
            _ => Ok(()),
        }
    }

    /// " | hackable prompts: 0.500 of training, 0.250 of evaluation" when some prompts do not
    /// offer the hack (`hackable` metadata, `hack_frac`); empty when all do.
    fn hackable_note(&self) -> String {
        let (training, evaluation) = (prompts::hackable_fraction(self.draw.prompts.prompts()), prompts::hackable_fraction(&self.eval_prompts));
        match training == 1.0 && evaluation == 1.0 {
            true => String::new(),
            false => format!(" | hackable prompts: {training:.3} of training, {evaluation:.3} of evaluation"),
        }
    }

    fn resume(&mut self) -> Result<()> {
        let dir = checkpoint::latest(&self.files.dir)?;
        let state = checkpoint::read_state(&dir)?;
        checkpoint::check_adapters(&state, self.policy.adapters(), &dir)?;
        ensure!(state.seed == self.cfg.seed, "{}: seed {} differs from the run's {}", dir.display(), state.seed, self.cfg.seed);
        let step = state.step;
        self.policy.restore(&checkpoint::read_weights(&dir, &state)?, &checkpoint::load_optimizer(&dir)?, step, &dir.display().to_string())?;
        self.draw.restore_in_flight(&dir, &self.policy)?;
        let last_metrics = self.files.metrics.truncate_after(step)?;
        self.files.evals.truncate_after(step)?;
        self.files.live.resume_after(step)?;
        let last_metrics = last_metrics.with_context(|| format!("{}: metrics.jsonl has no line for step {step}", self.files.dir.display()))?;
        let num_tokens = last_metrics[metrics::key::NUM_TOKENS].as_u64();
        self.state.num_tokens = num_tokens.with_context(|| format!("{}: metrics.jsonl lacks {}", self.files.dir.display(), metrics::key::NUM_TOKENS))? as usize;
        if self.keys.gradient_noise_scale() {
            let average = metrics::GradientNoise::average_in(&last_metrics);
            let average = average.with_context(|| format!("{}: metrics.jsonl's step {step} lacks the gradient noise scale's running average", self.files.dir.display()))?;
            self.state.noise_scale_average = Some(average);
        }
        if let Some(control) = self.policy.objective().entropy {
            let (coef, last_entropy) = metrics::EntropyBonusMetrics::controller_in(&last_metrics)
                .with_context(|| format!("{}: metrics.jsonl's step {step} lacks the entropy bonus's coefficient", self.files.dir.display()))?;
            self.state.entropy = Some(crate::grpo::EntropyController::restored(control, coef, last_entropy));
        }
        self.files.log.line(&format!("resumed from {} at step {step}", dir.display()))?;
        self.record_extension()
    }

    /// A run resumed with `--extend-schedule` records its new max_steps and the earlier LR
    /// horizons in config.yaml (the rest of the saved configuration stays as it was).
    fn record_extension(&mut self) -> Result<()> {
        let saved = TrainConfig::read_saved(&self.files.dir)?;
        if (saved.max_steps, &saved.lr_horizons) == (self.cfg.max_steps, &self.cfg.lr_horizons) {
            return Ok(());
        }
        let extended = TrainConfig { max_steps: self.cfg.max_steps, lr_horizons: self.cfg.lr_horizons.clone(), ..saved };
        crate::fsutil::write_atomic(&self.files.dir.join("config.yaml"), crate::yaml::to_string(&extended)?.as_bytes())?;
        self.files.log.line(&format!(
            "extended from max_steps {} to {} (--extend-schedule): LR horizons by step {:?}, then {}",
            extended.lr_horizons.last().map_or(0, |h| h.max_steps),
            self.cfg.max_steps,
            self.cfg.lr_horizons,
            self.cfg.max_steps
        ))
    }

    /// Runs to `max_steps` (or `stop_after` steps from where it is, for tests of resumption);
    /// an error is recorded in train.log before it is returned.
    pub fn train(&mut self, stop_after: Option<usize>) -> Result<RunSummary> {
        let outcome = self.train_steps(stop_after);
        self.files.log_failure(outcome)
    }

    fn train_steps(&mut self, stop_after: Option<usize>) -> Result<RunSummary> {
        let end = self.end_step(stop_after);
        self.policy.start_working();
        self.files.log.progress(self.policy.version() as u64, String::new());
        while self.policy.version() < end {
            self.advance()?;
        }
        // What went through the engine (the run's own passes included): tests read it.
        self.files.log.line(&format!("engine jobs: {}", self.policy.engine_jobs()))?;
        self.files.log.finish();
        Ok(RunSummary { run_dir: self.files.dir.clone(), steps: end })
    }

    /// The step this invocation stops after: `max_steps`, or `stop_after` steps from here.
    fn end_step(&self, stop_after: Option<usize>) -> usize {
        stop_after.map_or(self.keys.max_steps(), |n| (self.policy.version() + n).min(self.keys.max_steps()))
    }

    /// The next optimizer step, then the evaluation and checkpoint that fall on it: the unit a
    /// run repeats, alone or in a pack (each run on its own thread, `packed.rs`).
    fn advance(&mut self) -> Result<()> {
        let step = self.policy.version();
        self.step(step).with_context(|| self.stopped_at(step))?;
        let done = step + 1;
        self.files.log.line(&memory::step_peak_line(done, self.policy.runs()))?;
        ensure!(self.policy.version() == done, "the optimizer is at step {} after step {done}", self.policy.version());
        let kept = format!("{} keeps what was written", self.files.dir.display());
        if done % self.keys.eval_every() == 0 || done == self.keys.max_steps() {
            self.evaluate(done).with_context(|| format!("the routing evaluation after step {done} failed; {kept}"))?;
        }
        if done % self.keys.save_steps() == 0 || done == self.keys.max_steps() {
            self.save(done).with_context(|| format!("saving the checkpoint of step {done} failed; {kept}"))?;
        }
        Ok(())
    }

    /// The context of an error at 0-based `step`: where training stopped and what was kept.
    fn stopped_at(&self, step: usize) -> String {
        format!("training stopped at step {}; {} keeps what was written", step + 1, self.files.dir.display())
    }

    /// One optimizer step (no evaluation or checkpoint), for benchmarks; returns its metrics.
    pub fn train_one(&mut self) -> Result<serde_json::Value> {
        let step = self.policy.version();
        self.step(step)
    }

    /// A test hook: the run's samplers stop receiving the policy's updates
    /// ([`Seat::break_weight_refresh_for_tests`]).
    #[doc(hidden)]
    pub fn break_weight_refresh_for_tests(&mut self) {
        self.policy.break_weight_refresh_for_tests();
    }

    /// The memory estimate of the run's step, made before its first step (`memory.rs`).
    pub fn memory_plan(&self) -> &memory::MemoryPlan {
        &self.memory
    }

    /// The decoders the run holds at its seat (one per set of adapter scales sampled at:
    /// training's and the evaluations', kept across steps and evaluations).
    pub fn decoders(&self) -> usize {
        self.policy.decoders()
    }

    fn evaluate(&mut self, step: usize) -> Result<()> {
        let modes = routing::eval_modes(self.policy.adapters());
        // Through the run's seat: its decoders (one per adapter scales) are kept across
        // evaluations and shared with training's, and stack in a pack like training samples.
        let report = match self.draw.episodes() {
            // One episode per evaluation prompt, at each mode's scales, with the evaluation seed.
            Some(episodes) => {
                let (policy, prompts, seed) = (&mut self.policy, &self.eval_prompts, eval_seed(&self.cfg));
                let mut rollout = |scales: &[f64], rewards: &mut RewardModel| episodes.play_at(policy, rewards, prompts, scales, (seed, seed), 0).map(|played| (played.samples, played.scored));
                eval::routing_eval_of(&mut rollout, &modes, &mut self.rewards, self.cfg.max_no_score_frac, step)?
            }
            None => {
                let sampling = eval_sampling_params(&self.cfg);
                let (tokenizer, mut sample) = self.policy.eval_sampler();
                let setup = EvalSetup { tokenizer, prompts: &self.eval_prompts, sampling: &sampling, seed: eval_seed(&self.cfg), max_no_score_frac: self.cfg.max_no_score_frac };
                eval::routing_eval(&mut sample, &modes, &mut self.rewards, &setup, step)?
            }
        };
        self.files.log.line(&eval::format_block(&report))?;
        let evaluation = eval::to_json(&report);
        self.files.live.routing_eval(&evaluation)?;
        self.files.evals.append(&evaluation)
    }

    fn save(&mut self, step: usize) -> Result<()> {
        let state = checkpoint::TrainerState {
            step,
            adapters: self.policy.adapters().clone(),
            base_model: self.policy.files().source.clone(),
            revision: self.cfg.revision.clone(),
            seed: self.cfg.seed,
        };
        let in_flight = self.draw.in_flight(&mut self.policy)?;
        let hf_files = (self.policy.adapters().kind == AdapterKind::Full).then_some((&self.policy.model().config, self.policy.files().tokenizer.as_path()));
        let snapshot = checkpoint::Snapshot {
            state,
            config_yaml: crate::yaml::to_string(&self.cfg)?,
            trainable: self.policy.trained_params(),
            optimizer: self.policy.optimizer_state(),
            hf_files,
            extra: &|dir| in_flight.as_ref().map_or(Ok(()), |batches| draw::write_in_flight(dir, batches)),
        };
        let dir = checkpoint::save(&self.files.dir, snapshot)?;
        self.files.log.line(&format!("saved {}", dir.display()))
    }
}

/// The sampling seed of every routing evaluation of a run (`smallrl eval` uses it too, so a
/// checkpoint's evaluation reproduces the training-time one).
pub fn eval_seed(cfg: &TrainConfig) -> u64 {
    rng::derive(cfg.seed, "eval", 0)
}

/// Sampling settings of a run's training batches: the run's temperature, top_k and top_p; no
/// repetition penalty; the kept sets recorded under sampling replay (`sampling_replay`). Its
/// routing evaluations draw the same tokens without them ([`eval_sampling_params`]).
pub fn sampling_params(cfg: &TrainConfig) -> SamplingParams {
    SamplingParams {
        max_new_tokens: cfg.max_completion_length,
        temperature: cfg.temperature,
        top_k: cfg.top_k,
        top_p: cfg.top_p,
        repetition_penalty: crate::defaults::REPETITION_PENALTY,
        kept_sets: cfg.sampling_replay == crate::grpo::SamplingReplay::KeptSets,
    }
}

/// Sampling settings of a run's evaluations: [`sampling_params`] without kept sets (nothing
/// compares an evaluation's log-probabilities with the sampler's).
pub fn eval_sampling_params(cfg: &TrainConfig) -> SamplingParams {
    SamplingParams { kept_sets: false, ..sampling_params(cfg) }
}
