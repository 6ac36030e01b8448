//! Which tokens train: the loss mask (truncated completions out when masked) and TRL's
//! high-entropy mask of the policy term.

use tch::{Kind, Tensor};

use crate::model::batch::Generation;

/// The completion mask, without the rows that ended without EOS when `mask_truncated` (TRL's
/// `mask_truncated_completions`: their advantages still count in their group's statistics).
pub fn loss_mask(generation: &Generation, mask_truncated: bool) -> Tensor {
    // An episode's observation tokens are out (`Generation::model_tokens`).
    let model_tokens = generation.model_tokens();
    if !mask_truncated {
        return model_tokens;
    }
    let ended: Vec<i64> = generation.rows.iter().map(|r| i64::from(r.ended_with_eos)).collect();
    let ended = Tensor::from_slice(&ended).to(generation.completion_mask.device());
    model_tokens * ended.unsqueeze(1)
}

/// The loss tokens whose entropy is at least the `1 - top_quantile` quantile of the loss
/// tokens' entropies (linear interpolation, `torch.quantile`): TRL's `get_high_entropy_mask`
/// ("Beyond the 80/20 Rule": only the highest-entropy tokens' policy term trains). Float
/// `[batch, len]`, all zeros without loss tokens.
pub fn high_entropy_mask(entropy: &Tensor, loss_mask: &Tensor, top_quantile: f64) -> Tensor {
    let mask = loss_mask.to_kind(Kind::Bool);
    let values = entropy.detach().to_kind(Kind::Float).masked_select(&mask);
    if values.numel() == 0 {
        return entropy.zeros_like().to_kind(Kind::Float);
    }
    let threshold = values.quantile_scalar(1.0 - top_quantile, None::<i64>, false, "linear");
    (entropy.detach() * mask.to_kind(Kind::Float)).ge_tensor(&threshold).logical_and(&mask).to_kind(Kind::Float)
}

/// The token masks of the loss: `loss` is 1 on the tokens that train and count in the
/// aggregation (the completion mask, without truncated completions when they are masked);
/// `policy`, when set, further restricts the policy term (not the KL term, not the
/// aggregation's counts) to its tokens, as TRL's entropy mask does.
#[derive(Clone, Copy)]
pub struct TokenMasks<'a> {
    pub loss: &'a Tensor,
    pub policy: Option<&'a Tensor>,
}

impl<'a> From<&'a Tensor> for TokenMasks<'a> {
    fn from(loss: &'a Tensor) -> Self {
        Self { loss, policy: None }
    }
}
