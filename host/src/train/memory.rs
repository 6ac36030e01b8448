//! Memory planning: what one training step of a run needs, before the first step samples
//! anything, and how many micro-batches (`gradient_accumulation_steps: auto`) make it fit.
//!
//! [`estimate`] is a pure function of the model's `config.json` and the step's shape (rows,
//! tokens, dtype, adapters, sampler copies): the figures below are counted from the forward
//! pass of `model/llama.rs` (what autograd keeps per token and per layer) and checked against
//! measured peaks (`tests/train/memory.rs`; docs/src/training.md lists the measurements). The
//! planner ([`plan`]) picks the fewest micro-batches, among the divisors of the step's rows,
//! whose estimated peak fits the memory available to the run; [`NoFit`] says what would be
//! needed when even one row per micro-batch does not fit.
//!
//! Peaks are counted in three phases that do not overlap in time (unless the run samples
//! ahead, when sampling overlaps training): sampling (KV caches), scoring (no-grad passes over
//! the rollout) and training (the micro-batch's activations and the head's chunks). What stays
//! resident (weights, the reference copy, the sampler's folded copies, gradients and Adam's
//! moments) is under all three.

use anyhow::{Context, Result, bail, ensure};

use tch::Device;

use super::config::{Accumulation, TrainConfig};
use crate::adapters::{AdapterConfig, AdapterKind};
use crate::model::LlamaConfig;
use crate::reward::Prompt;
use crate::routing;
use super::policy::Policy;

/// One gigabyte (10^9 bytes), the unit the logs and errors use.
pub const GB: f64 = 1e9;

/// The fraction of the available memory the planner lets a step use: the rest absorbs the
/// allocator's fragmentation and the estimate's error (3% and 24% above the measured peaks of
/// SmolLM2 and tiny-stories, docs/src/training.md).
pub const USABLE_FRACTION: f64 = 0.8;

/// Floats autograd keeps per token of one layer, beyond the projections' widths (counted from
/// `llama.rs`'s forward pass; see [`ModelShape::saved_per_token`]), times this factor for the
/// backward pass's temporaries (a layer's input gradients and its recomputed intermediates while
/// its backward runs) and the allocator's slack: checked against the peaks measured on
/// tiny-stories and SmolLM2 on the CPU (docs/src/training.md). Under autocast the surplus
/// (`ACTIVATION_FACTOR - 1`) is of the float32 count: the backward's gradients stay float32.
pub const ACTIVATION_FACTOR: f64 = 1.5;

/// The architecture's sizes, from its `config.json`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub layers: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub q_size: u64,
    pub kv_size: u64,
    pub vocab: u64,
    pub tied: bool,
}

impl ModelShape {
    pub fn of(cfg: &LlamaConfig) -> Self {
        Self {
            layers: cfg.num_hidden_layers as u64,
            hidden: cfg.hidden_size as u64,
            intermediate: cfg.intermediate_size as u64,
            heads: cfg.num_attention_heads as u64,
            q_size: cfg.q_size() as u64,
            kv_size: cfg.kv_size() as u64,
            vocab: cfg.vocab_size as u64,
            tied: cfg.tie_word_embeddings,
        }
    }

    /// Parameters of the base model: embeddings (and an untied head), per layer the four
    /// attention projections, the three MLP projections and two norms, and the final norm
    /// (Qwen's q/k/v biases and q/k norms are under 0.1% and left out).
    pub fn params(&self) -> u64 {
        let (h, i) = (self.hidden, self.intermediate);
        let attention = h * self.q_size + 2 * h * self.kv_size + self.q_size * h;
        let layer = attention + 3 * h * i + 2 * h;
        let head = if self.tied { 0 } else { self.vocab * h };
        self.vocab * h + head + self.layers * layer + h
    }

    /// Values of one decoder's folded weights (`model/folded.rs`): the parameters, the output
    /// head as its own transposed copy even when tied, and `rotate_half`'s copies of q's and
    /// k's rows in the fused projection (a DualMLP's folded neurons are left out, as its
    /// adapters are).
    pub fn folded_params(&self) -> u64 {
        let head = if self.tied { self.vocab * self.hidden } else { 0 };
        self.params() + head + self.layers * (self.q_size + self.kv_size) * self.hidden
    }

    /// Bytes one decoder holds between deliveries (`model/decode.rs`): where the native CPU
    /// sampler serves, its copy alone (`native`: its matrices' bytes a value; the embeddings stay
    /// float32, the norms are left out; it keeps no libtorch weights), else its libtorch weights
    /// in the sampling dtype (`libtorch_bytes` a value). The fold a delivery starts from is
    /// transient, one at a time: [`Self::fold_bytes`].
    pub fn decoder_bytes(&self, libtorch_bytes: u64, native: Option<u64>) -> u64 {
        let folded = self.folded_params();
        match native {
            Some(matrix_bytes) => folded * matrix_bytes + self.vocab * self.hidden * (4 - matrix_bytes),
            None => folded * libtorch_bytes,
        }
    }

    /// Bytes of the fold a delivery refills a decoder from (`FoldedWeights::new`, in the model's
    /// dtype, `model_bytes` a value): alive beside the decoders' copies until the delivery drops
    /// it or moves it in, before the decode's KV caches exist.
    pub fn fold_bytes(&self, model_bytes: u64) -> u64 {
        self.folded_params() * model_bytes
    }

    /// Values autograd keeps for the backward pass per token of one layer: the two RMSNorms'
    /// inputs and outputs (4 h), q, k, v and their rotated copies (2 (q + 2 kv)), k and v
    /// expanded to the query heads when grouped (2 q), the attention's output and its
    /// transposed copy for o_proj (2 q), and the MLP's gate, its SiLU, up and their product (4 i).
    pub fn saved_per_token(&self) -> u64 {
        let grouped = if self.kv_size != self.q_size { 2 * self.q_size } else { 0 };
        4 * self.hidden + 2 * (self.q_size + 2 * self.kv_size) + grouped + 2 * self.q_size + 4 * self.intermediate
    }
}

/// What a run's step holds besides the model: the shape of its batches and copies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    /// Completions of one optimizer step (batch_size / num_substeps): the micro-batches split them.
    pub rows: u64,
    /// Completions sampled and scored at once (a rollout).
    pub rollout_rows: u64,
    /// Tokens of a row: the longest prompt plus max_completion_length.
    pub tokens: u64,
    /// Bytes of a value of the model's dtype (4 for float32, 2 for bfloat16).
    pub dtype_bytes: u64,
    /// Bytes of a value the training passes' matrix products take and give (`train_dtype`: 2
    /// under bfloat16 autocast, else `dtype_bytes`).
    pub matmul_bytes: u64,
    /// Trainable parameters (the adapters', or the model's with full fine-tuning).
    pub trainable: u64,
    /// Values the adapters keep per token of one layer (summed over the model's layers and
    /// divided by their number): a DualMLP's extra neurons, a LoRA's rank.
    pub adapter_per_token: u64,
    /// Under autocast, the values the adapters cast from the float32 residual stream per token
    /// of one layer (averaged like `adapter_per_token`): a LoRA's branch casts its input anew
    /// for each targeted projection that reads a norm's output (q, k, v, gate, up: `hidden`
    /// each; o and down read bfloat16 already), a DualMLP's neurons for their gate and up.
    pub adapter_casts: u64,
    /// Full fine-tuning: the frozen reference is a second copy of the weights.
    pub reference_copy: bool,
    /// The sampler's decoders, each a copy of the weights with the adapters folded in (one per
    /// set of adapter scales sampled at: training's and the evaluation's modes).
    pub decoders: u64,
    /// Bytes one decoder holds ([`ModelShape::decoder_bytes`]: on the CPU the native sampler's
    /// copy).
    pub decoder_bytes: u64,
    /// A second gradient buffer (split_moment's natural gradient).
    pub extra_gradients: bool,
    /// Sampling ahead overlaps sampling and training.
    pub samples_ahead: bool,
    /// Rows of the output head computed together (`engine`'s head chunk).
    pub head_chunk_rows: u64,
}

/// A step's memory, in bytes, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The model's weights (already resident when the planner runs).
    pub weights: u64,
    /// The reference copy (full fine-tuning) and the sampler's folded copies.
    pub copies: u64,
    /// Gradients and Adam's two moments of the trainable parameters (float32).
    pub optimizer: u64,
    /// Sampling's peak beyond the resident parts: the KV caches of a rollout and its logits, or
    /// the fold a delivery refills a decoder from where that is larger (it is gone before the
    /// caches are made).
    pub sampling: u64,
    /// Scoring's peak: a no-grad forward pass over the rollout (one layer's values at a time).
    pub scoring: u64,
    /// Training's peak besides the activations: the output head's chunk of logits,
    /// probabilities and residuals (float32).
    pub head_chunk: u64,
    /// `train_dtype: bfloat16`: the bfloat16 copy of every weight the training pass's products
    /// take, which autograd keeps until the backward pass has used it (0 without autocast).
    pub matmul_copies: u64,
    /// Activations kept for the backward pass, per row of a micro-batch.
    pub per_row: u64,
}

/// The estimate of `model` trained as `step` says.
pub fn estimate(model: &ModelShape, step: &StepShape) -> Estimate {
    const F32: u64 = 4;
    let bytes = step.dtype_bytes;
    let weights = model.params() * bytes;
    let copies = if step.reference_copy { weights } else { 0 } + step.decoders * step.decoder_bytes;
    let gradient_buffers = if step.extra_gradients { 2 } else { 1 };
    let optimizer = step.trainable * F32 * (2 + gradient_buffers);
    let kv_cache = step.rollout_rows * step.tokens * model.layers * 2 * model.kv_size * F32;
    let sampling = (kv_cache + step.rollout_rows * model.vocab * F32 * 2).max(model.fold_bytes(bytes));
    // One layer's widest values at a time (its input, q/k/v, the MLP's three intermediates),
    // the attention's scores, and the head's hidden states of every row.
    let layer_values = 2 * model.hidden + model.q_size + 2 * model.kv_size + 3 * model.intermediate;
    let scoring = step.rollout_rows * (step.tokens * (layer_values * bytes + model.hidden * F32) + model.heads * step.tokens * step.tokens * F32);
    let head_chunk = step.head_chunk_rows * model.vocab * F32 * 3;
    // Under autocast (`model/autocast.rs`) the products' inputs and outputs, which are most of
    // what a layer saves, are kept in `matmul_bytes`, but the residual stream stays in the
    // model's dtype: of the two RMSNorms' 4 h, their inputs (2 h) keep their width, and their
    // outputs are not kept; each product that reads one casts it anew and keeps its own copy
    // (q, k, v; gate, up: 5 h), and so does each adapter branch that reads one
    // (`adapter_casts`).
    let autocast = step.matmul_bytes < bytes;
    let matmul_copies = if autocast { model.params() * step.matmul_bytes } else { 0 };
    let per_layer = match autocast {
        false => (model.saved_per_token() + step.adapter_per_token) * bytes,
        true => (model.saved_per_token() - 4 * model.hidden + 5 * model.hidden + step.adapter_per_token + step.adapter_casts) * step.matmul_bytes + 2 * model.hidden * bytes,
    };
    let saved = activations(model, step, per_layer, step.matmul_bytes);
    // The backward pass's temporaries (ACTIVATION_FACTOR - 1 of the saved values) are counted
    // at the model's dtype even under autocast: each cast's gradient, the residual stream's and
    // the norms' are float32, and they are most of a layer's backward (measured on
    // tiny-stories' layers replicated in PyTorch, DualLoRA r4, 64 rows of 72 tokens: bfloat16
    // saved 0.64 of float32's values, 118 MB against 184, but its backward added 108-117 MB
    // over them against float32's 113-128). Without this and `adapter_casts` bfloat16's step
    // was estimated at 0.92 of its measured peak (docs/src/training.md).
    let float_saved = activations(model, step, (model.saved_per_token() + step.adapter_per_token) * bytes, bytes);
    let per_row = (saved as f64 + float_saved as f64 * (ACTIVATION_FACTOR - 1.0)) as u64;
    Estimate { weights, copies, optimizer, sampling, scoring, head_chunk, matmul_copies, per_row }
}

/// Values autograd keeps for one row's backward pass, `per_layer` bytes per token of each layer:
/// per token also the embedding output and the head's float32 hidden states and residual
/// product; per row each layer's attention scores and probabilities (`attention_bytes` each)
/// and the boolean mask.
fn activations(model: &ModelShape, step: &StepShape, per_layer: u64, attention_bytes: u64) -> u64 {
    const F32: u64 = 4;
    let per_token = model.layers * per_layer + model.hidden * (step.dtype_bytes + 2 * F32);
    let per_row_attention = model.layers * 2 * model.heads * step.tokens * step.tokens * attention_bytes + step.tokens * step.tokens;
    step.tokens * per_token + per_row_attention
}

impl Estimate {
    /// Everything resident through the run: weights, copies, optimizer state.
    pub fn resident(&self) -> u64 {
        self.weights + self.copies + self.optimizer
    }

    /// Training's peak beyond the resident parts with `rows` rows per micro-batch.
    pub fn training(&self, rows: u64) -> u64 {
        self.head_chunk + self.matmul_copies + rows * self.per_row
    }

    /// The step's peak with `rows` rows per micro-batch.
    pub fn peak(&self, rows: u64, samples_ahead: bool) -> u64 {
        let phases = match samples_ahead {
            true => self.sampling + self.training(rows).max(self.scoring),
            false => self.sampling.max(self.scoring).max(self.training(rows)),
        };
        self.resident() + phases
    }
}

/// The memory a run may use and where the figure comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Bytes the run may still allocate beyond its weights (already resident).
    pub bytes: u64,
    /// How the figure was found, for logs and errors.
    pub source: String,
}

/// The planner's choice: `micro_batches` of `rows` rows each, and the estimated peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub micro_batches: u64,
    pub rows: u64,
    pub peak: u64,
}

/// Even the smallest allowed micro-batch does not fit: the peak it needs and the budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoFit {
    pub rows: u64,
    pub needed: u64,
    pub available: u64,
}

/// The fewest micro-batches `k` (a divisor of `step.rows`) whose peak beyond the weights fits
/// `budget` (times [`USABLE_FRACTION`]); `max_micro_batches` bounds `k` (1 when the loss or a
/// probe needs the step's one pass).
pub fn plan(estimate: &Estimate, step: &StepShape, budget: u64, max_micro_batches: u64) -> std::result::Result<Plan, NoFit> {
    let usable = (budget as f64 * USABLE_FRACTION) as u64;
    let beyond_weights = |rows| estimate.peak(rows, step.samples_ahead) - estimate.weights;
    let divisors = (1..=step.rows.min(max_micro_batches)).filter(|k| step.rows % k == 0);
    let mut smallest = None;
    for k in divisors {
        let rows = step.rows / k;
        if beyond_weights(rows) <= usable {
            return Ok(Plan { micro_batches: k, rows, peak: estimate.peak(rows, step.samples_ahead) });
        }
        smallest = Some(rows);
    }
    let rows = smallest.unwrap_or(step.rows);
    Err(NoFit { rows, needed: estimate.peak(rows, step.samples_ahead), available: estimate.weights + usable })
}

/// The run's step shape, from its configuration, adapters, trainable parameters' count and
/// `longest_prompt` (in tokens, over the training and evaluation prompts).
pub fn step_shape(cfg: &TrainConfig, model: &ModelShape, adapters: &AdapterConfig, trainable: u64, longest_prompt: usize, device: Device) -> StepShape {
    let adapted = model.layers.div_ceil(adapters.layer_stride.max(1) as u64);
    let ranks: u64 = adapters.ranks.iter().map(|&r| r as u64).sum();
    let per_adapted_layer = match adapters.kind {
        AdapterKind::Full => 0,
        // A DualMLP's neurons keep what the MLP's keep: gate, its SiLU, up and their product.
        AdapterKind::DualMlp => 4 * ranks,
        // A LoRA keeps its input's projection to its rank and the result per target module.
        AdapterKind::Lora | AdapterKind::DualLora => 2 * ranks * adapters.target_modules.len() as u64,
    };
    // split_moment's natural share keeps its terms' neurons or rank values once more (its
    // input is cast together with the routed term's: `mlp_adapter::weighted_swiglu`).
    let per_adapted_layer = per_adapted_layer * if cfg.split_moment { 2 } else { 1 };
    let casts_per_adapted_layer = match adapters.kind {
        AdapterKind::Full => 0,
        AdapterKind::DualMlp => 2 * adapters.ranks.len() as u64 * model.hidden,
        AdapterKind::Lora | AdapterKind::DualLora => {
            let reads_norm = |m: &String| ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"].contains(&m.as_str());
            adapters.target_modules.iter().filter(|m| reads_norm(m)).count() as u64 * model.hidden
        }
    };
    StepShape {
        rows: cfg.mini_batch_size() as u64,
        rollout_rows: cfg.rollout_rows().max(cfg.eval_samples) as u64,
        tokens: (longest_prompt + cfg.max_completion_length) as u64,
        dtype_bytes: cfg.dtype.kind().elt_size_in_bytes() as u64,
        matmul_bytes: cfg.train_dtype.matmul_kind().unwrap_or(cfg.dtype.kind()).elt_size_in_bytes() as u64,
        trainable,
        adapter_per_token: per_adapted_layer * adapted / model.layers.max(1),
        adapter_casts: casts_per_adapted_layer * adapted / model.layers.max(1),
        reference_copy: adapters.kind == AdapterKind::Full,
        decoders: routing::eval_modes(adapters).len() as u64,
        decoder_bytes: decoder_bytes(cfg, model, device),
        extra_gradients: cfg.split_moment,
        samples_ahead: cfg.samples_ahead(),
        head_chunk_rows: crate::engine::HEAD_CHUNK_ROWS as u64,
    }
}

/// [`ModelShape::decoder_bytes`] of the run's decoders on `device`.
fn decoder_bytes(cfg: &TrainConfig, model: &ModelShape, device: Device) -> u64 {
    use crate::model::decode::DecodeModel;
    let kind = cfg.dtype.kind();
    let bytes = |model_kind| DecodeModel::sampling_kind(model_kind, cfg.sampler_dtype).elt_size_in_bytes() as u64;
    // The native sampler serves float32 models only, its matrices in the sampling dtype.
    let native = DecodeModel::native_available(device, kind).then(|| bytes(tch::Kind::Float));
    model.decoder_bytes(bytes(kind), native)
}

/// The memory the run may use beyond its weights: `max_memory` less the weights, or what the
/// device has available now (the weights are loaded) shared among the pack's `runs`.
pub fn budget(cfg: &TrainConfig, weights: u64, device: Device, runs: usize) -> Result<Budget> {
    if let Some(max) = &cfg.max_memory {
        return Ok(Budget { bytes: max.bytes.saturating_sub(weights), source: format!("max_memory {max} less the weights") });
    }
    let (available, what) = match device {
        Device::Cuda(index) => (free_cuda_memory(index)?, format!("free memory of cuda:{index}")),
        _ => (available_ram()?, "MemAvailable".to_string()),
    };
    let shared = if runs > 1 { format!(", shared by {runs} packed runs") } else { String::new() };
    Ok(Budget { bytes: available / runs.max(1) as u64, source: format!("{what} {}{shared}", gb(available)) })
}

/// Before the first step: with `gradient_accumulation_steps: auto`, records the planned
/// micro-batches in `cfg` (a resumed run keeps its record) or refuses, naming the figures; with
/// a number, says whether the step is estimated to fit. Returns train.log's line.
pub fn plan_run(cfg: &mut TrainConfig, step: &StepShape, estimate: &Estimate, budget: &Budget) -> Result<String> {
    let usable = format!("{} usable ({USABLE_FRACTION} of {})", gb((budget.bytes as f64 * USABLE_FRACTION) as u64 + estimate.weights), budget.source);
    let parts = |rows: u64| {
        format!(
            "weights {}, copies {}, optimizer {}, sampling {}, scoring {}, training {} at {rows} rows",
            gb(estimate.weights), gb(estimate.copies), gb(estimate.optimizer), gb(estimate.sampling), gb(estimate.scoring), gb(estimate.training(rows))
        )
    };
    match (cfg.gradient_accumulation_steps, cfg.planned_micro_batches) {
        (Accumulation::Auto, Some(k)) => {
            let rows = step.rows / k as u64;
            Ok(format!("memory: gradient_accumulation_steps auto, {k} micro-batch(es) of {rows} rows as planned when the run started; estimated peak {} ({}), {usable}", gb(estimate.peak(rows, step.samples_ahead)), parts(rows)))
        }
        (Accumulation::Auto, None) => match plan(estimate, step, budget.bytes, step.rows) {
            Ok(plan) => {
                cfg.planned_micro_batches = Some(plan.micro_batches as usize);
                Ok(format!("memory: gradient_accumulation_steps auto planned {} micro-batch(es) of {} rows; estimated peak {} ({}), {usable}", plan.micro_batches, plan.rows, gb(plan.peak), parts(plan.rows)))
            }
            Err(no_fit) => bail!(
                "gradient_accumulation_steps auto: even {} row(s) per micro-batch need an estimated {} ({}), and {usable}: lower batch_size, num_generations or max_completion_length, free memory, or set max_memory if the figure available is wrong",
                no_fit.rows, gb(no_fit.needed), parts(no_fit.rows)
            ),
        },
        (Accumulation::Steps(k), _) => {
            let rows = step.rows / k as u64;
            let fits = plan(estimate, &StepShape { rows, ..*step }, budget.bytes, 1).is_ok();
            let verdict = match fits {
                true => String::new(),
                false => " -- WARNING: more than is usable; set gradient_accumulation_steps: auto to plan micro-batches that fit".to_string(),
            };
            Ok(format!("memory: gradient_accumulation_steps {k}, micro-batches of {rows} rows; estimated peak {} ({}), {usable}{verdict}", gb(estimate.peak(rows, step.samples_ahead)), parts(rows)))
        }
    }
}

/// What the planner found for a run: its step's shape, the estimate and train.log's line.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    pub step: StepShape,
    pub estimate: Estimate,
    pub line: String,
}

/// [`plan_run`] for the run's loaded `policy` and its prompts (training and evaluation, the
/// longest of which sets the tokens of a row).
pub(super) fn plan_policy(cfg: &mut TrainConfig, policy: &Policy, prompts: &[&[Prompt]], device: Device) -> Result<MemoryPlan> {
    let mut longest = 0;
    for prompt in prompts.iter().flat_map(|p| p.iter()) {
        longest = longest.max(policy.tokenizer().encode(&prompt.text)?.len());
    }
    let model = ModelShape::of(&policy.model().config);
    let trainable = policy.trained_params().iter().map(|(_, t)| t.numel() as u64).sum();
    let step = step_shape(cfg, &model, policy.adapters(), trainable, longest, device);
    let estimate = estimate(&model, &step);
    let line = match (budget(cfg, estimate.weights, device, policy.runs()), cfg.gradient_accumulation_steps) {
        (Ok(budget), _) => plan_run(cfg, &step, &estimate, &budget)?,
        (Err(error), Accumulation::Auto) => return Err(error.context("gradient_accumulation_steps auto plans for the memory available")),
        // A run with a number of micro-batches does not need the figure: the line says why it lacks it.
        (Err(error), Accumulation::Steps(k)) => {
            let rows = step.rows / k as u64;
            format!("memory: gradient_accumulation_steps {k}, micro-batches of {rows} rows; estimated peak {} (the memory available is unknown: {error:#})", gb(estimate.peak(rows, step.samples_ahead)))
        }
    };
    let line = match resident() {
        Ok(bytes) => format!("{line} | resident now {}", gb(bytes)),
        Err(error) => format!("{line} | resident now unknown: {error:#}"),
    };
    Ok(MemoryPlan { step, estimate, line })
}

/// The peak resident memory of the step that just ran, for train.log (the process's: in a pack,
/// of all its runs since the first started). A solo run starts a new measurement for the next;
/// where `/proc` cannot be read or reset the line says so.
pub(super) fn step_peak_line(step: usize, runs: usize) -> String {
    let peak = match peak_resident() {
        Ok(peak) => gb(peak),
        Err(error) => return format!("[Step {step}] peak resident memory unknown: {error:#}"),
    };
    if runs > 1 {
        return format!("[Step {step}] peak resident memory of the process ({runs} packed runs): {peak}");
    }
    match reset_peak_resident() {
        Ok(()) => format!("[Step {step}] peak resident memory: {peak}"),
        Err(error) => format!("[Step {step}] peak resident memory since the run started: {peak} ({error:#})"),
    }
}

/// `bytes` as "12.34 GB", or under a gigabyte "123.4 MB".
pub fn gb(bytes: u64) -> String {
    match bytes as f64 >= GB {
        true => format!("{:.2} GB", bytes as f64 / GB),
        false => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

/// The `key:` line of `/proc/self/status`-like `text` in bytes (`VmHWM:  1234 kB`).
pub fn kb_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?;
    let kb: u64 = line[key.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The memory the kernel can give without swapping (`MemAvailable` of `/proc/meminfo`).
pub fn available_ram() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo for the memory available (set max_memory to give the figure)")?;
    kb_field(&text, "MemAvailable").context("/proc/meminfo has no MemAvailable line (set max_memory to give the figure)")
}

/// This process's peak resident memory since it started or since [`reset_peak_resident`]
/// (`VmHWM` of `/proc/self/status`).
pub fn peak_resident() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    kb_field(&text, "VmHWM").context("/proc/self/status has no VmHWM line")
}

/// This process's resident memory now (`VmRSS` of `/proc/self/status`).
pub fn resident() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    kb_field(&text, "VmRSS").context("/proc/self/status has no VmRSS line")
}

/// Starts a new peak-resident measurement (writes `5` to `/proc/self/clear_refs`, Linux 4.0+).
pub fn reset_peak_resident() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("cannot reset the peak resident memory (/proc/self/clear_refs)")
}

/// Free memory of CUDA device `index` as `nvidia-smi` reports it (tch exposes no allocator
/// statistics).
pub fn free_cuda_memory(index: usize) -> Result<u64> {
    // The process's cuda:N is the N-th device CUDA_VISIBLE_DEVICES names (an index or UUID,
    // which nvidia-smi's --id takes), not nvidia-smi's N-th device, on a node that sets it.
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let id = match visible.as_deref().map(|list| list.split(',').map(str::trim).collect::<Vec<_>>()) {
        Some(listed) => listed.get(index).map(|id| id.to_string()).with_context(|| format!("cuda:{index} is not among CUDA_VISIBLE_DEVICES ({}): set max_memory to give the free device memory", visible.as_deref().unwrap_or_default()))?,
        None => index.to_string(),
    };
    let output = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.free", "--format=csv,noheader,nounits", &format!("--id={id}")])
        .output()
        .context("cannot run nvidia-smi to read the free device memory: set max_memory (e.g. 70GB) to give the figure")?;
    ensure!(output.status.success(), "nvidia-smi failed ({}): set max_memory to give the free device memory", String::from_utf8_lossy(&output.stderr).trim());
    let mib: u64 = String::from_utf8_lossy(&output.stdout).trim().parse().context("nvidia-smi's memory.free is not a number: set max_memory to give the free device memory")?;
    Ok(mib * 1024 * 1024)
}

#[cfg(test)]
mod tests;
