//! Batched sampling with a KV cache, by one of three engines (see [`Engine`]): on the CPU in
//! float32 the libtorch-free sampler of `native.rs`; elsewhere libtorch ops here, on a CUDA
//! device replayed from CUDA graphs. The libtorch path prefills the left-padded prompts, then
//! runs one step per token for all rows. Rows that produced EOS keep running (the batch shape
//! stays fixed) but emit padding; the host checks for "all finished" only every few steps, so
//! the loop does not wait on the device after each token. Both engines apply HF's logits
//! processors in HF's order and draw each row's tokens from that row's own random stream
//! ([`row_rng`]).

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Kind, Tensor};

use super::batch::completion_rows;
pub use super::batch::{CompletionRow, Generation, left_pad, mask_through_first_eos, masked_rows, row_rng};
use super::batch::{diverged_row, left_pad_to};
use super::cuda_graph::{self, CudaGraph};
use super::decode::{DecodeModel, KvCache, additive_mask, prefill_mask};
use super::native;

/// How tokens are drawn: one definition, shared with the native sampler.
pub use smallrl_native::Sampling as SamplingParams;

/// How often (in tokens) the loop asks whether every row has finished: the only point where
/// it waits for the device, and the length of a captured CUDA graph.
const FINISHED_CHECK_INTERVAL: usize = 8;

/// Decoding from CUDA graphs, the libtorch engine left-pads prompts to a multiple of this width
/// (each run's generation is cut back to its own longest prompt afterwards), so a batch's
/// shape, and with it a captured graph, is reused across steps whose longest prompts differ by
/// a few tokens. Eager decoding pads to the longest prompt only.
const PROMPT_WIDTH_MULTIPLE: usize = 16;

/// Decode shapes whose CUDA graphs a [`DecodeModel`] keeps (beyond this, the least recently used is dropped).
const GRAPHED_SHAPES: usize = 4;

/// Which implementation samples. All compute the same function from the same folded weights
/// and draw the same tokens for the same seed; [`generate`] picks [`Engine::Native`] whenever
/// the model is float32 on the CPU, [`Engine::CudaGraphs`] on a CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Plain Rust loops and `gemm` (`native.rs`): rows split into `threads` independent streams.
    Native { threads: usize },
    /// libtorch ops issued one by one (any device and dtype).
    Libtorch,
    /// The same libtorch ops recorded once per shape as CUDA graphs of
    /// [`FINISHED_CHECK_INTERVAL`] steps and replayed (one launch per chunk instead of a few
    /// hundred per token). Without a CUDA device, or in a binary built without the shim, it
    /// decodes as [`Engine::Libtorch`] and says so once.
    CudaGraphs,
}

/// Samples completions for `prompts` (token ids without special tokens); on the CPU in float32
/// with one stream of rows per libtorch thread.
pub fn generate(model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, seed: u64) -> Result<Generation> {
    let engine = match model.native {
        Some(_) => Engine::Native { threads: tch::get_num_threads().max(1) as usize },
        None if model.device.is_cuda() => Engine::CudaGraphs,
        None => Engine::Libtorch,
    };
    generate_with(engine, model, prompts, params, seed)
}

pub fn generate_with(engine: Engine, model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams, seed: u64) -> Result<Generation> {
    ensure!(model.runs() == 1, "a stacked decoder samples with generate_stacked");
    check_request(model, prompts, params)?;
    match engine {
        Engine::Native { threads } => {
            let native = model.native.as_ref().context("the native sampler needs a float32 model on the CPU")?;
            native::generate(native, prompts, params, seed, threads)
        }
        _ => generate_libtorch(model, &[prompts], params, &[seed], stepping(engine, model))?.pop().expect("one run"),
    }
}

/// Samples every run of a stacked decoder ([`DecodeModel::stacked`]) at once: run `r`'s
/// `prompts[r]` (the same number of prompts for every run) from its own weights with its own
/// `seeds[r]`. Each run's [`Generation`] is the one [`generate_with`] returns for that run's
/// decoder alone (the same tokens; padded to its own longest prompt and completion), computed
/// by one batched decode of all rows. `engine` is [`Engine::Libtorch`] or [`Engine::CudaGraphs`].
/// A run whose weights diverged is an `Err` of its own (the message decoding it alone gives);
/// the other runs are unaffected.
pub fn generate_stacked(engine: Engine, model: &DecodeModel, prompts: &[&[Vec<u32>]], params: &SamplingParams, seeds: &[u64]) -> Result<Vec<Result<Generation>>> {
    ensure!(!matches!(engine, Engine::Native { .. }), "the native sampler decodes one run at a time; stacked runs decode with libtorch");
    ensure!(prompts.len() == model.runs() && seeds.len() == model.runs(), "{} runs stacked, prompts for {} and seeds for {}", model.runs(), prompts.len(), seeds.len());
    ensure!(prompts.iter().all(|p| p.len() == prompts[0].len()), "stacked runs sample the same number of prompts each");
    for run_prompts in prompts {
        check_request(model, run_prompts, params)?;
    }
    generate_libtorch(model, prompts, params, seeds, stepping(engine, model))
}

/// Refuses what no engine can sample.
fn check_request(model: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<()> {
    ensure!(!prompts.is_empty(), "no prompts to sample from");
    ensure!(prompts.iter().all(|p| !p.is_empty()), "empty prompt: every prompt needs at least one token");
    ensure!(params.max_new_tokens > 0, "max_new_tokens must be at least 1");
    ensure!(params.temperature >= 0.0, "temperature must be >= 0");
    ensure!(params.top_p > 0.0 && params.top_p <= 1.0, "top_p must be in (0, 1]");
    ensure!(params.repetition_penalty > 0.0, "repetition_penalty must be > 0");
    let cfg = &model.weights.config;
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

/// How a libtorch `engine` issues its ops on `model`'s device.
fn stepping(engine: Engine, model: &DecodeModel) -> Stepping {
    match engine {
        Engine::CudaGraphs => match cuda_graph::availability(model.device) {
            Ok(()) => Stepping::Graphs,
            Err(reason) => {
                eager_instead_of_graphs(&reason);
                Stepping::Eager
            }
        },
        _ => Stepping::Eager,
    }
}

/// How the libtorch engine issues a step's ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stepping {
    /// Op by op from the host.
    Eager,
    /// Recorded once as CUDA graphs of [`FINISHED_CHECK_INTERVAL`] steps, then replayed.
    Graphs,
}

/// Says once per process why [`Engine::CudaGraphs`] decodes eagerly.
fn eager_instead_of_graphs(reason: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("decoding without CUDA graphs (eager libtorch ops, the same tokens): {reason}"));
}

/// The libtorch engine: every run's rows (one run unless `model` is stacked) left-padded to
/// the longest prompt of all and decoded together; each run's part is then cut back to its own
/// longest prompt and completion, so it is what decoding that run alone gives. A run with a
/// diverged row is an error of its own.
fn generate_libtorch(model: &DecodeModel, prompts: &[&[Vec<u32>]], params: &SamplingParams, seeds: &[u64], stepping: Stepping) -> Result<Vec<Result<Generation>>> {
    let _guard = tch::no_grad_guard();
    let eos = model.weights.config.eos_token_id as i64;
    let rows_per_run = prompts[0].len();
    let all_prompts = prompts.concat();
    let longest = all_prompts.iter().map(Vec::len).max().unwrap_or(0);
    // Graphs: rounded up so that shapes repeat, but never past what the cache may hold
    // (checked per request for `longest`, so the width stays at least `longest`).
    let room = model.weights.config.max_position_embeddings - params.max_new_tokens;
    let width = match stepping {
        Stepping::Graphs => longest.next_multiple_of(PROMPT_WIDTH_MULTIPLE).min(room),
        Stepping::Eager => longest,
    };
    let (prompt_ids, prompt_mask) = left_pad_to(&all_prompts, width, eos, model.device);
    let uniforms = (params.temperature != 0.0).then(|| row_uniforms(seeds, rows_per_run, params.max_new_tokens, model.device));
    let fresh = DecodeState::prefill(model, &prompt_ids, &prompt_mask, params, uniforms);
    let (tokens, logprobs) = match stepping {
        Stepping::Eager => {
            let mut state = fresh;
            let steps = decode(&mut state, |state, n| {
                state.run_steps(model, n);
                Ok(())
            })?;
            state.results(steps)
        }
        Stepping::Graphs => decode_with_graphs(model, fresh)?,
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
            if let Some(row) = diverged[run * rows_per_run..(run + 1) * rows_per_run].iter().position(|&d| d) {
                return Err(diverged_row(row));
            }
            let rows = |t: &Tensor| t.narrow(0, (run * rows_per_run) as i64, rows_per_run as i64);
            let width = run_prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
            let prompt = |t: &Tensor| rows(t).narrow(1, padded_width - width, width).contiguous();
            finish_generation(prompt(&prompt_ids), prompt(&prompt_mask), &rows(&tokens), &rows(&logprobs), eos)
        })
        .collect())
}

/// A run's [`Generation`] from its prompts and the `[rows, steps]` tokens and log-probabilities
/// drawn for them.
fn finish_generation(prompt_ids: Tensor, prompt_mask: Tensor, tokens: &Tensor, logprobs: &Tensor, eos: i64) -> Result<Generation> {
    // Rows stop being checked only every few steps: trim columns that are padding everywhere,
    // so the completion length is that of the longest completion (as TRL pads).
    let completion_mask = mask_through_first_eos(tokens, eos);
    let longest = completion_mask.sum_dim_intlist(1, false, Kind::Int64).max().int64_value(&[]);
    let completion_ids = tokens.narrow(1, 0, longest).contiguous();
    let completion_mask = completion_mask.narrow(1, 0, longest);
    let sampling_logprobs = logprobs.narrow(1, 0, longest).contiguous();
    let rows = completion_rows(&completion_ids, &completion_mask, eos)?;
    Ok(Generation { prompt_ids, prompt_mask, completion_ids, completion_mask, sampling_logprobs, rows })
}

/// Runs the token loop in chunks of [`FINISHED_CHECK_INTERVAL`] steps (`run(state, n)` runs
/// `n` steps) and stops once every row has finished, asking the device only between chunks.
/// Returns the number of steps run.
fn decode(state: &mut DecodeState, mut run: impl FnMut(&mut DecodeState, usize) -> Result<()>) -> Result<usize> {
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
/// Returns the tokens and log-probabilities of the steps run.
fn decode_with_graphs(model: &DecodeModel, fresh: DecodeState) -> Result<(Tensor, Tensor)> {
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
    Ok((tokens.copy(), logprobs.copy()))
}

/// Static buffers and CUDA graphs of one decode shape, kept by the [`DecodeModel`].
pub(super) struct GraphedDecode {
    key: ShapeKey,
    state: DecodeState,
    /// One graph per chunk length.
    graphs: HashMap<usize, CudaGraph>,
}

/// What a captured graph is specific to: batch, prompt length and the sampling settings
/// (which ops a step runs, and the capacity).
#[derive(Debug, Clone, PartialEq)]
struct ShapeKey {
    batch: i64,
    prompt_len: i64,
    params: SamplingParams,
}

/// Everything the token loop reads and writes, in tensors that keep their memory for the whole
/// decode (a CUDA graph replays on the same addresses). The step counter lives on the device,
/// so a step's ops do not depend on the host.
struct DecodeState {
    cache: KvCache,
    /// `[batch, capacity]` additive: 0 for prompt tokens and for each generated slot once
    /// written, -inf for padding and for slots not yet reached.
    key_mask: Tensor,
    /// `[batch, 1]`: the position of each row's next token.
    next_position: Tensor,
    /// `[1]` int64: tokens drawn so far.
    step: Tensor,
    /// `[batch, vocab]`: the logits the next token is drawn from.
    logits: Tensor,
    /// `[batch, max_new_tokens]` drawn tokens (EOS after a row's end) and their log-probs.
    tokens: Tensor,
    logprobs: Tensor,
    /// `[batch]` bool: rows that produced EOS.
    finished: Tensor,
    /// `[max_new_tokens, batch]` float64, `None` for greedy decoding.
    uniforms: Option<Tensor>,
    sampler: Sampler,
    prompt_len: i64,
    eos: i64,
}

impl DecodeState {
    /// Prefills the left-padded prompts and sets up the loop's buffers.
    /// `uniforms` are [`row_uniforms`] (`None` for greedy decoding).
    fn prefill(model: &DecodeModel, prompt_ids: &Tensor, prompt_mask: &Tensor, params: &SamplingParams, uniforms: Option<Tensor>) -> Self {
        let device = model.device;
        let eos = model.weights.config.eos_token_id as i64;
        let (batch, prompt_len) = prompt_ids.size2().expect("prompt ids are [batch, len]");
        let max_new_tokens = params.max_new_tokens as i64;
        let capacity = prompt_len + max_new_tokens;
        let mut cache = model.new_cache(batch, capacity);
        let positions = (prompt_mask.cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let hidden = model.forward(prompt_ids, &positions, &mut cache, 0, &prefill_mask(prompt_mask, capacity));
        Self {
            cache,
            key_mask: additive_mask(&prompt_mask.constant_pad_nd([0, max_new_tokens]).to_kind(Kind::Bool), Kind::Float),
            next_position: prompt_mask.sum_dim_intlist(1, false, Kind::Int64).unsqueeze(1),
            step: Tensor::zeros([1], (Kind::Int64, device)),
            logits: model.logits(&hidden.narrow(1, prompt_len - 1, 1)).squeeze_dim(1).contiguous(),
            tokens: Tensor::full([batch, max_new_tokens], eos, (Kind::Int64, device)),
            logprobs: Tensor::zeros([batch, max_new_tokens], (Kind::Float, device)),
            finished: Tensor::zeros([batch], (Kind::Bool, device)),
            uniforms,
            sampler: Sampler::new(params, prompt_ids, prompt_mask, model.weights.config.vocab_size as i64),
            prompt_len,
            eos,
        }
    }

    fn shape_key(&self) -> ShapeKey {
        ShapeKey { batch: self.finished.size()[0], prompt_len: self.prompt_len, params: self.sampler.params.clone() }
    }

    /// Copies `fresh` (a state of the same shape) into these buffers, keeping their memory.
    fn load(&mut self, fresh: &DecodeState) {
        assert_eq!(self.shape_key(), fresh.shape_key(), "a decode state is reused for its own shape only");
        self.cache.copy_from(&fresh.cache);
        for (to, from) in [
            (&mut self.key_mask, &fresh.key_mask),
            (&mut self.next_position, &fresh.next_position),
            (&mut self.step, &fresh.step),
            (&mut self.logits, &fresh.logits),
            (&mut self.tokens, &fresh.tokens),
            (&mut self.logprobs, &fresh.logprobs),
            (&mut self.finished, &fresh.finished),
        ] {
            to.copy_(from);
        }
        // The key says whether these exist (temperature, repetition penalty), so both or neither do.
        if let (Some(to), Some(from)) = (&mut self.uniforms, &fresh.uniforms) {
            to.copy_(from);
        }
        if let (Some(to), Some(from)) = (&mut self.sampler.seen, &fresh.sampler.seen) {
            to.copy_(from);
        }
    }

    /// Runs `n` decode steps: draw each row's token from the current logits, record it, and
    /// run it through the model for the next logits. Finished rows keep running (the shape
    /// stays fixed) but emit EOS with log-probability 0. Nothing is read back to the host.
    fn run_steps(&mut self, model: &DecodeModel, n: usize) {
        let batch = self.finished.size()[0];
        let step_mask = self.key_mask.view([batch, 1, 1, self.cache.capacity]);
        for _ in 0..n {
            let uniforms = self.uniforms.as_ref().map(|u| u.index_select(0, &self.step).squeeze_dim(0));
            let (token, logprob) = self.sampler.draw(&self.logits, uniforms);
            let token = token.masked_fill(&self.finished, self.eos);
            let _ = self.tokens.index_copy_(1, &self.step, &token.unsqueeze(1));
            let _ = self.logprobs.index_copy_(1, &self.step, &logprob.masked_fill(&self.finished, 0.0).unsqueeze(1));
            let _ = self.finished.logical_or_(&token.eq(self.eos));
            let slot = &self.step + self.prompt_len;
            let _ = self.key_mask.index_fill_(1, &slot, 0.0);
            let hidden = model.forward_at_slot(&token.unsqueeze(1), &self.next_position, &mut self.cache, &slot, &step_mask);
            self.logits.copy_(&model.logits(&hidden).squeeze_dim(1));
            self.next_position += 1;
            self.sampler.observe(&token);
            self.step += 1;
        }
    }

    /// Tokens and log-probabilities of the first `steps` steps (views of the buffers).
    fn results(&self, steps: usize) -> (Tensor, Tensor) {
        (self.tokens.narrow(1, 0, steps as i64), self.logprobs.narrow(1, 0, steps as i64))
    }
}

/// Draws one token per row, applying HF's logits processors in HF's order: repetition penalty
/// on the raw logits, then temperature, top-k and top-p.
struct Sampler {
    params: SamplingParams,
    /// `[batch, vocab]` tokens seen so far (prompt and completion), for the repetition penalty.
    seen: Option<Tensor>,
}

impl Sampler {
    fn new(params: &SamplingParams, prompt_ids: &Tensor, prompt_mask: &Tensor, vocab: i64) -> Self {
        let seen = (params.repetition_penalty != 1.0).then(|| {
            let (batch, _) = prompt_ids.size2().expect("prompt ids are 2-d");
            let counts = Tensor::zeros([batch, vocab], (Kind::Int64, prompt_ids.device()));
            counts.scatter_add(1, prompt_ids, &prompt_mask.to_kind(Kind::Int64)).gt(0)
        });
        Self { params: params.clone(), seen }
    }

    fn observe(&mut self, token: &Tensor) {
        if let Some(seen) = &mut self.seen {
            let _ = seen.scatter_value_(1, &token.unsqueeze(1), 1);
        }
    }

    /// Returns the drawn tokens `[batch]` (int64) and their log-probabilities `[batch]`;
    /// `uniforms` (`[batch]`, this step's draw of each row) is `None` for greedy decoding.
    fn draw(&self, logits: &Tensor, uniforms: Option<Tensor>) -> (Tensor, Tensor) {
        let mut scores = logits.to_kind(Kind::Float);
        if let Some(seen) = &self.seen {
            let penalty = self.params.repetition_penalty;
            let penalized = (&scores * penalty).where_self(&scores.lt(0.0), &(&scores / penalty));
            scores = penalized.where_self(seen, &scores);
        }
        if self.params.temperature == 0.0 {
            let token = scores.argmax(-1, false);
            let logprob = scores.log_softmax(-1, Kind::Float).gather(1, &token.unsqueeze(1), false).squeeze_dim(1);
            return (token, logprob);
        }
        if self.params.temperature != 1.0 {
            scores = scores / self.params.temperature;
        }
        if self.params.top_k > 0 {
            scores = top_k(&scores, self.params.top_k as i64);
        }
        if self.params.top_p < 1.0 {
            scores = top_p(&scores, self.params.top_p);
        }
        let probs = scores.softmax(-1, Kind::Float);
        let token = inverse_cdf_sample(&probs, &uniforms.expect("sampling at temperature > 0 has uniforms"));
        // A drawn token has a probability well above float32's smallest normal, so the log of
        // the gathered probability is exact enough and avoids a second pass over the vocabulary.
        let logprob = probs.gather(1, &token, false).log().squeeze_dim(1);
        (token.squeeze_dim(1), logprob)
    }
}

/// Every uniform number the rollout can use, `[max_new_tokens, rows]` float64 on `device`
/// (step-major, so each step's draws are one contiguous row), for `rows_per_run` rows of each
/// run seeded by `seeds` (one run unless stacked): entry `[t, r * rows_per_run + i]` is the
/// t-th number of row i's own stream of run r ([`row_rng`]), the same numbers in
/// the same order as the native sampler draws them, so all engines draw the same tokens. They
/// are made up front and copied to the device once, so the token loop has no host-to-device
/// copy (on a GPU, one per token was a synchronising copy from pageable memory).
fn row_uniforms(seeds: &[u64], rows_per_run: usize, steps: usize, device: tch::Device) -> Tensor {
    let rows = seeds.len() * rows_per_run;
    let uniforms: Vec<f64> = seeds
        .iter()
        .flat_map(|&seed| (0..rows_per_run).map(move |row| row_rng(seed, row)))
        .flat_map(|mut rng| (0..steps).map(move |_| rng.next_f64()))
        .collect();
    Tensor::from_slice(&uniforms).view([rows as i64, steps as i64]).tr().contiguous().to(device)
}

/// One draw per row from `probs` (`[batch, vocab]`) by inverting the cumulative distribution
/// with a single uniform number per row (`uniforms`, `[batch]` float64 on the same device).
/// libtorch's CPU generator costs about 25 ns per number, so `multinomial` (or Gumbel noise),
/// which draws one per vocabulary entry, took 3-4 ms per step, more than the whole forward
/// pass. The cumulative sum is in float64 so the last bins keep their mass; a token of
/// probability 0 is never drawn (`right = true` picks the first bin whose upper edge exceeds
/// the draw). Returns `[batch, 1]` int64.
fn inverse_cdf_sample(probs: &Tensor, uniforms: &Tensor) -> Tensor {
    let cdf = probs.cumsum(-1, Kind::Double);
    let (batch, vocab) = cdf.size2().expect("probabilities are [batch, vocab]");
    assert_eq!(uniforms.size(), [batch], "one uniform number per row");
    let total = cdf.narrow(1, vocab - 1, 1);
    let draw = uniforms.view([batch, 1]) * total;
    draw.searchsorted(&cdf, false, true, "right", None::<Tensor>).clamp_max(vocab - 1)
}

/// HF `TopKLogitsWarper`: everything below the k-th largest score is removed.
fn top_k(scores: &Tensor, k: i64) -> Tensor {
    let k = k.min(scores.size()[1]);
    let (values, _) = scores.topk(k, -1, true, true);
    let threshold = values.narrow(1, k - 1, 1);
    scores.masked_fill(&scores.lt_tensor(&threshold), f64::NEG_INFINITY)
}

/// HF `TopPLogitsWarper`: removes the least likely tokens whose cumulative probability stays
/// within `1 - top_p`, always keeping the most likely one.
fn top_p(scores: &Tensor, top_p: f64) -> Tensor {
    let (sorted, indices) = scores.sort(-1, false);
    let cumulative = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
    let remove_sorted = cumulative.le(1.0 - top_p);
    let vocab = scores.size()[1];
    let _ = remove_sorted.narrow(1, vocab - 1, 1).fill_(0);
    let remove = remove_sorted.scatter(1, &indices, &remove_sorted);
    scores.masked_fill(&remove, f64::NEG_INFINITY)
}
