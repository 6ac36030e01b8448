//! Batched sampling with a KV cache, by one of three decoders (see [`Decoder`]): on the CPU in
//! float32 the libtorch-free sampler of `native.rs`; elsewhere libtorch ops here, on a CUDA
//! device replayed from CUDA graphs. The libtorch path prefills the left-padded prompts, then
//! runs one step per token for all rows. Rows that produced EOS keep running (the batch shape
//! stays fixed) but emit padding; the host checks for "all finished" only every few steps, so
//! the loop does not wait on the device after each token. Both decoders apply HF's logits
//! processors in HF's order and draw each row's tokens from that row's own random stream
//! ([`row_rng`]).

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Kind, Tensor};

use super::batch::completion_rows;
pub use super::batch::{CompletionRow, Generation, left_pad, mask_through_first_eos, mask_through_first_stop, masked_rows, row_rng};
use super::batch::{diverged_row, left_pad_to};
use super::cuda_graph::{self, CudaGraph};
use super::decode::{DecodeModel, DecodeState, GraphedDecode};
use super::native;

/// How tokens are drawn: one definition, shared with the native sampler.
pub use smallrl_native::Sampling as SamplingParams;
/// Sampling replay's kept sets: how many ids a token's holds, and the bound without top-k.
pub use smallrl_native::{TOP_P_KEPT_BOUND, kept_capacity};

/// How often (in tokens) the loop asks whether every row has finished: the only point where
/// it waits for the device, and the length of a captured CUDA graph.
const FINISHED_CHECK_INTERVAL: usize = 8;

/// Decoding from CUDA graphs, the libtorch decoder left-pads prompts to a multiple of this width
/// (each run's generation is cut back to its own longest prompt afterwards), so a batch's
/// shape, and with it a captured graph, is reused across steps whose longest prompts differ by
/// a few tokens. Eager decoding pads to the longest prompt only.
const PROMPT_WIDTH_MULTIPLE: usize = 16;

/// Decode shapes whose CUDA graphs a [`DecodeModel`] keeps (beyond this, the least recently used is dropped).
const GRAPHED_SHAPES: usize = 4;

/// Which implementation samples. All compute the same function from the same folded weights
/// and draw the same tokens for the same seed; [`generate`] picks [`Decoder::Native`] whenever
/// the model is float32 on the CPU, [`Decoder::CudaGraphs`] on a CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// Plain Rust loops and `gemm` (`native.rs`): rows split into `threads` independent streams.
    Native { threads: usize },
    /// libtorch ops issued one by one (any device and dtype).
    Libtorch,
    /// The same libtorch ops recorded once per shape as CUDA graphs of
    /// [`FINISHED_CHECK_INTERVAL`] steps and replayed (one launch per chunk instead of a few
    /// hundred per token). Without a CUDA device, or in a binary built without the shim, it
    /// decodes as [`Decoder::Libtorch`] and says so once.
    CudaGraphs,
}

/// Samples completions for `prompts` (token ids without special tokens); on the CPU in float32
/// with one stream of rows per libtorch thread.
pub fn generate(model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, seed: u64) -> Result<Generation> {
    generate_with(default_decoder(model), model, prompts, params, seed)
}

/// The decoder [`generate`] samples `model` with.
pub fn default_decoder(model: &DecodeModel) -> Decoder {
    match model.native {
        Some(_) => Decoder::Native { threads: tch::get_num_threads().max(1) as usize },
        None if model.device.is_cuda() => Decoder::CudaGraphs,
        None => Decoder::Libtorch,
    }
}

pub fn generate_with(decoder: Decoder, model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, seed: u64) -> Result<Generation> {
    ensure!(model.runs() == 1, "a stacked decoder samples with generate_stacked");
    check_request(model, prompts, params)?;
    match decoder {
        Decoder::Native { threads } => {
            let native = model.native.as_ref().with_context(|| {
                DecodeModel::native_refusal(model.device, model.kind).unwrap_or_else(|| "the native sampler was not built".into())
            })?;
            native::generate(native, prompts, params, seed, threads)
        }
        _ => generate_libtorch(model, &[prompts], params, &[seed], stepping(decoder, model))?.pop().expect("one run"),
    }
}

/// Samples every run of a stacked decoder ([`DecodeModel::stacked`]) at once: run `r`'s
/// `prompts[r]` (the same number of prompts for every run) from its own weights with its own
/// `seeds[r]`. Each run's [`Generation`] is the one [`generate_with`] returns for that run's
/// decoder alone (the same tokens; padded to its own longest prompt and completion), computed
/// by one batched decode of all rows. `decoder` is [`Decoder::Libtorch`] or [`Decoder::CudaGraphs`].
/// A run whose weights diverged is an `Err` of its own (the message decoding it alone gives);
/// the other runs are unaffected.
pub fn generate_stacked(decoder: Decoder, model: &DecodeModel, prompts: &[&[Vec<u32>]], params: &SamplingParams, seeds: &[u64]) -> Result<Vec<Result<Generation>>> {
    ensure!(!matches!(decoder, Decoder::Native { .. }), "the native sampler decodes one run at a time; stacked runs decode with libtorch");
    ensure!(prompts.len() == model.runs() && seeds.len() == model.runs(), "{} runs stacked, prompts for {} and seeds for {}", model.runs(), prompts.len(), seeds.len());
    ensure!(prompts.iter().all(|p| p.len() == prompts[0].len()), "stacked runs sample the same number of prompts each");
    for run_prompts in prompts {
        check_request(model, run_prompts, params)?;
    }
    generate_libtorch(model, prompts, params, seeds, stepping(decoder, model))
}

/// Refuses what no decoder can sample.
pub(super) fn check_request(model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<()> {
    ensure!(!prompts.is_empty(), "no prompts to sample from");
    ensure!(prompts.iter().all(|p| !p.is_empty()), "empty prompt: every prompt needs at least one token");
    ensure!(params.max_new_tokens > 0, "max_new_tokens must be at least 1");
    ensure!(params.temperature >= 0.0, "temperature must be >= 0");
    ensure!(params.top_p > 0.0 && params.top_p <= 1.0, "top_p must be in (0, 1]");
    ensure!(params.repetition_penalty > 0.0, "repetition_penalty must be > 0");
    let cfg = model.config();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    ensure!(
        longest + params.max_new_tokens <= cfg.max_position_embeddings,
        "prompt plus completion ({} tokens) exceeds max_position_embeddings {}",
        longest + params.max_new_tokens,
        cfg.max_position_embeddings
    );
    ensure!(prompts.iter().flatten().all(|&t| (t as usize) < cfg.vocab_size), "a prompt token id is outside the vocabulary");
    Ok(())
}

/// How a libtorch `decoder` issues its ops on `model`'s device.
fn stepping(decoder: Decoder, model: &DecodeModel) -> Stepping {
    match decoder {
        Decoder::CudaGraphs => match cuda_graph::availability(model.device) {
            Ok(()) => Stepping::Graphs,
            Err(reason) => {
                eager_instead_of_graphs(&reason);
                Stepping::Eager
            }
        },
        _ => Stepping::Eager,
    }
}

/// How the libtorch decoder issues a step's ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stepping {
    /// Op by op from the host.
    Eager,
    /// Recorded once as CUDA graphs of [`FINISHED_CHECK_INTERVAL`] steps, then replayed.
    Graphs,
}

/// Says once per process why [`Decoder::CudaGraphs`] decodes eagerly.
fn eager_instead_of_graphs(reason: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("decoding without CUDA graphs (eager libtorch ops, the same tokens): {reason}"));
}

/// The libtorch decoder: every run's rows (one run unless `model` is stacked) left-padded to
/// the longest prompt of all and decoded together; each run's part is then cut back to its own
/// longest prompt and completion, so it is what decoding that run alone gives. A run with a
/// diverged row is an error of its own.
fn generate_libtorch(model: &DecodeModel, prompts: &[&[Vec<u32>]], params: &SamplingParams, seeds: &[u64], stepping: Stepping) -> Result<Vec<Result<Generation>>> {
    let _guard = tch::no_grad_guard();
    let eos = model.config().eos_token_id as i64;
    let rows_per_run = prompts[0].len();
    let all_prompts = prompts.concat();
    let longest = all_prompts.iter().map(Vec::len).max().unwrap_or(0);
    // Graphs: rounded up so that shapes repeat, but never past what the cache may hold
    // (checked per request for `longest`, so the width stays at least `longest`).
    let room = model.config().max_position_embeddings - params.max_new_tokens;
    let width = match stepping {
        Stepping::Graphs => longest.next_multiple_of(PROMPT_WIDTH_MULTIPLE).min(room),
        Stepping::Eager => longest,
    };
    let (prompt_ids, prompt_mask) = left_pad_to(&all_prompts, width, eos, model.device);
    let uniforms = (params.temperature != 0.0).then(|| row_uniforms(seeds, rows_per_run, params.max_new_tokens, model.device));
    let fresh = DecodeState::prefill(model, &prompt_ids, &prompt_mask, params, uniforms);
    let (tokens, logprobs, kept) = match stepping {
        Stepping::Eager => {
            let mut state = fresh;
            let steps = decode(&mut state, |state, n| {
                state.run_steps(model, n);
                Ok(())
            })?;
            let (tokens, logprobs) = state.results(steps);
            (tokens, logprobs, state.kept_results(steps))
        }
        Stepping::Graphs => decode_with_graphs(model, fresh)?,
    };
    let kept_overflow = match &kept {
        Some((_, overflow)) => Vec::<bool>::try_from(overflow).context("reading the kept sets' overflow")?,
        None => Vec::new(),
    };
    let padded_width = prompt_ids.size()[1];
    // A row whose logits stop being a distribution (a NaN or an infinite logit: the weights
    // diverged) draws from NaN probabilities, so the log-probability it records for that token is
    // NaN, and a healthy row's never is: one check after the loop, no work per token.
    let diverged = Vec::<bool>::try_from(&logprobs.isnan().any_dim(1, false)).context("reading the diverged rows")?;
    Ok(prompts
        .iter()
        .enumerate()
        .map(|(run, run_prompts)| {
            let run_rows = run * rows_per_run..(run + 1) * rows_per_run;
            if let Some(row) = diverged[run_rows.clone()].iter().position(|&d| d) {
                return Err(diverged_row(row));
            }
            if let Some(row) = kept_overflow.get(run_rows).and_then(|rows| rows.iter().position(|&o| o)) {
                let capacity = smallrl_native::kept_capacity(params, model.config().vocab_size).expect("kept sets were recorded");
                return Err(super::batch::kept_overflow(row, capacity, params));
            }
            let rows = |t: &Tensor| t.narrow(0, (run * rows_per_run) as i64, rows_per_run as i64);
            let width = run_prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
            let prompt = |t: &Tensor| rows(t).narrow(1, padded_width - width, width).contiguous();
            let run_kept = kept.as_ref().map(|(kept, _)| rows(kept));
            finish_generation(prompt(&prompt_ids), prompt(&prompt_mask), &rows(&tokens), &rows(&logprobs), run_kept, &model.config().stop_ids())
        })
        .collect())
}

/// A run's [`Generation`] from its prompts and the `[rows, steps]` tokens and log-probabilities
/// drawn for them (and their `[rows, steps, k]` kept sets, if recorded).
fn finish_generation(prompt_ids: Tensor, prompt_mask: Tensor, tokens: &Tensor, logprobs: &Tensor, kept: Option<Tensor>, stops: &[u32]) -> Result<Generation> {
    // Rows stop being checked only every few steps: trim columns that are padding everywhere,
    // so the completion length is that of the longest completion (as TRL pads).
    let completion_mask = mask_through_first_stop(tokens, &stops.iter().map(|&id| i64::from(id)).collect::<Vec<_>>());
    let longest = completion_mask.sum_dim_intlist(1, false, Kind::Int64).max().int64_value(&[]);
    let completion_ids = tokens.narrow(1, 0, longest).contiguous();
    let completion_mask = completion_mask.narrow(1, 0, longest);
    let sampling_logprobs = logprobs.narrow(1, 0, longest).contiguous();
    let kept = kept.map(|kept| kept.narrow(1, 0, longest).contiguous());
    let rows = completion_rows(&completion_ids, &completion_mask, stops)?;
    Ok(Generation { prompt_ids, prompt_mask, completion_ids, completion_mask, sampling_logprobs, kept, model_mask: None, rows })
}

/// Runs the token loop in chunks of [`FINISHED_CHECK_INTERVAL`] steps (`run(state, n)` runs
/// `n` steps) and stops once every row has finished, asking the device only between chunks.
/// Returns the number of steps run.
pub(super) fn decode(state: &mut DecodeState, mut run: impl FnMut(&mut DecodeState, usize) -> Result<()>) -> Result<usize> {
    let max_new_tokens = state.sampler.params.max_new_tokens;
    let mut steps = 0;
    while steps < max_new_tokens {
        let n = FINISHED_CHECK_INTERVAL.min(max_new_tokens - steps);
        run(state, n)?;
        steps += n;
        if steps < max_new_tokens && state.finished.all().int64_value(&[]) == 1 {
            break;
        }
    }
    Ok(steps)
}

/// The token loop replayed from CUDA graphs: the model keeps one set of static buffers per
/// shape (batch, padded prompt width, sampling settings; the [`GRAPHED_SHAPES`] most recently used)
/// with a graph per chunk length, captured on first use and replayed by later calls; `fresh`
/// (this call's prefilled state) is copied in.
/// Returns the tokens, log-probabilities and kept sets (with their overflow flags) of the steps run.
fn decode_with_graphs(model: &DecodeModel, fresh: DecodeState) -> Result<(Tensor, Tensor, Option<(Tensor, Tensor)>)> {
    let mut shapes = model.graphs.lock().map_err(|_| anyhow::anyhow!("an earlier CUDA-graph decode panicked"))?;
    let key = fresh.shape_key();
    let index = match shapes.iter().position(|graphed| graphed.key == key) {
        Some(index) => {
            // The shape used last goes last: the one evicted is the least recently used.
            let graphed = shapes.remove(index);
            shapes.push(graphed);
            let last = shapes.len() - 1;
            shapes[last].state.load(&fresh);
            last
        }
        None => {
            if shapes.len() == GRAPHED_SHAPES {
                shapes.remove(0);
            }
            shapes.push(GraphedDecode { key, state: fresh, graphs: HashMap::new() });
            shapes.len() - 1
        }
    };
    let GraphedDecode { state, graphs, .. } = &mut shapes[index];
    let steps = decode(state, |state, n| match graphs.get(&n) {
        Some(graph) => graph.replay(),
        None => {
            // Capturing runs the n steps once for real, then records them.
            graphs.insert(n, CudaGraph::run_and_capture(model.device, || state.run_steps(model, n))?);
            Ok(())
        }
    })?;
    // The buffers are overwritten by the next call: the results are copied out.
    let (tokens, logprobs) = state.results(steps);
    let kept = state.kept_results(steps).map(|(kept, overflow)| (kept.copy(), overflow.copy()));
    Ok((tokens.copy(), logprobs.copy(), kept))
}

/// Every uniform number the rollout can use, `[max_new_tokens, rows]` float64 on `device`
/// (step-major, so each step's draws are one contiguous row), for `rows_per_run` rows of each
/// run seeded by `seeds` (one run unless stacked): entry `[t, r * rows_per_run + i]` is the
/// t-th number of row i's own stream of run r ([`row_rng`]), the same numbers in
/// the same order as the native sampler draws them, so all decoders draw the same tokens. They
/// are made up front and copied to the device once, so the token loop has no host-to-device
/// copy (on a GPU, one per token was a synchronising copy from pageable memory).
pub(super) fn row_uniforms(seeds: &[u64], rows_per_run: usize, steps: usize, device: tch::Device) -> Tensor {
    let rows = seeds.len() * rows_per_run;
    let uniforms: Vec<f64> = seeds
        .iter()
        .flat_map(|&seed| (0..rows_per_run).map(move |row| row_rng(seed, row)))
        .flat_map(|mut rng| (0..steps).map(move |_| rng.next_f64()))
        .collect();
    Tensor::from_slice(&uniforms).view([rows as i64, steps as i64]).tr().contiguous().to(device)
}
