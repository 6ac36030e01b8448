//! `smallrl pretrain`: causal-LM (next-token) training from scratch or from a model, full or with
//! LoRA / DualLoRA, on packed documents; AdamW with warm-up and cosine decay; held-out loss;
//! atomic checkpoints; and a final HF model directory (`<output_dir>/model`).
//!
//! Output directory: `config.yaml` (the resolved options), `train.log`, `metrics.jsonl` (one
//! line per step: `step`, `loss`, `lr`, `grad_norm`, `tokens`, `tokens_per_s`, `elapsed_s`, and
//! `heldout_loss` every `eval_steps`), `tokenizer.json` (when trained here), `checkpoint-N/`,
//! `model/`.
//!
//! Invariant: everything random (initialisation, held-out split, data order, adapter init)
//! derives from `seed` through `rng::derive`; libtorch's global generator is never used.
//!
//! Over 300 lines because it is one command end to end: its options (`PretrainConfig`, declared
//! once on the hyperparameter table of [`crate::hyperparams`], as `smallrl train`'s), the loop,
//! held-out loss and export; documents and initialisation are in `data.rs` and `init.rs`.

pub mod data;
pub mod init;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use tch::{Device, Reduction, Tensor};

use crate::adapters::{self, AdapterConfig, AdapterKind, set_base_trainable};
use crate::defaults as d;
use crate::hyperparams::Label::{Key, Omit, Short};
use crate::hyperparams::hyperparameters;
use crate::model::{Llama, LlamaConfig, Tokenizer};
use crate::optim::{AdamW, AdamWConfig, warmup_cosine_lr};
use crate::rng::derive;
use crate::train::checkpoint;
use crate::runlog::{Jsonl, RunLog};
use data::{PackedBatch, Row, RowStream, Source};

hyperparameters! {
    /// Every option of a pre-training run (flags in kebab-case; written to `config.yaml`), on the
    /// same hyperparameter table as `smallrl train`'s.
    pub struct PretrainConfig;
    /// `smallrl pretrain`'s flags: one per key of [`PretrainConfig`], each optional.
    pub struct PretrainFlags;
    flags {
        /// `random`, or a model directory / Hub repo id / smallrl checkpoint to continue from.
        init: String = d::PRETRAIN_INIT.into(), Omit;
        /// Architecture for `--init random` (its vocab_size follows the tokenizer).
        #[arg(conflicts_with = "config")]
        arch: String = d::PRETRAIN_ARCH.into(), Key;
        /// A config.json for `--init random` instead of --arch (its vocab_size must hold the tokenizer).
        config: Option<PathBuf> = None, Omit;
        /// `train:N` (a WordPiece tokenizer of at most N tokens trained on the training documents)
        /// or a tokenizer.json. Default: train:4096 from random, the model's own with --init PATH.
        tokenizer: Option<String> = None, Omit;
        /// Training documents: a text file (one per line) or a .jsonl file (see --text-field).
        #[arg(conflicts_with = "corpus")]
        data: Option<PathBuf> = None, Omit;
        /// The JSON field holding the document in a .jsonl --data file.
        text_field: String = d::PRETRAIN_TEXT_FIELD.into(), Omit;
        /// `synthetic` (the built-in story corpus, offline) or `simplestories` (HF Hub dataset).
        corpus: Option<String> = None, Key;
        /// Stories of the synthetic corpus (held-out ones included).
        corpus_stories: usize = d::CORPUS_STORIES, Key;
        /// Seed of the synthetic corpus.
        corpus_seed: u64 = d::CORPUS_SEED, Key;
        /// Documents held out for the held-out loss.
        heldout_docs: usize = d::PRETRAIN_HELDOUT_DOCS, Key;
        /// Tokens per packed row (longer documents are cut, and counted in the log).
        block_size: usize = d::PRETRAIN_BLOCK_SIZE, Key;
        /// Packed rows per step.
        batch_size: usize = d::PRETRAIN_BATCH_SIZE, Key;
        /// Optimizer steps.
        max_steps: usize = d::PRETRAIN_MAX_STEPS, Key;
        /// Peak learning rate (after the warm-up).
        lr: f64 = d::PRETRAIN_LEARNING_RATE, Key;
        /// Steps of linear warm-up.
        warmup_steps: usize = d::PRETRAIN_WARMUP_STEPS, Key;
        /// The cosine decay ends at lr * min_lr_ratio.
        min_lr_ratio: f64 = d::PRETRAIN_MIN_LR_RATIO, Key;
        /// AdamW weight decay, on matrices only (not on norm weights).
        weight_decay: f64 = d::PRETRAIN_WEIGHT_DECAY, Key;
        /// AdamW's beta1.
        adam_beta1: f64 = d::ADAM_BETA1, Key;
        /// AdamW's beta2.
        adam_beta2: f64 = d::PRETRAIN_ADAM_BETA2, Key;
        /// AdamW's epsilon.
        adam_epsilon: f64 = d::ADAM_EPSILON, Key;
        /// Gradient clipping by global norm.
        max_grad_norm: f64 = d::MAX_GRAD_NORM, Key;
        /// full, lora or dual-lora (adapters need --init PATH: a random base is not worth keeping frozen).
        adapter: AdapterKind = d::ADAPTER, Short("");
        /// DualLoRA preset (overrides the ranks).
        lora_preset: Option<String> = None, Short("");
        /// Rank of LoRA (adapter lora).
        lora_rank: usize = d::LORA_RANK, Key;
        /// LoRA's alpha.
        lora_alpha: f64 = d::LORA_ALPHA, Key;
        /// Rank of DualLoRA's retain adapter.
        retain_rank: usize = d::RETAIN_RANK, Key;
        /// Rank of DualLoRA's forget adapter.
        forget_rank: usize = d::FORGET_RANK, Key;
        /// Adapters on every layer_stride-th layer.
        layer_stride: usize = d::LAYER_STRIDE, Key;
        /// Random seed (initialisation, held-out split, data order, adapter init).
        seed: u64 = d::SEED, Omit;
        /// Steps between held-out losses.
        eval_steps: usize = d::PRETRAIN_EVAL_STEPS, Omit;
        /// Steps between checkpoints.
        save_steps: usize = d::PRETRAIN_SAVE_STEPS, Omit;
        /// Steps between metrics lines.
        logging_steps: usize = d::PRETRAIN_LOGGING_STEPS, Omit;
        /// A new or empty directory for the run.
        output_dir: PathBuf = d::PRETRAIN_OUTPUT_DIR.into(), Omit;
        /// auto, cpu, cuda or cuda:N.
        device: String = d::DEVICE.into(), Omit;
        /// libtorch intra-op threads (default: one per core).
        threads: Option<usize> = None, Omit;
    }
    file_only {}
}

impl PretrainConfig {
    fn validate(&self) -> Result<()> {
        for (name, value) in [("block_size", self.block_size), ("batch_size", self.batch_size), ("max_steps", self.max_steps)] {
            ensure!(value > 0, "--{} must be at least 1", name.replace('_', "-"));
        }
        for (name, value) in [("eval_steps", self.eval_steps), ("save_steps", self.save_steps), ("logging_steps", self.logging_steps)] {
            ensure!(value > 0, "--{} must be at least 1", name.replace('_', "-"));
        }
        ensure!(self.heldout_docs > 0, "--heldout-docs must be at least 1: the held-out loss is how a run is judged");
        ensure!(self.lr > 0.0 && (0.0..=1.0).contains(&self.min_lr_ratio), "--lr must be positive and --min-lr-ratio in [0, 1]");
        ensure!(self.data.is_some() != self.corpus.is_some(), "give exactly one of --data FILE and --corpus synthetic|simplestories");
        let adapters = self.adapter_config()?;
        ensure!(
            adapters.kind == AdapterKind::Full || self.init != d::PRETRAIN_INIT,
            "--adapter {} trains adapters on a frozen base: give --init PATH (a random base is not worth freezing)",
            self.adapter
        );
        Ok(())
    }

    fn adapter_config(&self) -> Result<AdapterConfig> {
        let ranks = adapters::Ranks {
            lora_rank: self.lora_rank,
            retain_rank: self.retain_rank,
            forget_rank: self.forget_rank,
            lora_alpha: self.lora_alpha,
            layer_stride: self.layer_stride,
        };
        ensure!(self.adapter != AdapterKind::DualMlp, "smallrl pretrain trains full, lora or dual-lora: DualMLP adapters are for smallrl train (its mlp_config)");
        adapters::config_from(self.adapter, self.lora_preset.as_deref(), None, &ranks)
    }

    fn source(&self) -> Result<Source<'_>> {
        if let Some(path) = &self.data {
            let is_jsonl = path.extension().is_some_and(|e| e == "jsonl");
            return Ok(if is_jsonl { Source::JsonlFile(path, &self.text_field) } else { Source::TextFile(path) });
        }
        match self.corpus.as_deref() {
            Some("synthetic") => Ok(Source::Synthetic { stories: self.corpus_stories, seed: self.corpus_seed }),
            Some("simplestories") => Ok(Source::SimpleStories),
            other => bail!("unknown --corpus {other:?}: use synthetic or simplestories"),
        }
    }
}

/// What a finished run reports.
pub struct Summary {
    pub model_dir: PathBuf,
    pub initial_heldout_loss: f64,
    pub final_heldout_loss: f64,
}

pub fn run(cfg: PretrainConfig) -> Result<Summary> {
    cfg.validate()?;
    crate::device::set_threads(cfg.threads)?;
    let device = crate::device::parse_device(&cfg.device)?;
    prepare_output_dir(&cfg.output_dir)?;
    crate::fsutil::write_atomic(&cfg.output_dir.join("config.yaml"), crate::yaml::to_string(&cfg)?.as_bytes())?;
    let mut log = RunLog::open(&cfg.output_dir, cfg.max_steps as u64)?;
    let documents = data::read_documents(&cfg.source()?)?;
    let (training, heldout) = data::split_heldout(documents, cfg.heldout_docs, cfg.seed)?;
    log.line(&format!("documents: {} training, {} held-out", training.len(), heldout.len()))?;
    let (mut model, tokenizer) = model_and_tokenizer(&cfg, &training, device, &mut log)?;
    let adapters = cfg.adapter_config()?;
    match adapters.kind {
        AdapterKind::Full => set_base_trainable(&mut model, true),
        _ => adapters.attach(&mut model, derive(cfg.seed, "adapter-init", 0))?,
    }
    let eos = model.config.eos_token_id;
    let train_docs = data::tokenize(&training, &tokenizer, eos, cfg.block_size)?;
    let heldout_docs = data::tokenize(&heldout, &tokenizer, eos, cfg.block_size)?;
    log_truncation(&mut log, "training", &train_docs, cfg.block_size)?;
    log_truncation(&mut log, "held-out", &heldout_docs, cfg.block_size)?;
    let heldout_refs: Vec<&[i64]> = heldout_docs.documents.iter().map(Vec::as_slice).collect();
    let heldout_rows = data::pack(&heldout_refs, cfg.block_size);
    let mut run = Run { cfg: &cfg, model, adapters, tokenizer, heldout_rows, device, log, metrics: Jsonl::new(cfg.output_dir.join("metrics.jsonl")) };
    let summary = run.train(&train_docs.documents)?;
    run.log_samples(&heldout)?;
    Ok(summary)
}

/// The output directory must be new or empty: nothing a previous run wrote is overwritten.
fn prepare_output_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).with_context(|| format!("cannot read output directory {}", dir.display()))?;
        ensure!(entries.next().is_none(), "output directory {} is not empty; choose a new --output-dir", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create output directory {}", dir.display()))
}

fn log_truncation(log: &mut RunLog, what: &str, docs: &data::Tokenized, block_size: usize) -> Result<()> {
    log.line(&format!("{what}: {} documents, {} tokens with [EOS]", docs.documents.len(), docs.tokens))?;
    if docs.truncated > 0 {
        log.line(&format!(
            "note: {} {what} documents are longer than --block-size {block_size} and were cut (they lose their [EOS])",
            docs.truncated
        ))?;
    }
    Ok(())
}

/// The starting model and the tokenizer it is trained with (see `--init`, `--tokenizer`).
fn model_and_tokenizer(cfg: &PretrainConfig, training: &[String], device: Device, log: &mut RunLog) -> Result<(Llama, Tokenizer)> {
    if cfg.init != d::PRETRAIN_INIT {
        ensure!(cfg.config.is_none(), "--config describes a new model; it cannot be combined with --init {}", cfg.init);
        let adapter_checkpoint = Path::new(&cfg.init).join("adapters.safetensors").exists();
        ensure!(
            cfg.adapter_config()?.kind == AdapterKind::Full || !adapter_checkpoint,
            "--init {} is an adapter checkpoint: new adapters need a plain base model (write one with `smallrl export`)",
            cfg.init
        );
        let (model, model_tokenizer) = init::load_model(&cfg.init, device)?;
        let tokenizer_path = match cfg.tokenizer.as_deref() {
            None => model_tokenizer,
            Some(spec) if spec.starts_with("train:") => bail!("--tokenizer {spec} would not match the embeddings of --init {}; reuse its tokenizer", cfg.init),
            Some(path) => PathBuf::from(path),
        };
        let tokenizer = checked_tokenizer(&tokenizer_path, &model.config)?;
        log.line(&format!("init: {} ({} parameters), tokenizer {}", cfg.init, parameter_count(&model), tokenizer_path.display()))?;
        return Ok((model, tokenizer));
    }
    let tokenizer_path = tokenizer_for_new_model(cfg, training, log)?;
    let tokenizer = Tokenizer::from_file(&tokenizer_path)?;
    let config = match &cfg.config {
        Some(path) => LlamaConfig::from_file(path)?,
        None => LlamaConfig::architecture(&cfg.arch, tokenizer.vocab_size())?,
    };
    let tokenizer = checked_tokenizer(&tokenizer_path, &config)?;
    let model = init::random_model(config, d::INITIALIZER_RANGE, derive(cfg.seed, "model-init", 0), device)?;
    log.line(&format!("init: random ({} parameters, vocab_size {}), seed {}", parameter_count(&model), model.config.vocab_size, cfg.seed))?;
    Ok((model, tokenizer))
}

/// `train:N` trains and saves `<output_dir>/tokenizer.json`; anything else is a tokenizer file.
fn tokenizer_for_new_model(cfg: &PretrainConfig, training: &[String], log: &mut RunLog) -> Result<PathBuf> {
    let spec = cfg.tokenizer.as_deref().unwrap_or(d::PRETRAIN_TOKENIZER);
    let Some(size) = spec.strip_prefix("train:") else { return Ok(PathBuf::from(spec)) };
    let size: usize = size.parse().with_context(|| format!("--tokenizer {spec}: expected train:N with N a number of tokens"))?;
    let trained = crate::model::wordpiece::train(training, size)?;
    let path = cfg.output_dir.join("tokenizer.json");
    trained.save(&path)?;
    log.line(&format!("tokenizer: {} ({})", path.display(), trained.size_note()))?;
    Ok(path)
}

/// Loads a tokenizer and checks it against the model: `[EOS]` is the model's EOS and a special
/// token, and every token id has an embedding.
fn checked_tokenizer(path: &Path, config: &LlamaConfig) -> Result<Tokenizer> {
    let tokenizer = Tokenizer::from_file(path)?;
    tokenizer.check_eos(config.eos_token_id)?;
    ensure!(
        tokenizer.vocab_size() <= config.vocab_size,
        "tokenizer {} has {} tokens but the model's vocab_size is {}",
        path.display(),
        tokenizer.vocab_size(),
        config.vocab_size
    );
    Ok(tokenizer)
}

fn parameter_count(model: &Llama) -> i64 {
    model.base_tensors().iter().map(|(_, t)| t.numel() as i64).sum()
}

struct Run<'a> {
    cfg: &'a PretrainConfig,
    model: Llama,
    adapters: AdapterConfig,
    tokenizer: Tokenizer,
    heldout_rows: Vec<Row>,
    device: Device,
    log: RunLog,
    metrics: Jsonl,
}

impl Run<'_> {
    fn train(&mut self, documents: &[Vec<i64>]) -> Result<Summary> {
        let cfg = self.cfg;
        let adam = AdamWConfig { beta1: cfg.adam_beta1, beta2: cfg.adam_beta2, eps: cfg.adam_epsilon, weight_decay: cfg.weight_decay };
        let mut optimizer = AdamW::decay_matrices_only(self.adapters.trainable(&self.model), adam);
        let mut stream = RowStream::new(documents, cfg.block_size, cfg.seed);
        let initial_heldout_loss = self.heldout_loss();
        self.metrics.append(&serde_json::json!({"step": 0, "heldout_loss": initial_heldout_loss}))?;
        self.log.line(&format!("step 0: held-out loss {initial_heldout_loss:.4}"))?;
        let start = Instant::now();
        let mut final_heldout_loss = initial_heldout_loss;
        for step in 1..=cfg.max_steps {
            let rows = stream.take_rows(cfg.batch_size);
            let batch = data::batch(&rows, cfg.block_size, i64::from(self.model.config.eos_token_id), self.device);
            let step_start = Instant::now();
            let lr = warmup_cosine_lr(cfg.lr, step - 1, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio);
            let (loss, grad_norm) = self.optimizer_step(&mut optimizer, &batch, lr);
            let mut line = serde_json::json!({
                "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": batch.target_tokens,
                "tokens_per_s": batch.target_tokens as f64 / step_start.elapsed().as_secs_f64(),
                "elapsed_s": start.elapsed().as_secs_f64(), "epoch": stream.epochs(),
            });
            if step % cfg.eval_steps == 0 || step == cfg.max_steps {
                final_heldout_loss = self.heldout_loss();
                line["heldout_loss"] = final_heldout_loss.into();
            }
            self.metrics.append(&line)?;
            self.report(step, &line)?;
            if step % cfg.save_steps == 0 && step < cfg.max_steps {
                self.save_checkpoint(step, &optimizer)?;
            }
        }
        self.save_checkpoint(cfg.max_steps, &optimizer)?;
        let model_dir = cfg.output_dir.join("model");
        let scales = vec![1.0; self.model.adapter_slots()];
        crate::model::export::save_hf_dir(&self.model, &scales, self.tokenizer.path(), &model_dir)?;
        self.log.finish();
        self.log.line(&format!("model: {} (held-out loss {initial_heldout_loss:.4} -> {final_heldout_loss:.4})", model_dir.display()))?;
        Ok(Summary { model_dir, initial_heldout_loss, final_heldout_loss })
    }

    /// Forward, backward, clip, AdamW; returns the batch loss and the gradient norm before clipping.
    fn optimizer_step(&mut self, optimizer: &mut AdamW, batch: &PackedBatch, lr: f64) -> (f64, f64) {
        optimizer.zero_grad();
        let loss = self.loss(batch);
        loss.backward();
        let grad_norm = optimizer.clip_grad_norm(self.cfg.max_grad_norm);
        optimizer.step(lr);
        let loss = loss.double_value(&[]);
        assert!(loss.is_finite(), "the training loss is {loss}: lower --lr");
        (loss, grad_norm)
    }

    /// Mean next-token cross-entropy over the batch's targets.
    fn loss(&self, batch: &PackedBatch) -> Tensor {
        let ctl: Vec<_> = (0..self.model.adapter_slots()).map(|_| crate::model::linear::AdapterCtl::on()).collect();
        let hidden = self.model.forward_masked(&batch.input_ids, &batch.positions, &batch.mask, &ctl);
        let logits = self.model.logits(&hidden);
        let vocab = logits.size()[2];
        logits.view([-1, vocab]).cross_entropy_loss(&batch.targets.view([-1]), None::<Tensor>, Reduction::Mean, data::NO_TARGET, 0.0)
    }

    /// Token-weighted mean loss over every held-out row (no gradient).
    fn heldout_loss(&self) -> f64 {
        let _guard = tch::no_grad_guard();
        let (mut total, mut tokens) = (0.0, 0i64);
        for rows in self.heldout_rows.chunks(self.cfg.batch_size) {
            let batch = data::batch(rows, self.cfg.block_size, i64::from(self.model.config.eos_token_id), self.device);
            total += self.loss(&batch).double_value(&[]) * batch.target_tokens as f64;
            tokens += batch.target_tokens;
        }
        total / tokens as f64
    }

    fn report(&mut self, step: usize, line: &serde_json::Value) -> Result<()> {
        let message = format!("loss {:.4}  lr {:.2e}", line["loss"].as_f64().unwrap_or(f64::NAN), line["lr"].as_f64().unwrap_or(f64::NAN));
        self.log.progress(step as u64, message.clone());
        if step % self.cfg.logging_steps == 0 || line.get("heldout_loss").is_some() {
            let heldout = line.get("heldout_loss").and_then(|v| v.as_f64()).map(|l| format!("  held-out {l:.4}")).unwrap_or_default();
            let speed = line["tokens_per_s"].as_f64().unwrap_or(0.0);
            self.log.line(&format!("step {step}: {message}{heldout}  {speed:.0} tokens/s"))?;
        }
        Ok(())
    }

    fn save_checkpoint(&mut self, step: usize, optimizer: &AdamW) -> Result<()> {
        let state = checkpoint::TrainerState {
            step,
            adapters: self.adapters.clone(),
            base_model: self.cfg.init.clone(),
            revision: d::REVISION.into(),
            seed: self.cfg.seed,
        };
        let hf_files = (self.adapters.kind == AdapterKind::Full).then_some((&self.model.config, self.tokenizer.path()));
        let snapshot = checkpoint::Snapshot {
            state,
            config_yaml: crate::yaml::to_string(self.cfg)?,
            trainable: optimizer.params(),
            optimizer: optimizer.state_tensors(),
            hf_files,
            extra: &|_| Ok(()),
        };
        let dir = checkpoint::save(&self.cfg.output_dir, snapshot)?;
        self.log.line(&format!("saved {}", dir.display()))
    }

    /// A few samples from the openings (first four words) of held-out documents, into the log.
    fn log_samples(&mut self, heldout: &[String]) -> Result<()> {
        let openings: Vec<String> = heldout.iter().take(4).map(|d| d.split_whitespace().take(4).collect::<Vec<_>>().join(" ")).collect();
        let prompts = openings.iter().map(|o| self.tokenizer.encode(o)).collect::<Result<Vec<_>>>()?;
        let params = crate::train::eval_sampling_params(&crate::train::TrainConfig::default());
        let decoder = crate::model::decode::DecodeModel::new(&self.model, &vec![1.0; self.model.adapter_slots()]);
        let generation = crate::model::generate::generate(&decoder, &prompts, &params, derive(self.cfg.seed, "samples", 0))?;
        for (opening, row) in openings.iter().zip(&generation.rows) {
            let end = if row.ended_with_eos { "" } else { " [truncated]" };
            self.log.line(&format!("[Sample] {opening} ||| {}{end}", self.tokenizer.decode(&row.ids)?))?;
        }
        Ok(())
    }
}
