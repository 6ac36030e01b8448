//! The CPU sampler of the `smallrl-native` crate fed with the folded weights ([`FoldedWeights`])
//! that the libtorch decoder runs on.
//!
//! Invariant: the native model is a copy of the folded weights the libtorch decoder runs on
//! (adapters merged, attention scale and `rotate_half` folded into the fused projection), so
//! both decoders share every modelling decision; where it serves, the libtorch decoder's
//! weights are made from it when asked ([`NativeModel::folded`]); `tests/model.rs` holds this path to transformers'
//! logits and greedy tokens and to the libtorch path's samples for the same seed.

use anyhow::{Result, ensure};
use smallrl_native::{Dims, Layer, Matrix, Model, QkNorm, RowOutput, UniformStream, Weight};
use tch::Tensor;

use super::batch::{CompletionRow, Generation, diverged_row, left_pad, masked_rows, row_rng};
use super::folded::{FoldedWeights, SamplerDtype, fingerprint, host_values};
use smallrl_native::Sampling as SamplingParams;

/// The CPU copy of [`FoldedWeights`]: float32, its matrices in the sampler's dtype.
pub struct NativeModel(Model);

fn to_vec(t: &Tensor) -> Vec<f32> {
    let flat = t.detach().to_device(tch::Device::Cpu).contiguous().view([-1]);
    Vec::<f32>::try_from(&flat).expect("decoder weights are float32")
}

fn matrix(t: &Tensor, dtype: SamplerDtype) -> Matrix {
    let (inputs, outputs) = t.size2().expect("a decoder weight is 2-d");
    match dtype {
        SamplerDtype::Float32 => Matrix::new(inputs as usize, outputs as usize, to_vec(t)),
        SamplerDtype::Bfloat16 => Matrix::bfloat16(inputs as usize, outputs as usize, &to_vec(t)),
    }
}

impl NativeModel {
    /// The float32 folded weights `d`, the matrices (every projection and the output head)
    /// rounded to bfloat16 with `dtype` bfloat16; embeddings, norms and rotary tables stay float32.
    pub(super) fn new(d: &FoldedWeights, dtype: SamplerDtype) -> Self {
        let matrix = |t: &Tensor| matrix(t, dtype);
        let cfg = &d.config;
        let dims = Dims {
            hidden: cfg.hidden_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            intermediate: cfg.intermediate_size,
            vocab: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            rms_norm_eps: cfg.rms_norm_eps as f32,
            eos: cfg.eos_token_id,
        };
        let layers = d
            .layers
            .iter()
            .map(|l| Layer {
                input_layernorm: to_vec(&l.input_layernorm),
                qkv: matrix(&l.qkv_t),
                o: matrix(&l.o_t),
                post_attention_layernorm: to_vec(&l.post_attention_layernorm),
                gate_up: matrix(&l.gate_up_t),
                down: matrix(&l.down_t),
                qkv_bias: l.qkv_bias.as_ref().map(to_vec),
                qk_norm: l.qk_norm.as_ref().map(|(plain, rotated)| QkNorm { plain: to_vec(plain), rotated: to_vec(rotated) }),
            })
            .collect();
        Self(
            Model::new(dims, to_vec(&d.embed_tokens), layers, to_vec(&d.norm), matrix(&d.head_t), to_vec(&d.cos), to_vec(&d.sin))
                .with_extra_stops(cfg.extra_stop_ids.clone()),
        )
    }
}

impl NativeModel {
    /// Refills these weights from `d`, rounded as [`NativeModel::new`] rounds them and keeping
    /// their memory (`write` false: the test hook of a lost refresh, nothing written), and
    /// returns their fingerprint if they then hold `d`'s values bit for bit (bfloat16 matrices:
    /// `d`'s values rounded); `None` where any value differs. One pass on `threads` threads: each chunk is written, read back, compared and
    /// summed while in cache (`smallrl_native`'s `Model::refill_holding`).
    pub(super) fn refill_certified(&mut self, d: &FoldedWeights, threads: usize, write: bool) -> Option<f64> {
        let tensors = d.run_tensors();
        if !tensors.iter().all(|t| t.kind() == tch::Kind::Float && t.is_contiguous() && t.device() == tch::Device::Cpu) {
            return None;
        }
        let values: Vec<&[f32]> = tensors.into_iter().map(host_values::<f32>).collect();
        self.0.refill_holding(&values, threads, write).map(|sums| fingerprint(sums.into_iter()))
    }

    /// The fingerprint of the weights this sampler reads ([`FoldedWeights::fingerprints`]'s
    /// definition: equal to its folded weights' when it holds them in float32; with bfloat16
    /// matrices, of their rounded values in their panels' order), summed on `threads` threads
    /// (the same bits on any number).
    pub(super) fn fingerprint(&self, threads: usize) -> f64 {
        fingerprint(self.0.weight_sums(threads).into_iter())
    }

    /// The folded weights these values are, in `kind`, shaped as `layout` ([`FoldedWeights::layout`]
    /// of the fold they were refilled from): what a libtorch pass of the same decoder reads. The
    /// values are the fold's bit for bit (bfloat16 matrices: its values rounded, as
    /// `FoldedWeights::to_kind` rounds them), so both decoders sample from the same weights.
    pub(super) fn folded(&self, layout: &FoldedWeights, kind: tch::Kind) -> FoldedWeights {
        let mut weights = self.0.weights().into_iter();
        let mut next = |shape: &Tensor| {
            let values = match weights.next().expect("a native copy with fewer weights than its fold") {
                Weight::Vector(values) => Tensor::from_slice(values),
                Weight::Matrix(m) => Tensor::from_slice(&m.values()),
            };
            values.view(shape.size().as_slice()).to_kind(kind)
        };
        let mut folded = layout.map_run_tensors(&mut next);
        assert!(weights.next().is_none(), "a native copy with more weights than its fold");
        (folded.cos, folded.sin) = (layout.cos.to_kind(kind), layout.sin.to_kind(kind));
        folded
    }

    /// The sampler's model (for `continuation`'s sessions).
    pub(super) fn inner(&self) -> &Model {
        &self.0
    }

    /// Bytes of weights one decode step reads.
    pub fn weight_bytes(&self) -> usize {
        self.0.weight_bytes()
    }
}

/// Samples completions for `prompts` with `threads` independent streams of rows (arguments
/// checked by `generate::generate_with`).
pub fn generate(model: &NativeModel, prompts: &[Vec<u32>], params: &SamplingParams, seed: u64, threads: usize) -> Result<Generation> {
    let mut uniforms = row_streams(seed, prompts.len());
    let outputs = smallrl_native::sample(&model.0, prompts, params, &mut uniforms, threads);
    if let Some(row) = outputs.iter().position(|o| o.diverged) {
        return Err(diverged_row(row));
    }
    let kept_capacity = smallrl_native::kept_capacity(params, model.0.dims().vocab);
    if let (Some(row), Some(capacity)) = (outputs.iter().position(|o| o.kept_overflow), kept_capacity) {
        return Err(super::batch::kept_overflow(row, capacity, params));
    }
    Ok(assemble(prompts, &outputs, model.0.dims().eos, &model.0.stop_ids(), kept_capacity))
}

/// The uniform streams of rows `0..rows` drawn from `seed` (`batch::row_rng`), as the native
/// sampler reads them.
pub(super) fn row_streams(seed: u64, rows: usize) -> Vec<UniformStream> {
    (0..rows)
        .map(|row| {
            let mut rng = row_rng(seed, row);
            Box::new(move || rng.next_f64()) as UniformStream
        })
        .collect()
}

/// Builds the padded tensors of a [`Generation`] from the rows' outputs, as the libtorch path
/// lays them out: completions right-padded with EOS to the longest, mask through the first EOS,
/// log-probabilities 0 on padding.
fn assemble(prompts: &[Vec<u32>], outputs: &[RowOutput], eos: u32, stops: &[u32], kept_capacity: Option<usize>) -> Generation {
    let (prompt_ids, prompt_mask) = left_pad(prompts, eos as i64, tch::Device::Cpu);
    let batch = outputs.len();
    let longest = outputs.iter().map(|o| o.tokens.len()).max().unwrap_or(0);
    let mut ids = vec![eos as i64; batch * longest];
    let mut mask = vec![0i64; batch * longest];
    let mut logprobs = vec![0f32; batch * longest];
    for (row, out) in outputs.iter().enumerate() {
        for (t, (&token, &logprob)) in out.tokens.iter().zip(&out.logprobs).enumerate() {
            ids[row * longest + t] = token as i64;
            mask[row * longest + t] = 1;
            logprobs[row * longest + t] = logprob;
        }
    }
    let shape = [batch as i64, longest as i64];
    // Kept sets `[batch, longest, capacity]`, EOS on padding (masked, never read).
    let kept = kept_capacity.map(|capacity| {
        let mut kept = vec![eos as i64; batch * longest * capacity];
        for (row, out) in outputs.iter().enumerate() {
            let start = row * longest * capacity;
            kept[start..start + out.kept.len()].iter_mut().zip(&out.kept).for_each(|(to, &id)| *to = id as i64);
        }
        Tensor::from_slice(&kept).view([batch as i64, longest as i64, capacity as i64])
    });
    let rows = outputs.iter().map(|o| CompletionRow::with_stops(&o.tokens, stops)).collect();
    Generation {
        prompt_ids,
        prompt_mask,
        completion_ids: Tensor::from_slice(&ids).view(shape),
        completion_mask: Tensor::from_slice(&mask).view(shape),
        sampling_logprobs: Tensor::from_slice(&logprobs).view(shape),
        kept,
        model_mask: None,
        rows,
    }
}

/// Log-probabilities of each completion token of `generation` under `native`'s weights, with
/// logits divided by `temperature`: `[batch, completion_len]`, 0 after each row's first EOS.
/// The same function as `engine::frozen_logprobs` on the policy's scoring path (positions
/// `0..T` over the left-padded batch): RoPE depends only on relative positions and padding is
/// masked, so the two differ by float rounding only (about 1e-5).
pub fn frozen_logprobs(native: &NativeModel, generation: &Generation, temperature: f64, threads: usize) -> Result<Tensor> {
    let prompts = masked_rows(&generation.prompt_ids, &generation.prompt_mask)?;
    let completions = masked_rows(&generation.completion_ids, &generation.completion_mask)?;
    let sequences: Vec<(Vec<u32>, usize)> = prompts
        .into_iter()
        .zip(&completions)
        .map(|(prompt, completion)| {
            let start = prompt.len();
            (prompt.into_iter().chain(completion.iter().copied()).collect(), start)
        })
        .collect();
    let dims = native.0.dims();
    ensure!(sequences.iter().all(|(s, _)| s.len() <= dims.max_positions), "a sequence exceeds max_position_embeddings {}", dims.max_positions);
    let scored = smallrl_native::score(&native.0, &sequences, temperature as f32, threads);
    let (batch, width) = generation.completion_ids.size2()?;
    let mut values = vec![0f32; (batch * width) as usize];
    for (row, logprobs) in scored.iter().enumerate() {
        values[row * width as usize..][..logprobs.len()].copy_from_slice(logprobs);
    }
    Ok(Tensor::from_slice(&values).view([batch, width]))
}
