//! The libtorch decoder's draw: HF's logits processors (repetition penalty, temperature, top-k,
//! top-p) and one inverse-CDF draw per row, as tensor ops with no host synchronisation (a CUDA
//! graph records them). The native sampler's twin is `smallrl_native::sampling`.

use tch::{Kind, Tensor};

use smallrl_native::Sampling as SamplingParams;

/// Draws one token per row, applying HF's logits processors in HF's order: repetition penalty
/// on the raw logits, then temperature, top-k and top-p.
pub(super) struct Sampler {
    pub(super) params: SamplingParams,
    /// `[batch, vocab]` tokens seen so far (prompt and completion), for the repetition penalty.
    pub(super) seen: Option<Tensor>,
}

impl Sampler {
    pub(super) fn new(params: &SamplingParams, prompt_ids: &Tensor, prompt_mask: &Tensor, vocab: i64) -> Self {
        let seen = (params.repetition_penalty != 1.0).then(|| {
            let (batch, _) = prompt_ids.size2().expect("prompt ids are 2-d");
            let counts = Tensor::zeros([batch, vocab], (Kind::Int64, prompt_ids.device()));
            counts.scatter_add(1, prompt_ids, &prompt_mask.to_kind(Kind::Int64)).gt(0)
        });
        Self { params: params.clone(), seen }
    }

    pub(super) fn observe(&mut self, token: &Tensor) {
        if let Some(seen) = &mut self.seen {
            let _ = seen.scatter_value_(1, &token.unsqueeze(1), 1);
        }
    }

    /// Returns the drawn tokens `[batch]` (int64), their log-probabilities `[batch]` and, with
    /// `kept_sets` (sampling at temperature > 0), the tokens that survived top-k and top-p
    /// (`[batch, vocab]` bool); `uniforms` (`[batch]`, this step's draw of each row) is `None`
    /// for greedy decoding.
    pub(super) fn draw(&self, logits: &Tensor, uniforms: Option<Tensor>, kept_sets: bool) -> (Tensor, Tensor, Option<Tensor>) {
        let mut scores = logits.to_kind(Kind::Float);
        if let Some(seen) = &self.seen {
            let penalty = self.params.repetition_penalty;
            let penalized = (&scores * penalty).where_self(&scores.lt(0.0), &(&scores / penalty));
            scores = penalized.where_self(seen, &scores);
        }
        if self.params.temperature == 0.0 {
            let token = scores.argmax(-1, false);
            let logprob = scores.log_softmax(-1, Kind::Float).gather(1, &token.unsqueeze(1), false).squeeze_dim(1);
            return (token, logprob, None);
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
        let survivors = kept_sets.then(|| scores.ne(f64::NEG_INFINITY));
        let probs = scores.softmax(-1, Kind::Float);
        let token = inverse_cdf_sample(&probs, &uniforms.expect("sampling at temperature > 0 has uniforms"));
        // A drawn token has a probability well above float32's smallest normal, so the log of
        // the gathered probability is exact enough and avoids a second pass over the vocabulary.
        let logprob = probs.gather(1, &token, false).log().squeeze_dim(1);
        (token.squeeze_dim(1), logprob, survivors)
    }
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
