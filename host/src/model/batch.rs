//! What both samplers produce and share: a [`Generation`] (padded tensors for the trainer, rows
//! for people and rewards), padding and masks, and each row's random stream.
//!
//! Architecture invariant: `generate.rs` (libtorch) and `native.rs` (the CPU sampler) lay out a
//! generation the same way through these functions, and draw row `r`'s tokens from
//! [`row_rng`]`(seed, r)` whatever the engine or thread split.

use anyhow::Result;
use tch::{Kind, Tensor};

use crate::rng::SplitMix64;

/// A sampled batch, as tensors (for the trainer) and per row (for people and rewards).
pub struct Generation {
    /// `[batch, prompt_len]`, left-padded with the pad id (= EOS id).
    pub prompt_ids: Tensor,
    pub prompt_mask: Tensor,
    /// `[batch, completion_len]`, right-padded; `completion_len` is the longest completion.
    pub completion_ids: Tensor,
    /// 1 on every token up to and including the first EOS.
    pub completion_mask: Tensor,
    /// Log-probability of each sampled token under the sampling distribution (0 on padding).
    pub sampling_logprobs: Tensor,
    /// Sampling replay: `[batch, completion_len, k]` int64, each token's kept set (the ids that
    /// survived top-k and top-p, padded with the token itself; the pad id on padding), when the
    /// sampler recorded them (`SamplingParams::kept_sets` with truncation).
    pub kept: Option<Tensor>,
    /// Multi-turn episodes (issue 48): `[batch, completion_len]` int64, 1 on the model's own
    /// tokens and 0 on the observation tokens an environment put between its turns (which
    /// `completion_mask` keeps, as the model attends to them). None: every completion token is
    /// the model's. Only the model's tokens carry a loss, a ratio, a KL or an entropy term.
    pub model_mask: Option<Tensor>,
    pub rows: Vec<CompletionRow>,
}

/// The error of a row whose kept set outgrew its bound (`smallrl_native::kept_capacity`).
pub fn kept_overflow(row: usize, capacity: usize, params: &smallrl_native::Sampling) -> anyhow::Error {
    let bound = match params.top_k {
        0 => format!("{} ids, the bound of sampling replay when only top_p truncates (TOP_P_KEPT_BOUND)", smallrl_native::TOP_P_KEPT_BOUND),
        k => format!("{capacity} ids (2 * top_k {k}: ties with the k-th score)"),
    };
    anyhow::anyhow!(
        "row {row}: a token's kept set (the tokens that survive top_k/top_p) holds more than {bound}: set top_k (at most {}) so that sampling replay has a bound, or `sampling_replay: trl_1_16` (docs/src/objectives.md, \"Sampling replay\")",
        smallrl_native::TOP_P_KEPT_BOUND / 2
    )
}

impl Generation {
    /// The rows of `self` then `other` as one generation (sampled separately, e.g. at other
    /// adapter scales): prompts left-padded and completions right-padded with `pad` to the
    /// wider of the two, masks and sampling log-probabilities 0 on the new padding.
    pub fn concat(self, other: Generation, pad: i64) -> Generation {
        let widest = |a: &Tensor, b: &Tensor| a.size()[1].max(b.size()[1]);
        let (prompt_width, completion_width) = (widest(&self.prompt_ids, &other.prompt_ids), widest(&self.completion_ids, &other.completion_ids));
        let left = |a: &Tensor, b: &Tensor, value: f64| Tensor::cat(&[pad_columns(a, prompt_width, value, true), pad_columns(b, prompt_width, value, true)], 0);
        let right = |a: &Tensor, b: &Tensor, value: f64| Tensor::cat(&[pad_columns(a, completion_width, value, false), pad_columns(b, completion_width, value, false)], 0);
        assert_eq!(self.kept.is_some(), other.kept.is_some(), "generations joined are both sampled with kept sets or both without");
        let kept = self.kept.as_ref().zip(other.kept.as_ref()).map(|(a, b)| {
            assert_eq!(a.size()[2], b.size()[2], "kept sets of one capacity");
            Tensor::cat(&[pad_kept(a, completion_width, pad), pad_kept(b, completion_width, pad)], 0)
        });
        let model_mask = match (&self.model_mask, &other.model_mask) {
            (None, None) => None,
            (a, b) => {
                let or_all = |mask: &Option<Tensor>, g: &Generation| mask.as_ref().map_or_else(|| g.completion_mask.ones_like(), Tensor::shallow_clone);
                Some(right(&or_all(a, &self), &or_all(b, &other), 0.0))
            }
        };
        let mut rows = self.rows;
        rows.extend(other.rows);
        Generation {
            prompt_ids: left(&self.prompt_ids, &other.prompt_ids, pad as f64),
            prompt_mask: left(&self.prompt_mask, &other.prompt_mask, 0.0),
            completion_ids: right(&self.completion_ids, &other.completion_ids, pad as f64),
            completion_mask: right(&self.completion_mask, &other.completion_mask, 0.0),
            sampling_logprobs: right(&self.sampling_logprobs, &other.sampling_logprobs, 0.0),
            kept,
            model_mask,
            rows,
        }
    }

    /// 1 on the completion tokens the model sampled (`completion_mask` without observation
    /// tokens): the tokens every loss term and statistic counts.
    pub fn model_tokens(&self) -> Tensor {
        match &self.model_mask {
            Some(model) => &self.completion_mask * model,
            None => self.completion_mask.shallow_clone(),
        }
    }

    /// The rows `rows` (in that order) as a generation of their own, padded as before.
    pub fn select_rows(&self, rows: &[usize]) -> Generation {
        let index = Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>()).to(self.prompt_ids.device());
        self.with_rows(|t| t.index_select(0, &index), rows.iter().copied())
    }

    /// Rows `start..start + len` as a generation of their own: views of these tensors.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Generation {
        self.with_rows(|t| t.narrow(0, start as i64, len as i64), start..start + len)
    }

    /// The generation of `rows`, its tensors' rows taken by `pick`.
    fn with_rows(&self, pick: impl Fn(&Tensor) -> Tensor, rows: impl Iterator<Item = usize>) -> Generation {
        Generation {
            prompt_ids: pick(&self.prompt_ids),
            prompt_mask: pick(&self.prompt_mask),
            completion_ids: pick(&self.completion_ids),
            completion_mask: pick(&self.completion_mask),
            sampling_logprobs: pick(&self.sampling_logprobs),
            kept: self.kept.as_ref().map(&pick),
            model_mask: self.model_mask.as_ref().map(&pick),
            rows: rows.map(|r| CompletionRow { ids: self.rows[r].ids.clone(), ended_with_eos: self.rows[r].ended_with_eos }).collect(),
        }
    }
}

/// The tensors a [`Generation`] is saved as (under a name prefix), on the CPU.
const SAVED: [&str; 6] = ["prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampling_logprobs", "ended_with_eos"];
/// The kept sets' name, saved only for a batch sampled with them.
const SAVED_KEPT: &str = "kept";
/// The model-token mask's name, saved only for a batch of episodes.
const SAVED_MODEL_MASK: &str = "model_mask";

impl Generation {
    /// Its tensors on the CPU, named `{prefix}{name}`, rows' stops as `ended_with_eos`: what
    /// [`Generation::from_saved`] reads back.
    pub fn to_saved(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let ended = Tensor::from_slice(&self.rows.iter().map(|r| r.ended_with_eos as i64).collect::<Vec<_>>());
        let tensors = [&self.prompt_ids, &self.prompt_mask, &self.completion_ids, &self.completion_mask, &self.sampling_logprobs, &ended];
        let mut saved: Vec<(String, Tensor)> = SAVED.iter().zip(tensors).map(|(name, t)| (format!("{prefix}{name}"), t.to_device(tch::Device::Cpu))).collect();
        if let Some(kept) = &self.kept {
            saved.push((format!("{prefix}{SAVED_KEPT}"), kept.to_device(tch::Device::Cpu)));
        }
        if let Some(model_mask) = &self.model_mask {
            saved.push((format!("{prefix}{SAVED_MODEL_MASK}"), model_mask.to_device(tch::Device::Cpu)));
        }
        saved
    }

    /// The generation [`Generation::to_saved`] wrote under `prefix`, on `device`; each row's
    /// ids are its masked completion without the stop token it ended with.
    pub fn from_saved(saved: &std::collections::BTreeMap<String, Tensor>, prefix: &str, device: tch::Device) -> Result<Generation> {
        let get = |name: &str| saved.get(&format!("{prefix}{name}")).map(|t| t.to_device(device)).ok_or_else(|| anyhow::anyhow!("{prefix}{name} is missing"));
        let (completion_ids, completion_mask) = (get("completion_ids")?, get("completion_mask")?);
        let ended = Vec::<i64>::try_from(get("ended_with_eos")?.to_device(tch::Device::Cpu))?;
        let masked = masked_rows(&completion_ids, &completion_mask)?;
        anyhow::ensure!(masked.len() == ended.len(), "{prefix}: {} rows of completions but {} stop flags", masked.len(), ended.len());
        let rows = masked
            .into_iter()
            .zip(ended)
            .map(|(mut ids, ended)| {
                if ended == 1 {
                    ids.pop();
                }
                CompletionRow { ids, ended_with_eos: ended == 1 }
            })
            .collect();
        // Present exactly when the batch was sampled with kept sets (a run resumes as it started).
        let kept = saved.contains_key(&format!("{prefix}{SAVED_KEPT}")).then(|| get(SAVED_KEPT)).transpose()?;
        let model_mask = saved.contains_key(&format!("{prefix}{SAVED_MODEL_MASK}")).then(|| get(SAVED_MODEL_MASK)).transpose()?;
        Ok(Generation { prompt_ids: get("prompt_ids")?, prompt_mask: get("prompt_mask")?, completion_ids, completion_mask, sampling_logprobs: get("sampling_logprobs")?, kept, model_mask, rows })
    }
}

/// Kept sets `[rows, w, k]` widened to `width` tokens on the right, the new ones all `pad`.
fn pad_kept(kept: &Tensor, width: i64, pad: i64) -> Tensor {
    let (rows, w, k) = kept.size3().expect("kept sets are 3-d");
    match w == width {
        true => kept.shallow_clone(),
        false => Tensor::cat(&[kept.shallow_clone(), Tensor::full([rows, width - w, k], pad, (kept.kind(), kept.device()))], 1),
    }
}

/// `t` `[rows, w]` widened to `width` columns of `value`, on the left or the right.
fn pad_columns(t: &Tensor, width: i64, value: f64, on_left: bool) -> Tensor {
    let (rows, w) = t.size2().expect("generation tensors are 2-d");
    if w == width {
        return t.shallow_clone();
    }
    let fill = Tensor::full([rows, width - w], value, (t.kind(), t.device()));
    Tensor::cat(&if on_left { [fill, t.shallow_clone()] } else { [t.shallow_clone(), fill] }, 1)
}

pub struct CompletionRow {
    /// The sampled ids without the final EOS.
    pub ids: Vec<u32>,
    pub ended_with_eos: bool,
}

/// The error of a sampling call in which row `row` stopped being a distribution, whichever
/// engine sampled it.
pub fn diverged_row(row: usize) -> anyhow::Error {
    anyhow::anyhow!("sampling row {row}: the logits are not a distribution (a NaN or an infinite logit): the weights diverged; lower lr or max_grad_norm")
}

/// The random stream of batch row `row`. One stream per row (not one per batch) makes a row's
/// sample independent of how rows are split across threads.
pub fn row_rng(seed: u64, row: usize) -> SplitMix64 {
    SplitMix64::new(crate::rng::derive(seed, "sample-row", row as u64))
}

/// Left-pads prompts with `pad` into `[batch, longest]` ids and a 0/1 mask.
pub fn left_pad(prompts: &[Vec<u32>], pad: i64, device: tch::Device) -> (Tensor, Tensor) {
    left_pad_to(prompts, prompts.iter().map(Vec::len).max().unwrap_or(0), pad, device)
}

/// Left-pads prompts with `pad` into `[batch, width]` ids and a 0/1 mask (`width` at least the
/// longest prompt).
pub fn left_pad_to(prompts: &[Vec<u32>], width: usize, pad: i64, device: tch::Device) -> (Tensor, Tensor) {
    assert!(prompts.iter().all(|p| p.len() <= width), "a prompt is longer than the padded width {width}");
    let mut ids = Vec::with_capacity(prompts.len() * width);
    let mut mask = Vec::with_capacity(prompts.len() * width);
    for prompt in prompts {
        let padding = width - prompt.len();
        ids.extend(std::iter::repeat_n(pad, padding).chain(prompt.iter().map(|&t| t as i64)));
        mask.extend(std::iter::repeat_n(0i64, padding).chain(std::iter::repeat_n(1, prompt.len())));
    }
    let shape = [prompts.len() as i64, width as i64];
    (Tensor::from_slice(&ids).view(shape).to(device), Tensor::from_slice(&mask).view(shape).to(device))
}

/// 1 on every position up to and including the first EOS of each row, 0 after it.
pub fn mask_through_first_eos(ids: &Tensor, eos: i64) -> Tensor {
    mask_through_first_stop(ids, &[eos])
}

/// 1 on every position up to and including the first stop token (any of `stops`) of each row,
/// 0 after it; with one stop id the same ops as [`mask_through_first_eos`] always had.
pub fn mask_through_first_stop(ids: &Tensor, stops: &[i64]) -> Tensor {
    let (first, rest) = stops.split_first().expect("at least one stop token");
    let is_stop = rest.iter().fold(ids.eq(*first), |acc, &stop| acc.logical_or(&ids.eq(stop))).to_kind(Kind::Int64);
    let stop_before = is_stop.cumsum(1, Kind::Int64) - &is_stop;
    stop_before.eq(0).to_kind(Kind::Int64)
}

pub(super) fn completion_rows(ids: &Tensor, mask: &Tensor, stops: &[u32]) -> Result<Vec<CompletionRow>> {
    Ok(masked_rows(ids, mask)?.iter().map(|kept| CompletionRow::with_stops(kept, stops)).collect())
}

impl CompletionRow {
    /// A row from its tokens through the first EOS (if any).
    #[cfg(test)]
    pub(crate) fn new(tokens: &[u32], eos: u32) -> Self {
        Self::with_stops(tokens, &[eos])
    }

    /// A row from its kept tokens (the mask already ends them at the first stop token): a
    /// last token that is a stop token (any of `stops`) is dropped from `ids` and recorded as
    /// `ended_with_eos`.
    pub(crate) fn with_stops(tokens: &[u32], stops: &[u32]) -> Self {
        let ended_with_eos = tokens.last().is_some_and(|t| stops.contains(t));
        Self { ids: tokens[..tokens.len() - usize::from(ended_with_eos)].to_vec(), ended_with_eos }
    }
}

/// The tokens of each row where `mask` is 1, in order.
pub fn masked_rows(ids: &Tensor, mask: &Tensor) -> Result<Vec<Vec<u32>>> {
    let ids = Vec::<Vec<i64>>::try_from(ids.to_device(tch::Device::Cpu))?;
    let mask = Vec::<Vec<i64>>::try_from(mask.to_device(tch::Device::Cpu))?;
    Ok(ids.iter().zip(&mask).map(|(ids, mask)| ids.iter().zip(mask).filter(|(_, m)| **m == 1).map(|(&t, _)| t as u32).collect()).collect())
}
