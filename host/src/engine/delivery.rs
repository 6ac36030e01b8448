//! The weight-delivery check. No sampler decodes from the trainer's own tensors: a run's
//! decoders are refolded from them before each use, the sampler thread decodes from snapshots,
//! a pack from its stacked decoder, CUDA graphs from a decoder's memory. Each copy's
//! fingerprint ([`crate::model::folded::FoldedWeights::fingerprints`]) is held to the policy's
//! weights folded at that moment, so a policy version that never reached its sampler stops the
//! run instead of passing for staleness (verl#7495: an adapter that never reached the sampler
//! looked like staleness for two months).

use anyhow::{Result, bail, ensure};

/// Holds `held` (the fingerprints of the weights `sampler` will decode with) to `expected`
/// (the policy's weights folded now), bit for bit: a diverged policy's NaN weights are
/// delivered too, and the run stops on its loss instead.
pub fn check(held: &[f64], expected: &[f64], sampler: &str) -> Result<()> {
    let bits = |values: &[f64]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    ensure!(
        bits(held) == bits(expected),
        "the weight-delivery check failed: {sampler} holds weights with fingerprint {held:?} where the policy's weights, folded now, have {expected:?}; it would sample with an earlier policy version's weights. This is a bug in smallrl: please report it with the run's config.yaml"
    );
    Ok(())
}

/// The check of what `DecodeModel::deliver` found: its fingerprint, or the held and expected
/// fingerprints of a copy that differs from the fold (compared bit for bit, so even equal
/// fingerprints fail).
pub fn delivered(outcome: Result<f64, [Vec<f64>; 2]>, sampler: &str) -> Result<f64> {
    match outcome {
        Ok(fingerprint) => Ok(fingerprint),
        Err([held, expected]) => {
            check(&held, &expected, sampler)?;
            bail!("the weight-delivery check failed: {sampler} holds weights that differ bit for bit from the policy's folded now, with the same fingerprint {held:?}. This is a bug in smallrl: please report it with the run's config.yaml")
        }
    }
}
