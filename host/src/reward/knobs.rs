//! The experimental-protocol knobs (reference §4), applied by the host with a seeded RNG so a
//! run resumed at a step draws exactly what the original run drew.

use anyhow::{Result, ensure};

/// Host-side protocol knobs. No `Default`: the trainer owns the defaults
/// (false_positive_rate 0, recall 1, rh_eligible_frac 1) and passes them in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProtocolKnobs {
    /// Probability that a clean (unflagged) sample is flagged anyway.
    pub false_positive_rate: f64,
    /// Probability that a truly flagged sample keeps its flag.
    pub recall: f64,
    /// Probability that a sample is eligible for the hackable (`forget`) bonus and for a flag.
    pub rh_eligible_frac: f64,
}

impl ProtocolKnobs {
    pub fn check(&self) -> Result<()> {
        let knobs = [
            ("false_positive_rate", self.false_positive_rate),
            ("recall", self.recall),
            ("rh_eligible_frac", self.rh_eligible_frac),
        ];
        for (name, value) in knobs {
            ensure!((0.0..=1.0).contains(&value), "`{name}` is a probability: it must be in [0, 1], got {value}");
        }
        Ok(())
    }
}

/// The draws of one batch: one eligibility draw and one label draw per sample, always taken
/// whatever the outcome, so every sample's draws depend only on (seed, index).
pub struct Draws {
    eligibility: Vec<f64>,
    label: Vec<f64>,
}

/// Distinct streams for the two kinds of draw (arbitrary odd constants).
const ELIGIBILITY_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;
const LABEL_STREAM: u64 = 0xd1b5_4a32_d192_ed03;

impl Draws {
    pub fn new(seed: u64, samples: usize) -> Self {
        Self {
            eligibility: SplitMix64(seed ^ ELIGIBILITY_STREAM).uniforms(samples),
            label: SplitMix64(seed ^ LABEL_STREAM).uniforms(samples),
        }
    }

    /// `rh_eligible_frac`: sample i is eligible with probability f.
    pub fn eligible(&self, knobs: &ProtocolKnobs) -> Vec<bool> {
        self.eligibility.iter().map(|&u| u < knobs.rh_eligible_frac).collect()
    }

    /// Routing labels from the detector's flags: a true flag survives with probability
    /// `recall`, a clean sample is flagged with probability `false_positive_rate`, and an
    /// ineligible sample is never flagged.
    pub fn labels(&self, knobs: &ProtocolKnobs, detected: &[bool], eligible: &[bool]) -> Vec<bool> {
        let label = |((&u, &flagged), &eligible): ((&f64, &bool), &bool)| {
            let keep_probability = if flagged { knobs.recall } else { knobs.false_positive_rate };
            eligible && u < keep_probability
        };
        self.label.iter().zip(detected).zip(eligible).map(label).collect()
    }
}

/// SplitMix64 (Steele, Lea and Flood 2014), written out instead of depending on `rand`: a
/// dozen lines whose output is fixed by definition (no crate upgrade can change which samples
/// get flagged in a resumed or replicated run) and ample quality for Bernoulli draws.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniforms(mut self, count: usize) -> Vec<f64> {
        (0..count).map(|_| self.next_f64()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // First outputs for seed 0 from the reference C implementation.
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }
}
