//! The experimental-protocol knobs, applied by the host with a seeded RNG so a
//! run resumed at a step draws exactly what the original run drew.

use anyhow::{Result, ensure};

use crate::rng::SplitMix64;

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
            eligibility: uniforms(seed ^ ELIGIBILITY_STREAM, samples),
            label: uniforms(seed ^ LABEL_STREAM, samples),
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

fn uniforms(seed: u64, count: usize) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..count).map(|_| rng.next_f64()).collect()
}
