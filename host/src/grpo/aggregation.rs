//! How per-token losses add up to the batch's (TRL's `loss_type`), as per-token weights so
//! that `loss = Σ per_token_loss * weights`, with routing's loss classes.

use tch::{Kind, Tensor};

use crate::stats::effective_sample_size;

/// The aggregation of the per-token loss (TRL's `loss_type`; cispo is aggregated as dapo).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    /// Mean over each sequence's tokens, then mean over sequences.
    Grpo,
    /// Sum over tokens / (sequences * max_completion_length).
    DrGrpo { max_completion_length: usize },
    /// Sum over tokens / active tokens of the (global) batch.
    Dapo,
    /// Sum over tokens / active tokens of each micro-batch, averaged over micro-batches.
    Bnpo,
    /// Sum over each sequence's tokens, then mean over sequences (TRL's luspo: a sequence weighs
    /// as many times as it has tokens).
    Luspo,
}

/// Each token's weight in the loss, so that `loss = Σ per_token_loss * weights`: TRL's
/// aggregation of the tokens in `mask` within each class (rows of other classes have weight 0),
/// times the class's share of the batch `n_c / n`, `n` the rows of all classes (a row in none,
/// a sample without a score, is out of the loss as if it were not in the batch). With the batch
/// split into `micro_batches` consecutive row chunks (TRL's gradient accumulation), only bnpo
/// changes: TRL normalises it by each micro-batch's own tokens and averages the micro-batches,
/// where dapo and cispo divide by the whole generation batch's tokens (`num_items_in_batch`)
/// and grpo and dr_grpo by row counts that add up to the batch's.
pub fn token_weights(mask: &Tensor, classes: &[Tensor], aggregation: Aggregation, micro_batches: usize) -> Tensor {
    // n: the rows of the classes (every row, unless some are in none: samples without a score),
    // kept on the device so that the loss never waits for a read-back (the counts are exact).
    let batch = classes.iter().fold(Tensor::zeros([], (Kind::Float, mask.device())), |n, class| n + class.to_kind(Kind::Float).sum(Kind::Float));
    let mut weights = mask.zeros_like();
    for class in classes {
        let rows = class.to_kind(Kind::Float);
        let n_class = rows.sum(Kind::Float);
        let class_mask = mask * rows.unsqueeze(1);
        weights = weights + class_weights(&class_mask, &n_class, aggregation, micro_batches) * (n_class / &batch);
    }
    weights
}

/// Kish's effective sample size `(Σw)² / Σw²` of an aggregation's loss weights over the batch:
/// over its tokens, and over its sequences (a sequence weighing the sum of its tokens' weights).
/// The entropy-dynamics study's ESS of Dr-GRPO's weighted loss, for any aggregation. Ratios and
/// advantages aside: it says how evenly the aggregation alone spreads the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightEss {
    pub tokens: f64,
    pub sequences: f64,
}

impl WeightEss {
    /// The ESS of `aggregation`'s weights of the tokens in `mask` (`[rows, tokens]`, one class).
    pub fn of(mask: &Tensor, aggregation: Aggregation, micro_batches: usize) -> Self {
        let rows = mask.size()[0];
        let everyone = Tensor::ones([rows], (Kind::Bool, mask.device()));
        let weights = token_weights(&mask.to_kind(Kind::Float), &[everyone], aggregation, micro_batches);
        Self { tokens: effective_sample_size(&weights), sequences: effective_sample_size(&weights.sum_dim_intlist(1, false, Kind::Float)) }
    }
}

/// The batch's token weights ([`token_weights`], one pass) kept on `rows` only (`[batch]` 0/1):
/// the weights of complementary row sets add up to the batch's for every loss type, so their
/// losses split the batch's. Restricting the classes instead would change the token counts
/// that dapo, bnpo and cispo divide by.
pub fn row_token_weights(mask: &Tensor, classes: &[Tensor], aggregation: Aggregation, rows: &Tensor) -> Tensor {
    token_weights(&mask.to_kind(Kind::Float), classes, aggregation, 1) * rows.to_kind(Kind::Float).unsqueeze(1)
}

/// TRL's aggregation of one class (`mask` zero outside it; `rows` its sequence count) as
/// per-token weights.
fn class_weights(mask: &Tensor, rows: &Tensor, aggregation: Aggregation, micro_batches: usize) -> Tensor {
    let over_tokens = |mask: &Tensor| mask / mask.sum(Kind::Float).clamp_min(1.0);
    match aggregation {
        Aggregation::Grpo => mask / (mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0) * rows.clamp_min(1.0)),
        Aggregation::DrGrpo { max_completion_length } => mask / (rows.clamp_min(1.0) * max_completion_length as f64),
        Aggregation::Luspo => mask / rows.clamp_min(1.0),
        Aggregation::Dapo => over_tokens(mask),
        Aggregation::Bnpo if micro_batches == 1 => over_tokens(mask),
        Aggregation::Bnpo => {
            let chunks: Vec<Tensor> = mask.chunk(micro_batches as i64, 0).iter().map(|chunk| over_tokens(chunk) / micro_batches as f64).collect();
            Tensor::cat(&chunks, 0)
        }
    }
}
