//! Rows that continue across calls: a multi-turn episode's next turn appends only the new
//! tokens (the observation) to the KV cache its earlier turns left, at the positions that
//! follow, and samples on from there. No call re-prefills a row's history.
//!
//! Both decoders continue: the native CPU sampler keeps one cache per row
//! (`smallrl_native::Session`: the row's last drawn token is run through the model when it
//! continues); the libtorch decoder keeps one batched cache ([`TorchRows`]) whose slots are
//! not positions: each call's new tokens go, left-padded, into the slots after the last used,
//! and its steps into the slots after those, and a per-row additive key mask says which slots
//! hold the row's own tokens (padding, and the steps a row ran past its stop or its limit, are
//! masked out). RoPE reads each token's position, so the gaps change nothing but the
//! floating-point summation order. A CUDA device decodes continued rows eagerly (their cache
//! grows turn by turn, so no captured graph's shape would repeat).
//!
//! Row `i` of a call draws from `row_rng(seed, i)`, as `generate` draws for the `i`-th prompt:
//! a call's tokens are those `generate` draws over each row's whole sequence as a prompt, up
//! to the summation order.

use anyhow::{Context, Result, ensure};
use tch::{Kind, Tensor};

use super::batch::{diverged_row, left_pad};
use super::decode::{DecodeModel, DecodeState, KvCache, additive_mask};
use super::generate::{Decoder, SamplingParams, check_request, decode, row_uniforms};
use super::native::row_streams;
use smallrl_native::{RowOutput, Session};

/// A row's turn: its tokens through the stop token it ended with (or its limit) and their
/// sampling log-probabilities.
pub type Drawn = (Vec<u32>, Vec<f32>);

/// The rows of one batch of episodes, continued by the model's decoder.
pub enum Continuation {
    Native { session: Session, threads: usize },
    Torch(TorchRows),
}

impl Continuation {
    /// One row per entry of `capacities` (the most positions each will hold), continued by
    /// `decoder` (CUDA graphs decode eagerly here; see the module documentation).
    pub fn new(decoder: Decoder, model: &DecodeModel, capacities: &[usize]) -> Result<Self> {
        ensure!(model.runs() == 1, "a stacked decoder does not continue rows: each packed run decodes its own episodes");
        let longest = capacities.iter().copied().max().unwrap_or(0);
        let limit = model.config().max_position_embeddings;
        ensure!(longest <= limit, "prompt plus episode ({longest} tokens) exceeds max_position_embeddings {limit}");
        Ok(match decoder {
            Decoder::Native { threads } => {
                let native = model.native().context("the native sampler was not built for this decoder")?;
                Continuation::Native { session: Session::new(native.inner(), capacities), threads }
            }
            Decoder::Libtorch | Decoder::CudaGraphs => Continuation::Torch(TorchRows::new(model, capacities.len())),
        })
    }

    /// Appends `pending[i]` to row `rows[i]` (rows in increasing order; a row's first call
    /// brings its prompt) and samples up to `limits[i]` tokens for it with `params` (its
    /// `max_new_tokens` is ignored), row `i` from `row_rng(seed, i)`.
    pub fn continue_rows(&mut self, model: &DecodeModel, rows: &[usize], pending: &[Vec<u32>], limits: &[usize], params: &SamplingParams, seed: u64) -> Result<Vec<Drawn>> {
        ensure!(!params.kept_sets, "sampling replay's kept sets are not recorded for continued rows");
        ensure!(!rows.is_empty() && rows.len() == pending.len() && rows.len() == limits.len(), "one pending list and limit per continued row");
        ensure!(limits.iter().all(|&l| l > 0), "every continued row may draw at least one token");
        // The longest turn bounds the call as `max_new_tokens` bounds `generate`'s.
        let params = SamplingParams { max_new_tokens: limits.iter().copied().max().unwrap_or(0), ..params.clone() };
        check_request(model, pending, &params)?;
        match self {
            Continuation::Native { session, threads } => {
                let native = model.native().context("the native sampler was not built for this decoder")?;
                let mut uniforms = row_streams(seed, rows.len());
                let outputs = session.continue_rows(native.inner(), rows, pending, limits, &params, &mut uniforms, *threads);
                outputs.into_iter().enumerate().map(|(i, RowOutput { tokens, logprobs, diverged, .. })| if diverged { Err(diverged_row(i)) } else { Ok((tokens, logprobs)) }).collect()
            }
            Continuation::Torch(torch) => torch.continue_rows(model, rows, pending, limits, &params, seed),
        }
    }

    /// Frees row `row`'s cache where rows have one each (the libtorch batch drops a row when a
    /// call leaves it out).
    pub fn release(&mut self, row: usize) {
        if let Continuation::Native { session, .. } = self {
            session.release(row);
        }
    }
}

/// The libtorch decoder's continued rows (see the module documentation).
pub struct TorchRows {
    cache: KvCache,
    /// `[batch, capacity]` additive: 0 on the slots holding the row's tokens.
    key_mask: Tensor,
    /// `[batch, 1]`: each row's next position.
    next_position: Tensor,
    /// Slots written so far (the same for every row).
    used: i64,
    /// The episodes in the batch, in order.
    rows: Vec<usize>,
    /// Every token of each episode's sequence (for the repetition penalty).
    histories: Vec<Vec<u32>>,
}

impl TorchRows {
    fn new(model: &DecodeModel, episodes: usize) -> Self {
        let device = model.device;
        Self {
            cache: model.new_cache(episodes as i64, 0),
            key_mask: Tensor::zeros([episodes as i64, 0], (Kind::Float, device)),
            next_position: Tensor::zeros([episodes as i64, 1], (Kind::Int64, device)),
            used: 0,
            rows: (0..episodes).collect(),
            histories: vec![Vec::new(); episodes],
        }
    }

    /// `params.max_new_tokens` is the most any row draws (its limit among `limits`).
    fn continue_rows(&mut self, model: &DecodeModel, rows: &[usize], pending: &[Vec<u32>], limits: &[usize], params: &SamplingParams, seed: u64) -> Result<Vec<Drawn>> {
        let _guard = tch::no_grad_guard();
        let device = model.device;
        let width = pending.iter().map(Vec::len).max().unwrap_or(0) as i64;
        self.keep(rows, self.used + width + params.max_new_tokens as i64)?;
        let logits = self.append(model, pending, width);
        for (&row, p) in rows.iter().zip(pending) {
            self.histories[row].extend(p);
        }
        let seen: Vec<Vec<u32>> = rows.iter().map(|&row| self.histories[row].clone()).collect();
        let (seen_ids, seen_mask) = left_pad(&seen, model.config().eos_token_id as i64, device);
        let uniforms = (params.temperature != 0.0).then(|| row_uniforms(&[seed], rows.len(), params.max_new_tokens, device));
        let cache = std::mem::replace(&mut self.cache, model.new_cache(0, 0));
        let key_mask = self.key_mask.shallow_clone();
        let mut state = DecodeState::resume(model, cache, key_mask, self.next_position.copy(), logits, self.used, params, uniforms, (&seen_ids, &seen_mask));
        let ran = decode(&mut state, |state, n| {
            state.run_steps(model, n);
            Ok(())
        })?;
        let (tokens, logprobs) = state.results(ran);
        let tokens = Vec::<Vec<i64>>::try_from(&tokens)?;
        let logprobs = Vec::<Vec<f32>>::try_from(&logprobs.to_kind(Kind::Float))?;
        (self.cache, self.key_mask, _) = state.into_cache();
        let stops = model.config().stop_ids();
        let drawn: Vec<Drawn> = tokens
            .iter()
            .zip(&logprobs)
            .zip(limits)
            .map(|((tokens, logprobs), &limit)| {
                let through_stop = tokens.iter().position(|&t| stops.contains(&(t as u32))).map_or(tokens.len(), |at| at + 1);
                let n = through_stop.min(limit);
                (tokens[..n].iter().map(|&t| t as u32).collect(), logprobs[..n].to_vec())
            })
            .collect();
        if let Some(i) = drawn.iter().position(|(_, lps)| lps.iter().any(|lp| lp.is_nan())) {
            return Err(diverged_row(i));
        }
        self.close_turn(&drawn, rows, ran as i64);
        Ok(drawn)
    }

    /// Keeps only the episodes `rows` in the batch (a subset of those in it, in order) and
    /// grows the cache to `capacity` slots (a copy of the cache, skipped when neither changes).
    fn keep(&mut self, rows: &[usize], capacity: i64) -> Result<()> {
        if rows == self.rows && capacity <= self.cache.capacity {
            return Ok(());
        }
        let index: Vec<i64> = rows
            .iter()
            .map(|row| self.rows.iter().position(|r| r == row).map(|i| i as i64).with_context(|| format!("episode row {row} left the batch earlier or was never in it")))
            .collect::<Result<_>>()?;
        ensure!(index.windows(2).all(|w| w[0] < w[1]), "continued rows must come in increasing order");
        let capacity = capacity.max(self.cache.capacity);
        let index = Tensor::from_slice(&index).to(self.key_mask.device());
        self.cache = self.cache.rows_grown(&index, capacity);
        let grow = capacity - self.key_mask.size()[1];
        let kept = self.key_mask.index_select(0, &index);
        let unused = Tensor::full([rows.len() as i64, grow], f64::NEG_INFINITY, (Kind::Float, kept.device()));
        self.key_mask = Tensor::cat(&[kept, unused], 1);
        self.next_position = self.next_position.index_select(0, &index);
        self.rows = rows.to_vec();
        Ok(())
    }

    /// Runs each row's `pending` tokens (left-padded to `width`) at its next positions into
    /// slots `used..used + width`, attending to its own earlier slots and causally within the
    /// block; returns the logits after each row's last token (`[batch, vocab]`).
    fn append(&mut self, model: &DecodeModel, pending: &[Vec<u32>], width: i64) -> Tensor {
        let device = model.device;
        let (ids, mask) = left_pad(pending, model.config().eos_token_id as i64, device);
        let positions = &self.next_position + (mask.cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let capacity = self.cache.capacity;
        let slots = Tensor::arange(capacity, (Kind::Int64, device)) - self.used;
        let queries = Tensor::arange(width, (Kind::Int64, device)).unsqueeze(1);
        let in_block = slots.unsqueeze(0).ge(0).logical_and(&slots.unsqueeze(0).le_tensor(&queries));
        let real = mask.constant_pad_nd([self.used, capacity - self.used - width]).to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1);
        let history = self.key_mask.eq(0.0).unsqueeze(1).unsqueeze(1);
        let diagonal = slots.unsqueeze(0).eq_tensor(&queries);
        let attend = history.logical_or(&in_block.logical_and(&real)).logical_or(&diagonal);
        let hidden = model.forward(&ids, &positions, &mut self.cache, self.used, &additive_mask(&attend, Kind::Float));
        let _ = self.key_mask.narrow(1, self.used, width).copy_(&additive_mask(&mask.to_kind(Kind::Bool), Kind::Float));
        self.next_position += mask.sum_dim_intlist(1, true, Kind::Int64);
        self.used += width;
        model.logits(&hidden.narrow(1, width - 1, 1)).squeeze_dim(1).contiguous()
    }

    /// After a turn of `ran` steps: each row keeps the slots of the tokens it drew (`drawn`),
    /// masks out the steps it ran past its stop or limit, and moves its next position on by
    /// its tokens only.
    fn close_turn(&mut self, drawn: &[Drawn], rows: &[usize], ran: i64) {
        let device = self.key_mask.device();
        let counts: Vec<i64> = drawn.iter().map(|(tokens, _)| tokens.len() as i64).collect();
        let counts = Tensor::from_slice(&counts).to(device).unsqueeze(1);
        let kept = Tensor::arange(ran, (Kind::Int64, device)).unsqueeze(0).lt_tensor(&counts);
        let _ = self.key_mask.narrow(1, self.used, ran).copy_(&additive_mask(&kept, Kind::Float));
        self.next_position = self.next_position.shallow_clone() + counts;
        self.used += ran;
        for ((tokens, _), &row) in drawn.iter().zip(rows) {
            self.histories[row].extend(tokens);
        }
    }
}
