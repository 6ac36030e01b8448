//! The importance-sampling correction (`importance_sampling_correction`, TRL's
//! `vllm_importance_sampling_correction`) against TRL 1.16's own code on the same tensors:
//! `scripts/reference/trl_is_correction.py` executes the two blocks of
//! `GRPOTrainer._generate_and_score_completions` that compute the ratio and log its metrics,
//! unchanged. Compared: the ratio of every mode, with TRL's unset lower bound (ours 0) and with
//! both bounds set, and TRL's `sampling/*` metrics.

mod common;

use common::{python, repo_root};
use smallrl::grpo::{ImportanceSamplingMode, IsCorrection};
use smallrl::model::weights::{read_safetensors, write_safetensors};
use tch::{Device, Kind, Tensor};

const MODES: [ImportanceSamplingMode; 4] =
    [ImportanceSamplingMode::TokenTruncate, ImportanceSamplingMode::TokenMask, ImportanceSamplingMode::SequenceTruncate, ImportanceSamplingMode::SequenceMask];

#[test]
fn every_mode_matches_trls_own_code() {
    // 8 completions of 10 down to 1 loss tokens; the sampler's log-probabilities 0.6 (Gaussian)
    // from the learner's, so that token ratios leave [0.5, 2] and sequence ratios [0.5, 3] on
    // both sides; padding holds values that must never count.
    tch::manual_seed(29);
    let (rows, width) = (8i64, 10i64);
    let lengths = [10i64, 9, 7, 6, 4, 3, 2, 1];
    let mask = Tensor::arange(width, (Kind::Int64, Device::Cpu)).unsqueeze(0).lt_tensor(&Tensor::from_slice(&lengths).unsqueeze(1)).to_kind(Kind::Int64);
    let keep = mask.to_kind(Kind::Bool);
    let learner = Tensor::randn([rows, width], (Kind::Float, Device::Cpu)) * 0.5 - 2.0;
    let sampler = &learner + Tensor::randn([rows, width], (Kind::Float, Device::Cpu)) * 0.6;
    let (learner, sampler) = (learner.where_self(&keep, &Tensor::from(-30.0f32)), sampler.where_self(&keep, &Tensor::from(30.0f32)));

    let work = tempfile::tempdir().unwrap();
    let inputs = [("old_per_token_logps", &learner), ("sampling_per_token_logps", &sampler), ("completion_mask", &mask)];
    write_safetensors(&work.path().join("inputs.safetensors"), &inputs.map(|(n, t)| (n.to_string(), t.shallow_clone()))).unwrap();
    let corrections: Vec<IsCorrection> = MODES.iter().flat_map(|&mode| [(0.0, 3.0), (0.5, 2.0)].map(|(min, max)| IsCorrection::new(mode, min, max).unwrap())).collect();
    // Our lower bound 0 is TRL's None.
    let cases: Vec<serde_json::Value> = corrections
        .iter()
        .map(|c| serde_json::json!({"mode": c.mode.as_str(), "clip_min": (c.clip_min > 0.0).then_some(c.clip_min), "clip_max": c.clip_max}))
        .collect();
    std::fs::write(work.path().join("cases.json"), serde_json::Value::from(cases).to_string()).unwrap();
    let status = std::process::Command::new(python()).current_dir(repo_root()).arg("scripts/reference/trl_is_correction.py").arg("--dir").arg(work.path()).status().unwrap();
    assert!(status.success(), "trl_is_correction.py failed");

    for (i, correction) in corrections.iter().enumerate() {
        let label = format!("{} [{}, {}]", correction.mode, correction.clip_min, correction.clip_max);
        let mut ratios = read_safetensors(&work.path().join(format!("ratio.{i}.safetensors"))).unwrap();
        let (theirs, float64) = (ratios.remove("ratio").unwrap(), ratios.remove("ratio64").unwrap());
        let ours = correction.ratio(&learner, &sampler, &mask);
        assert_eq!(ours.size(), theirs.size(), "{label}: shapes");
        // Ours within twice TRL's own distance to TRL's code run in float64 (at least 1e-6,
        // relative to max(1, |ratio|)): a float32 exp of a float32 sum of up to ten log-ratio
        // terms, whose rounding follows the processor's code paths. The reference is TRL's own
        // code, so a wrong mode or bound of ours is off by far more; no float32 result is held to
        // another.
        let scale = float64.abs().clamp_min(1.0);
        let relative = |t: &Tensor| ((t.to_kind(Kind::Double) - &float64).abs() / &scale).max().double_value(&[]);
        let (error, trl_error) = (relative(&ours), relative(&theirs));
        let bound = (2.0 * trl_error).max(1e-6);
        assert!(error <= bound, "{label}: ratio {error:.2e} from float64 (relative; bound {bound:.1e}: TRL is {trl_error:.1e} from it){}", common::machine_note());
        // The data must make every mode bind: some ratios at a bound (truncation) or zeroed
        // (masking), on the loss tokens (per token) or completions (per sequence).
        let picked = if correction.mode.per_sequence() { float64.flatten(0, -1) } else { float64.masked_select(&keep) };
        let at = |v: f64| (&picked - v).abs().lt(1e-6).sum(Kind::Int64).int64_value(&[]);
        let binding = match correction.mode {
            ImportanceSamplingMode::TokenTruncate | ImportanceSamplingMode::SequenceTruncate => (at(correction.clip_max), if correction.clip_min > 0.0 { at(correction.clip_min) } else { 1 }),
            _ => (at(0.0), picked.numel() as i64 - at(0.0)),
        };
        assert!(binding.0 > 0 && binding.1 > 0, "{label}: the batch must make the mode bind (counts {binding:?})");

        let stats = correction.stats(&ours, &learner, &sampler, &mask);
        let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(work.path().join(format!("metrics.{i}.json"))).unwrap()).unwrap();
        let pairs = smallrl::train::metrics::importance_sampling_metrics(&stats);
        for (key, ours) in pairs {
            let logged = |which: &str| metrics[which][key].as_f64().unwrap_or_else(|| panic!("{label}: TRL logged no {key} ({which})"));
            let (theirs, float64) = (logged("metrics"), logged("metrics64"));
            let scale = float64.abs().max(1.0);
            let bound = (2.0 * (theirs - float64).abs()).max(1e-6 * scale);
            assert!((ours - float64).abs() <= bound, "{label}: {key} {ours} vs float64 {float64} (bound {bound:.1e}; TRL {theirs}){}", common::machine_note());
        }
        println!("{label}: ratio {error:.1e} from float64 (TRL {trl_error:.1e}), metrics {pairs:?}");
    }
}
