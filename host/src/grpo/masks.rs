//! Which tokens train: the loss mask (truncated completions out when masked) and TRL's
//! high-entropy mask of the policy term.

use tch::{Kind, Tensor};

use crate::model::batch::Generation;

/// The completion mask, without the rows that ended without EOS when `mask_truncated` (TRL's
/// `mask_truncated_completions`: their advantages still count in their group's statistics). An
/// episode's row ended without EOS when its last token, its final turn's, is not a stop token,
/// whatever ended an earlier turn (TRL's `ids[-1] not in eos_and_pad` over the whole multi-turn
/// completion).
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

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::loss_mask;
    use crate::model::batch::{CompletionRow, Generation};

    /// An episode is truncated when its last token is not a stop token (TRL 1.16's `is_truncated`,
    /// `ids[-1] not in eos_and_pad`, over the whole multi-turn completion): masked, it leaves the
    /// loss whole; kept, only its model tokens train. Three hand-made episodes (EOS 1, observation
    /// tokens 9): turns that ended, then a final turn that ended (kept); a cut turn, then a cut
    /// final turn (masked); a cut turn, then a final turn that ended (kept: an earlier cut turn
    /// does not make the episode truncated).
    #[test]
    fn masking_truncated_episodes_removes_those_whose_last_turn_was_cut() {
        let transcripts: [&[u32]; 3] = [&[5, 6, 1, 9, 9, 7, 1], &[5, 6, 9, 7, 8], &[5, 6, 9, 7, 1]];
        let model: [&[i64]; 3] = [&[1, 1, 1, 0, 0, 1, 1], &[1, 1, 0, 1, 1, 0, 0], &[1, 1, 0, 1, 1, 0, 0]];
        let padded = |t: &[u32]| (0..7).map(|i| t.get(i).map_or(1, |&id| i64::from(id))).collect::<Vec<i64>>();
        let generation = Generation {
            prompt_ids: Tensor::ones([3, 1], (Kind::Int64, tch::Device::Cpu)),
            prompt_mask: Tensor::ones([3, 1], (Kind::Int64, tch::Device::Cpu)),
            completion_ids: Tensor::from_slice(&transcripts.iter().flat_map(|t| padded(t)).collect::<Vec<i64>>()).view([3, 7]),
            completion_mask: Tensor::from_slice(&transcripts.iter().flat_map(|t| (0..7).map(|i| i64::from(i < t.len()))).collect::<Vec<i64>>()).view([3, 7]),
            sampling_logprobs: Tensor::zeros([3, 7], (Kind::Float, tch::Device::Cpu)),
            kept: None,
            model_mask: Some(Tensor::from_slice(&model.concat()).view([3, 7])),
            rows: transcripts.iter().map(|t| CompletionRow::with_stops(t, &[1])).collect(),
        };
        assert!(loss_mask(&generation, false).equal(&generation.model_tokens()), "unmasked: the model's tokens");
        let expected = Tensor::from_slice(&[1i64, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0]).view([3, 7]);
        assert!(loss_mask(&generation, true).equal(&expected), "{}", loss_mask(&generation, true));
    }
}
