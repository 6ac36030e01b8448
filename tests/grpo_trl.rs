//! The GRPO loss and gradients against TRL 1.16's `GRPOTrainer` on the same batch.
//!
//! The policy is `tiny-stories` with small seeded noise on every weight (so KL is not zero),
//! the reference policy is the fixture itself. Completions are sampled by smallrl, rewards are
//! hand-made, and `scripts/reference/trl_grpo.py` runs TRL's own `_generate_and_score_completions`
//! and `compute_loss` on them. Compared: advantages, per-token log-probs, the loss, the
//! gradient of every parameter (full fine-tuning) and the clip fractions TRL logs, for each
//! aggregation and each policy-loss knob (`epsilon_high`, `delta`, sequence ratios,
//! `scale_rewards`, `mask_truncated_completions`, `cispo`, `top_entropy_quantile`, bnpo and
//! dapo under `gradient_accumulation_steps`, and the four modes of TRL's importance-sampling
//! correction against given sampler log-probabilities, with its `sampling/*` metrics; TRL 1.16's
//! `sapo`, `luspo` and `vespo` with their keys and `vespo/phi_seq_mean`, the off-policy sequence
//! mask, the bias-corrected KL and the entropy bonus, static and adaptive, with its
//! `policy_loss` and `entropy_coef`), through the trainer's own forward-and-backward function.
//! GDPO (`multi_objective_aggregation: normalize_then_sum`) is compared with TRL given several
//! reward functions: our advantages come from the run's own recipe on hand-made components
//! (a forget one not counted on an unhackable row, the penalty, the filter), TRL's reward
//! functions are those components written out by their definitions here.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{fixture, one_thread, python, repo_root};
use smallrl::adapters::set_base_trainable;
use smallrl::{engine, grpo};
use smallrl::grpo::MultiObjectiveAggregation;
use smallrl::intervention::Intervention;
use smallrl::reward::{ComponentInfo, Role, ScoredBatch};
use smallrl::train::TrainConfig;
use smallrl::train::metrics::key;
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Generation, SamplingParams, generate};
use smallrl::model::weights::{read_safetensors, write_safetensors};
use smallrl::model::{self, LoadedModel};
use tch::{Device, Kind, Tensor};

const GROUP: usize = 4;

struct Case {
    loss_type: &'static str,
    num_iterations: usize,
    /// Loss settings beyond the defaults, as config keys: `args.json` of `trl_grpo.py` takes
    /// them under the same names (TRL's), so one value sets both sides.
    knobs: serde_json::Value,
}

impl Case {
    fn label(&self) -> String {
        format!("{} (num_iterations {}{})", self.loss_type, self.num_iterations, if self.knobs.as_object().is_some_and(|k| k.is_empty()) { String::new() } else { format!(", {}", self.knobs) })
    }
}

/// One case with our side computed and its batch written for `trl_grpo.py`.
struct Prepared {
    label: String,
    dir: std::path::PathBuf,
    config: TrainConfig,
    settings: grpo::Objective,
    old: Option<Tensor>,
    advantages: Tensor,
    /// GDPO's `frac_reward_zero_std` as the recipe gave it (None for the other cases).
    frac_zero_std: Option<f64>,
    loss_mask: Tensor,
    logprobs: Tensor,
    terms: grpo::LossTerms,
    /// Our gradient of every base parameter.
    ours: BTreeMap<String, Tensor>,
}

fn load_fixture() -> LoadedModel {
    model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap()
}

/// The off-policy mask's threshold on the mean gap `logp_sampler - logp` (the sampler is the policy
/// with 0.1 Gaussian noise per token, so the rows' mean gaps spread around 0 by a few hundredths).
const OFF_POLICY_THRESHOLD: f64 = 0.0;

/// Hand-made rewards: the first group all equal (zero std, advantages 0), the second spread.
const REWARDS: [f32; 2 * GROUP] = [0.5, 0.5, 0.5, 0.5, 0.0, 0.25, 1.0, 0.75];

#[test]
fn loss_and_gradients_match_trl() {
    one_thread();
    let work = tempfile::tempdir().unwrap();
    let policy = common::perturbed_policy(&work.path().join("policy"));
    let reference = load_fixture();
    let tokenizer = &policy.tokenizer;
    let prompts: Vec<Vec<u32>> = ["once upon a time", "the little dog found a red ball and"]
        .iter()
        .flat_map(|p| std::iter::repeat_n(tokenizer.encode(p).unwrap(), GROUP))
        .collect();
    let params = SamplingParams { max_new_tokens: 48, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let g = generate(&DecodeModel::new(&policy.model, &[]), &prompts, &params, 3).unwrap();
    let rewards = Tensor::from_slice(&REWARDS);
    let truncated = g.rows.iter().filter(|r| !r.ended_with_eos).count();
    assert!(truncated > 0 && truncated < prompts.len(), "mask_truncated_completions needs truncated and finished rows ({truncated} truncated)");

    let ref_logprobs = engine::frozen_logprobs(&reference.model, (&g).into(), 1.0, &[]);
    let mut policy_model = policy.model;
    set_base_trainable(&mut policy_model, true);
    let none = || serde_json::json!({});
    let cases = [
        Case { loss_type: "grpo", num_iterations: 1, knobs: none() },
        Case { loss_type: "dr_grpo", num_iterations: 1, knobs: none() },
        Case { loss_type: "dapo", num_iterations: 1, knobs: none() },
        Case { loss_type: "grpo", num_iterations: 2, knobs: none() },
        // The clip's knobs need old log-probs that differ from the current ones (num_iterations 2).
        Case { loss_type: "dapo", num_iterations: 2, knobs: serde_json::json!({"epsilon_high": 0.28, "delta": 1.35}) },
        Case { loss_type: "grpo", num_iterations: 2, knobs: serde_json::json!({"importance_sampling_level": "sequence", "scale_rewards": "batch"}) },
        Case { loss_type: "dapo", num_iterations: 1, knobs: serde_json::json!({"mask_truncated_completions": true, "scale_rewards": "none"}) },
        // A cap of 1.3 binds on the shifted ratios (TRL's recommended 5.0 would not here).
        Case { loss_type: "cispo", num_iterations: 2, knobs: serde_json::json!({"epsilon_high": 1.3}) },
        Case { loss_type: "grpo", num_iterations: 2, knobs: serde_json::json!({"top_entropy_quantile": 0.2345}) },
        // Two micro-batches of one group each (different token counts): TRL's bnpo averages
        // the micro-batches' token means, its dapo divides by the whole batch's tokens.
        Case { loss_type: "bnpo", num_iterations: 1, knobs: serde_json::json!({"gradient_accumulation_steps": 2}) },
        Case { loss_type: "dapo", num_iterations: 1, knobs: serde_json::json!({"gradient_accumulation_steps": 2}) },
        // TRL's importance-sampling correction against the sampler's log-probabilities (`sampler`
        // below): bounds that the token ratios (e^(+-0.1)) and the sequence ratios leave on both sides.
        Case { loss_type: "grpo", num_iterations: 1, knobs: correction("token_truncate", 0.95, 1.05) },
        Case { loss_type: "dapo", num_iterations: 1, knobs: correction("token_mask", 0.95, 1.05) },
        Case { loss_type: "grpo", num_iterations: 1, knobs: correction("sequence_truncate", 0.5, 2.0) },
        Case { loss_type: "dapo", num_iterations: 1, knobs: correction("sequence_mask", 0.0, 2.0) },
        // TRL 1.16's soft losses with their defaults and with keys of their own, and luspo on
        // the sequence ratios it requires.
        Case { loss_type: "sapo", num_iterations: 2, knobs: none() },
        Case { loss_type: "sapo", num_iterations: 2, knobs: serde_json::json!({"sapo_temperature_pos": 0.5, "sapo_temperature_neg": 3.0}) },
        Case { loss_type: "luspo", num_iterations: 2, knobs: serde_json::json!({"importance_sampling_level": "sequence"}) },
        Case { loss_type: "vespo", num_iterations: 2, knobs: none() },
        // VESPO with the per-token correction folded into its weight, and keys of its own.
        Case { loss_type: "vespo", num_iterations: 1, knobs: with(correction("token_truncate", 0.95, 1.05), serde_json::json!({"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5})) },
        // The off-policy mask against the sampler's log-probabilities, and the bias-corrected KL.
        Case { loss_type: "dapo", num_iterations: 1, knobs: serde_json::json!({"off_policy_mask_threshold": OFF_POLICY_THRESHOLD}) },
        Case { loss_type: "grpo", num_iterations: 2, knobs: serde_json::json!({"use_bias_correction_kl": true}) },
        Case { loss_type: "dapo", num_iterations: 2, knobs: serde_json::json!({"use_bias_correction_kl": true, "importance_sampling_level": "sequence"}) },
        // TRL's entropy bonus (its gradient through the head), on the high-entropy tokens only
        // with top_entropy_quantile, and the adaptive control's first step: nothing applied, the
        // coefficient up by delta (the entropy is below a target of 50 nats).
        Case { loss_type: "grpo", num_iterations: 1, knobs: serde_json::json!({"entropy_coef": 0.2}) },
        Case { loss_type: "dapo", num_iterations: 2, knobs: serde_json::json!({"entropy_coef": 0.2, "top_entropy_quantile": 0.2345}) },
        Case { loss_type: "dapo", num_iterations: 1, knobs: serde_json::json!({"entropy_coef": 0.1, "use_adaptive_entropy": true, "entropy_target": 50.0, "entropy_coef_max": 0.5}) },
        // GDPO on two reward functions (the rewards of `gdpo` below), with the penalty as a
        // third and with the filter's rows as TRL's unscorable ones.
        Case { loss_type: "dapo", num_iterations: 1, knobs: serde_json::json!({"multi_objective_aggregation": "normalize_then_sum"}) },
        Case { loss_type: "grpo", num_iterations: 2, knobs: serde_json::json!({"multi_objective_aggregation": "normalize_then_sum", "intervention": "penalty", "rh_penalty": 1.5}) },
        Case { loss_type: "dapo", num_iterations: 2, knobs: serde_json::json!({"multi_objective_aggregation": "normalize_then_sum", "intervention": "filter"}) },
    ];
    // The sampler's log-probabilities: the policy's, 0.1 (Gaussian) off per token, 0 on padding.
    let sampler = tch::no_grad(|| {
        let current = engine::frozen_logprobs(&policy_model, (&g).into(), 1.0, &[]);
        tch::manual_seed(13);
        (&current + current.randn_like() * 0.1) * g.completion_mask.to_kind(Kind::Float)
    });
    let mut prepared = Vec::new();
    for case in cases {
        let label = case.label();
        let mut keys = serde_json::json!({
            "beta": 0.02, "epsilon": 0.2, "loss_type": case.loss_type, "temperature": 1.0,
            "max_completion_length": params.max_new_tokens, "num_generations": GROUP, "num_iterations": case.num_iterations,
        });
        keys.as_object_mut().unwrap().extend(case.knobs.as_object().unwrap().clone());
        let config: TrainConfig = serde_json::from_value(keys.clone()).unwrap();
        let settings = config.objective().unwrap();
        let gdpo = (config.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum).then(|| gdpo(&config, &g));
        let (advantages, _) = match &gdpo {
            Some(gdpo) => (gdpo.advantages.shallow_clone(), gdpo.frac_zero_std),
            None => grpo::group_advantages(&rewards, GROUP, config.scale_rewards, 1e-4),
        };
        let loss_mask = grpo::loss_mask(&g, config.mask_truncated_completions);
        for (_, t) in policy_model.base_tensors() {
            t.shallow_clone().zero_grad();
        }
        // With num_iterations = 2 the second pass sees old log-probs from before an update:
        // shift the current ones by +-0.5 per token so the clip is active on many tokens, and
        // by 0.3 up or down on half the rows so that sequence ratios (where the per-token shifts
        // average out) leave the clip range too.
        let old = (case.num_iterations > 1).then(|| {
            let current = engine::frozen_logprobs(&policy_model, (&g).into(), 1.0, &[]);
            tch::manual_seed(11);
            let per_row: Vec<f32> = (0..prompts.len()).map(|row| [0.3, -0.3, 0.0, 0.0][row % 4]).collect();
            &current + (current.rand_like() - 0.5) + Tensor::from_slice(&per_row).unsqueeze(1)
        });
        let all_rows = vec![Tensor::ones([prompts.len() as i64], (Kind::Float, Device::Cpu))];
        // The trainer's own path: micro-batches, the high-entropy mask, forward and backward.
        let batch = engine::LossBatch {
            seqs: (&g).into(),
            ctl: &[],
            old_logprobs: old.as_ref(),
            ref_logprobs: Some(&ref_logprobs),
            sampling_logprobs: Some(&sampler),
            old_is_sampler: false,
            advantages: &advantages,
            loss_mask: &loss_mask,
            classes: &all_rows,
            entropy_coef: settings.entropy.map(|control| grpo::EntropyController::new(control).applied()),
        };
        let engine::BackwardPass { logprobs, terms } = engine::backward_micro_batches(&policy_model, &batch, 1.0, &settings, config.micro_batches(), &mut |_, _| {});
        if config.top_entropy_quantile < 1.0 {
            assert_entropy_mask_is_stable(&logprobs.entropy, &loss_mask, config.top_entropy_quantile);
        }
        let ours: BTreeMap<String, Tensor> = policy_model.base_tensors().into_iter().map(|(n, t)| (n, t.grad().copy())).collect();

        let dir = work.path().join(format!("case-{}", label.replace([' ', '(', ')', '"', ':', ',', '{', '}'], "")));
        std::fs::create_dir_all(&dir).unwrap();
        let mut batch = vec![
            ("prompt_ids".to_string(), g.prompt_ids.shallow_clone()),
            ("prompt_mask".to_string(), g.prompt_mask.shallow_clone()),
            ("completion_ids".to_string(), g.completion_ids.shallow_clone()),
            ("completion_mask".to_string(), g.completion_mask.shallow_clone()),
            ("rewards".to_string(), gdpo.as_ref().map_or(rewards.shallow_clone(), |g| g.summed.shallow_clone())),
            ("advantages".to_string(), advantages.shallow_clone()),
        ];
        if let Some(gdpo) = &gdpo {
            batch.push(("rewards_per_func".to_string(), gdpo.rewards_per_func.shallow_clone()));
        }
        if let Some(old) = &old {
            batch.push(("old_per_token_logps".to_string(), old * g.completion_mask.to_kind(Kind::Float)));
        }
        batch.push(("sampling_per_token_logps".to_string(), sampler.shallow_clone()));
        write_safetensors(&dir.join("batch.safetensors"), &batch).unwrap();
        let mut args = keys;
        args["model_dir"] = work.path().join("policy").to_str().unwrap().into();
        args["ref_model_dir"] = fixture("tiny-stories").to_str().unwrap().into();
        if let Some(gdpo) = &gdpo {
            args["reward_weights"] = serde_json::json!(gdpo.weights);
        }
        std::fs::write(dir.join("args.json"), args.to_string()).unwrap();
        let frac_zero_std = gdpo.map(|g| g.frac_zero_std);
        prepared.push(Prepared { label, dir, config, settings, old, advantages, frac_zero_std, loss_mask, logprobs: logprobs.logprobs, terms, ours });
    }
    // One Python process for every case: importing torch, transformers and TRL is most of a run.
    let status = std::process::Command::new(python())
        .current_dir(repo_root())
        .arg("scripts/reference/trl_grpo.py")
        .arg("--case-dirs")
        .args(prepared.iter().map(|p| &p.dir))
        .status()
        .unwrap();
    assert!(status.success(), "trl_grpo.py failed (its message above names the case directory)");
    let mut losses = BTreeMap::new();
    for p in prepared {
        let Prepared { label, dir, config, settings, old, advantages, frac_zero_std, loss_mask, logprobs, terms, ours } = p;
        losses.insert(label.clone(), terms.loss.double_value(&[]));
        if let (grpo::Surrogate::Clip { delta: Some(delta), .. }, Some(old)) = (settings.surrogate, &old) {
            let clamped = (&logprobs - old).exp().gt(delta).logical_and(&advantages.lt(0.0).unsqueeze(1)).logical_and(&loss_mask.to_kind(Kind::Bool));
            assert!(clamped.sum(Kind::Int64).int64_value(&[]) > 0, "{label}: delta must clamp some ratios of negative advantage");
        }
        let clipped = match (terms.number(key::CLIP_REGION), terms.number(key::CISPO_CLIP_RATIO)) {
            (Some(region), None) => Some(region),
            (None, Some(capped)) => Some(capped),
            (None, None) => None,
            _ => panic!("{label}: a loss logs TRL's clip fractions, cispo_clip_ratio, or neither (sapo, vespo)"),
        };
        let clip_binds = clipped.is_none_or(|clipped| clipped > 0.05);
        assert!(config.num_iterations == 1 || clip_binds, "{label}: the clip must bind with shifted old log-probs (fraction clipped {clipped:?})");
        if let Some(phi) = terms.number(key::VESPO_PHI_SEQ_MEAN) {
            assert!((phi - 1.0).abs() > 0.02, "{label}: VESPO's weights must move away from 1 (mean {phi})");
        }
        if let Some(threshold) = settings.off_policy_mask_threshold {
            assert_off_policy_mask_drops_some(&label, &logprobs, &sampler, &advantages, &loss_mask, threshold);
        }
        let trl = read_safetensors(&dir.join("trl.safetensors")).unwrap();
        let exact = read_safetensors(&dir.join("exact.safetensors")).unwrap();
        let computed = Computed { loss: &terms.loss, logprobs: &logprobs, advantages: &advantages, grads: &ours };
        compare(&label, &computed, &loss_mask, &trl, &exact);
        if config.micro_batches() == 1 {
            // TRL logs each micro-batch's fractions (averaged when it logs); ours are the batch's.
            compare_clip_fractions(&label, &terms, settings.surrogate, &loss_mask, &dir.join("trl.metrics.json"), &exact);
        }
        if let Some(ours) = frac_zero_std {
            let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("trl.metrics.json")).unwrap()).unwrap();
            assert_eq!(Some(ours), metrics["metrics"]["frac_reward_zero_std"].as_f64(), "{label}: frac_reward_zero_std");
            let spread = Vec::<f64>::try_from(advantages.to_kind(Kind::Double)).unwrap();
            assert!(spread.iter().filter(|a| a.abs() > 0.1).count() >= 5, "{label}: GDPO's advantages must be far from 0 on most rows: {spread:?}");
        }
        if let Some(correction) = settings.correction {
            compare_correction(&label, correction, &terms, &dir.join("trl.metrics.json"), &exact);
        }
        if let Some(control) = settings.entropy {
            compare_entropy_bonus(&label, control, &terms, &dir.join("trl.metrics.json"), &exact);
        }
        compare_with_float64(&label, &ours, &terms.loss, &trl, &exact);
    }
    let micro = |loss_type: &str| losses[&format!("{loss_type} (num_iterations 1, {{\"gradient_accumulation_steps\":2}})")];
    let (bnpo, dapo) = (micro("bnpo"), micro("dapo"));
    println!("two micro-batches: bnpo {bnpo:.9}, dapo {dapo:.9}");
    assert!((bnpo - dapo).abs() > 1e-3 * dapo.abs(), "bnpo and dapo must differ under micro-batching: {bnpo} vs {dapo}");
}

/// GDPO's reward components: a retain one (scale 0.7) and a forget one (scale 1.6), equal across
/// the first group (zero std there) and not counted on row 6, whose prompt does not offer the
/// hack; rows 1 and 6 flagged.
const TASK: [f64; 2 * GROUP] = [0.2, 0.9, 0.4, 0.4, 1.0, 0.0, 0.5, 0.25];
const BONUS: [f64; 2 * GROUP] = [1.0, 1.0, 1.0, 1.0, 0.0, 3.0, 3.0, 1.0];
const HACKABLE: [bool; 2 * GROUP] = [true, true, true, true, true, true, false, true];
const FLAGGED: [bool; 2 * GROUP] = [false, true, false, false, false, false, true, false];

/// A GDPO case: our advantages and TRL's reward functions.
struct Gdpo {
    advantages: Tensor,
    frac_zero_std: f64,
    /// The rewards logged (the weighted sum of the counted components, penalised).
    summed: Tensor,
    /// `[B, K]` TRL's reward functions, NaN where one returns None.
    rewards_per_func: Tensor,
    weights: Vec<f64>,
}

/// Ours through the run's recipe (`TrainConfig::recipe`, `Recipe::prepare`) on a scored batch of
/// the components above. TRL's reward functions written out from the definitions: the task,
/// the bonus with 0 where it does not count, with `penalty` a third, -1 on flagged rows weighted
/// `rh_penalty`, with `filter` None from every function on flagged rows (TRL's unscorable rows).
fn gdpo(config: &TrainConfig, generation: &Generation) -> Gdpo {
    let components = [("task", Role::Retain, 0.7), ("bonus", Role::Forget, 1.6)].map(|(name, role, scale)| ComponentInfo { name: name.into(), role, scale });
    let rows = 2 * GROUP;
    let summed: Vec<f64> = (0..rows).map(|i| 0.7 * TASK[i] + if HACKABLE[i] { 1.6 * BONUS[i] } else { 0.0 }).collect();
    let scored = ScoredBatch {
        reward: summed,
        components: vec![TASK.to_vec(), BONUS.to_vec()],
        is_rh: Some(FLAGGED.to_vec()),
        detector_raw: Some(FLAGGED.to_vec()),
        eligible: vec![true; rows],
        hackable: HACKABLE.to_vec(),
        monitored: vec![true; rows],
        hacked: None,
        metrics: Vec::new(),
        unscored: vec![false; rows],
    };
    let prepared = config.recipe(Device::Cpu, &components).unwrap().prepare(&scored, generation, 0, 1);
    let counted_bonus = (0..rows).map(|i| if HACKABLE[i] { BONUS[i] } else { 0.0 }).collect();
    let (mut columns, mut weights) = (vec![TASK.to_vec(), counted_bonus], vec![0.7, 1.6]);
    match config.intervention {
        Intervention::Routing => {}
        Intervention::Penalty => {
            columns.push(FLAGGED.iter().map(|&f| if f { -1.0 } else { 0.0 }).collect());
            weights.push(config.rh_penalty);
        }
        Intervention::Filter => columns.iter_mut().for_each(|column| (0..rows).filter(|&i| FLAGGED[i]).for_each(|i| column[i] = f64::NAN)),
        other => panic!("no GDPO case with intervention {other}"),
    }
    let k = columns.len() as i64;
    let rewards_per_func = Tensor::from_slice(&columns.concat()).view([k, rows as i64]).transpose(0, 1).contiguous().to_kind(Kind::Float);
    let summed = Tensor::from_slice(&prepared.rewards).to_kind(Kind::Float);
    Gdpo { advantages: prepared.advantages, frac_zero_std: prepared.frac_zero_std, summed, rewards_per_func, weights }
}

/// `top_entropy_quantile`'s mask must be one that float32 rounding cannot change: TRL's
/// entropies and ours differ in the last digits, so no loss token may lie within 1e-4 of the
/// threshold (it would then be kept on one side only). It must keep some tokens and drop some.
fn assert_entropy_mask_is_stable(entropy: &Tensor, loss_mask: &Tensor, top_quantile: f64) {
    let kept = grpo::high_entropy_mask(entropy, loss_mask, top_quantile);
    let values = entropy.to_kind(Kind::Double).masked_select(&loss_mask.to_kind(Kind::Bool));
    let threshold = values.quantile_scalar(1.0 - top_quantile, None::<i64>, false, "linear");
    let margin = (&values - threshold).abs().min().double_value(&[]);
    println!("top_entropy_quantile {top_quantile}: nearest loss token {margin:.2e} from the threshold");
    assert!(margin > 1e-4, "a loss token's entropy is {margin:.1e} from the top_entropy_quantile threshold: float32 rounding could flip it");
    let (kept_count, all) = (kept.sum(Kind::Float).double_value(&[]), values.numel() as f64);
    assert!(kept_count > 0.0 && kept_count < all, "the mask keeps {kept_count} of {all} tokens");
}

/// Our clip fractions against the ones TRL logged for the same batch: counts over the same
/// tokens or completions, so equal up to float32 division, once no ratio lies so near a bound
/// that float32 rounding could put it on either side ([`assert_clip_is_stable`], on the float64
/// ratios): then they hold on every processor. VESPO's mean weight is a float32 function of a
/// 48-token log-ratio sum, held to its float64 value with a bound of twice TRL's own distance
/// to it (at least 1e-5 relative).
fn compare_clip_fractions(label: &str, terms: &grpo::LossTerms, surrogate: grpo::Surrogate, loss_mask: &Tensor, trl_metrics: &Path, exact: &BTreeMap<String, Tensor>) {
    assert_clip_is_stable(label, surrogate, &exact["ratio"], loss_mask);
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(trl_metrics).unwrap()).unwrap();
    let theirs = |key: &str| metrics["metrics"][key].as_f64().unwrap_or_else(|| panic!("{label}: TRL logged no {key}"));
    let fractions = match (terms.metric(key::CLIP_REGION), terms.metric(key::CISPO_CLIP_RATIO)) {
        (Some(_), _) => vec![key::CLIP_LOW, key::CLIP_HIGH, key::CLIP_REGION],
        (None, Some(_)) => vec![key::CISPO_CLIP_RATIO],
        (None, None) => vec![],
    };
    for key in fractions {
        let (ours, float64) = (terms.number(key).expect("logged"), exact[key].double_value(&[]));
        // Counts over the same tokens divided by the same count: exact up to float32 division.
        assert!((ours - float64).abs() <= 1e-6, "{label}: {key} {ours} vs float64 {float64}{}", common::machine_note());
        assert_reference_agrees(label, key, (theirs(key) - float64).abs(), 1e-6);
    }
    if let Some(ours) = terms.number(key::VESPO_PHI_SEQ_MEAN) {
        let (trl, float64) = (theirs("vespo/phi_seq_mean"), exact["vespo/phi_seq_mean"].double_value(&[]));
        let bound = (2.0 * (trl - float64).abs()).max(1e-5 * float64.abs());
        println!("{label}: vespo/phi_seq_mean ours {:.1e} from float64, TRL {:.1e}", (ours - float64).abs(), (trl - float64).abs());
        assert!((ours - float64).abs() <= bound, "{label}: vespo/phi_seq_mean {ours} vs float64 {float64} (bound {bound:.1e}; TRL {trl}){}", common::machine_note());
        assert_reference_agrees(label, "vespo/phi_seq_mean", (trl - float64).abs() / float64.abs(), 1e-3);
    }
    for key in ["clip_ratio/region_mean", "cispo_clip_ratio", "vespo/phi_seq_mean"] {
        let logged = metrics["metrics"].get(key).is_some();
        let ours = terms.metric(key).is_some();
        assert_eq!(ours, logged, "{label}: we log {key}: {ours}, TRL: {logged}");
    }
}

/// No counted ratio (float64, per token or per completion) within 1e-4 of a clip bound: float32
/// rounding (about 1e-6 here) cannot move a token across it, so the fractions are
/// machine-independent counts.
fn assert_clip_is_stable(label: &str, surrogate: grpo::Surrogate, ratio: &Tensor, loss_mask: &Tensor) {
    let bounds = match surrogate {
        grpo::Surrogate::Clip { low, high, .. } => vec![1.0 - low, 1.0 + high],
        grpo::Surrogate::Cispo { cap } => vec![cap],
        _ => return,
    };
    let ratios = match ratio.size()[1] {
        1 => ratio.flatten(0, -1),
        _ => ratio.masked_select(&loss_mask.to_kind(Kind::Bool)),
    };
    for bound in bounds {
        let margin = (&ratios - bound).abs().min().double_value(&[]);
        assert!(margin > 1e-4, "{label}: a ratio lies {margin:.1e} from the clip bound {bound}: float32 rounding could flip its count; change the test's seeds");
    }
}

/// The off-policy mask must drop some completions with a negative advantage and keep the rest
/// (the gap of each row, `mean_t(logp_sampler - logp)`, computed here from its definition).
fn assert_off_policy_mask_drops_some(label: &str, logprobs: &Tensor, sampler: &Tensor, advantages: &Tensor, mask: &Tensor, threshold: f64) {
    let mask = mask.to_kind(Kind::Double);
    let gaps = ((sampler.to_kind(Kind::Double) - logprobs.to_kind(Kind::Double)) * &mask).sum_dim_intlist(1, false, Kind::Double) / mask.sum_dim_intlist(1, false, Kind::Double);
    let gaps = Vec::<f64>::try_from(gaps).unwrap();
    let advantages = Vec::<f64>::try_from(advantages.to_kind(Kind::Double)).unwrap();
    let dropped = gaps.iter().zip(&advantages).filter(|(gap, a)| **a < 0.0 && **gap > threshold).count();
    println!("{label}: mean gaps {gaps:.4?}, {dropped} rows dropped");
    assert!(dropped > 0 && dropped < gaps.len(), "{label}: the off-policy mask drops {dropped} of {} rows", gaps.len());
}

/// `a`'s keys and `b`'s in one JSON object.
fn with(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    a.as_object_mut().unwrap().extend(b.as_object().unwrap().clone());
    a
}

/// The knobs of TRL's importance-sampling correction (smallrl's names; `trl_grpo.py` passes
/// them to TRL as `vllm_importance_sampling_*`, a lower bound 0 as TRL's None).
fn correction(mode: &str, clip_min: f64, clip_max: f64) -> serde_json::Value {
    serde_json::json!({"importance_sampling_correction": true, "importance_sampling_mode": mode, "importance_sampling_clip_min": clip_min, "importance_sampling_clip_max": clip_max})
}

/// The correction's `sampling/*` metrics against their float64 values (the float64 pass's
/// log-probabilities against the same sampler's), within twice TRL's own distance to them (at
/// least 1e-5 relative: a token's float32 log-probability is about 1e-6 off, a sequence's sum
/// of 48 of them more). The ratios must bind: some at a bound or zeroed, some inside.
fn compare_correction(label: &str, correction: grpo::IsCorrection, terms: &grpo::LossTerms, trl_metrics: &Path, exact: &BTreeMap<String, Tensor>) {
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(trl_metrics).unwrap()).unwrap();
    let keys = [key::SAMPLING_LOGP_DIFFERENCE_MEAN, key::SAMPLING_LOGP_DIFFERENCE_MAX, key::IS_RATIO_MIN, key::IS_RATIO_MEAN, key::IS_RATIO_MAX];
    for key in keys {
        let ours = terms.number(key).expect("the correction's metrics");
        let theirs = metrics["metrics"][key].as_f64().unwrap_or_else(|| panic!("{label}: TRL logged no {key}"));
        let float64 = exact[key].double_value(&[]);
        let bound = (2.0 * (theirs - float64).abs()).max(1e-5 * float64.abs().max(1e-2));
        assert!((ours - float64).abs() <= bound, "{label}: {key} {ours} vs float64 {float64} (bound {bound:.1e}; TRL {theirs}){}", common::machine_note());
        assert_reference_agrees(label, key, (theirs - float64).abs() / float64.abs().max(1.0), 1e-3);
    }
    let truncates = matches!(correction.mode, grpo::ImportanceSamplingMode::TokenTruncate | grpo::ImportanceSamplingMode::SequenceTruncate);
    let (low, high) = if truncates { (correction.clip_min, correction.clip_max) } else { (0.0, 0.0) };
    let [ratio_min, ratio_mean, ratio_max] = [key::IS_RATIO_MIN, key::IS_RATIO_MEAN, key::IS_RATIO_MAX].map(|key| terms.number(key).expect("the correction's metrics"));
    let binds = (ratio_max - high).abs() < 1e-6 || (ratio_min - low).abs() < 1e-6;
    assert!(binds && ratio_mean > low && ratio_mean < correction.clip_max, "{label}: the bounds must bind on some ratios and not all: min {ratio_min}, mean {ratio_mean}, max {ratio_max}");
}

/// TRL's `policy_loss` (the loss before the entropy bonus, held to float64) and `entropy_coef`
/// (after the step's update) against ours: our controller updated with the step's trained entropy, as the trainer
/// does. The bonus must move the loss (static), or the coefficient must move (adaptive).
fn compare_entropy_bonus(label: &str, control: grpo::EntropyControl, terms: &grpo::LossTerms, trl_metrics: &Path, exact: &BTreeMap<String, Tensor>) {
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(trl_metrics).unwrap()).unwrap();
    let bonus = terms.entropy_bonus.as_ref().expect("the entropy bonus's terms");
    let mut controller = grpo::EntropyController::new(control);
    let applied = controller.applied();
    controller.update(bonus.mean_entropy);
    let policy_loss = bonus.policy_loss.double_value(&[]);
    let theirs = |key: &str| metrics["metrics"][key].as_f64().unwrap_or_else(|| panic!("{label}: TRL logged no {key}"));
    // The loss before the bonus: absolutely within 1e-6 of float64, as the loss is
    // (`compare_with_float64`).
    let float64 = exact["policy_loss"].double_value(&[]);
    assert!((policy_loss - float64).abs() <= 1e-6, "{label}: policy_loss {policy_loss} vs float64 {float64}{}", common::machine_note());
    assert_reference_agrees(label, "policy_loss", (theirs("policy_loss") - float64).abs(), 1e-5);
    // The coefficient after the update, by hand from the keys: the control's one step of delta
    // (up, the entropy being tens of nats below its target, so no rounding of it can change the
    // step), or the static coefficient. Ours is the same float64 operations, so equal; TRL's
    // within 1e-6 of it (it may keep the coefficient in float32, 1e-8 off).
    let expected = match control {
        grpo::EntropyControl::Static { coef } => coef,
        grpo::EntropyControl::Adaptive { initial, max, delta, target, .. } => {
            assert!(bonus.mean_entropy < target - 10.0, "{label}: the trained entropy {} must lie far below the target {target}", bonus.mean_entropy);
            (initial + delta).min(max)
        }
    };
    assert_eq!(controller.coef(), expected, "{label}: entropy_coef after the step");
    assert!((theirs("entropy_coef") - expected).abs() <= 1e-6, "{label}: TRL's entropy_coef {} vs {expected} by hand", theirs("entropy_coef"));
    let loss = terms.loss.double_value(&[]);
    match control {
        grpo::EntropyControl::Static { coef } => assert!(applied == coef && (loss - policy_loss).abs() > 1e-3, "{label}: the bonus moves the loss ({policy_loss} -> {loss})"),
        grpo::EntropyControl::Adaptive { initial, .. } => assert!(applied == 0.0 && loss == policy_loss && controller.coef() > initial, "{label}: the first adaptive step applies nothing and raises the coefficient"),
    }
    println!("{label}: policy_loss {policy_loss:.9}, loss {loss:.9}, trained entropy {:.4}, entropy_coef after {}", bonus.mean_entropy, controller.coef());
}

/// What each side of the comparison computed: loss, log-probs, advantages, gradients.
struct Computed<'a> {
    loss: &'a Tensor,
    logprobs: &'a Tensor,
    advantages: &'a Tensor,
    grads: &'a BTreeMap<String, Tensor>,
}

/// Relative L2 distance of a gradient to a reference one.
fn relative_l2(grad: &Tensor, reference: &Tensor) -> f64 {
    let reference = reference.to_kind(Kind::Double);
    (grad.to_kind(Kind::Double) - &reference).norm().double_value(&[]) / reference.norm().double_value(&[])
}

fn compare(label: &str, ours: &Computed, mask: &Tensor, trl: &BTreeMap<String, Tensor>, exact: &BTreeMap<String, Tensor>) {
    // Advantages: a z-score of hand-made rewards, float32 rounding of values about 1 (2e-7).
    let adv_error = common::max_abs_diff(ours.advantages, &exact["advantages64"]);
    assert!(adv_error <= 1e-6, "{label}: advantages {adv_error:.1e} from float64{}", common::machine_note());
    assert_reference_agrees(label, "advantages", common::max_abs_diff(&trl["advantages_trl"], &exact["advantages64"]), 1e-5);
    // Per-token log-probabilities: ours within twice TRL's distance to float64 (at least 1e-5).
    let keep = mask.to_kind(Kind::Double);
    let float64 = &exact["per_token_logps64"] * &keep;
    let lp_error = common::max_abs_diff(&(ours.logprobs.detach().to_kind(Kind::Double) * &keep), &float64);
    let trl_lp_error = common::max_abs_diff(&(trl["per_token_logps"].to_kind(Kind::Double) * &keep), &float64);
    let lp_bound = (2.0 * trl_lp_error).max(1e-5);
    assert!(lp_error <= lp_bound, "{label}: per-token log-probs {lp_error:.1e} from float64 (bound {lp_bound:.1e}: TRL is {trl_lp_error:.1e} from it){}", common::machine_note());
    assert_reference_agrees(label, "per-token log-probs", trl_lp_error, 1e-4);
    // The loss and the gradients are held to float64 by `compare_with_float64`; here TRL's are,
    // so that the float64 loss is TRL's objective.
    let (loss, theirs) = (ours.loss.double_value(&[]), trl["loss"].double_value(&[]));
    assert_reference_agrees(label, "loss", (theirs - exact["loss"].double_value(&[])).abs(), 1e-5);
    for param in ours.grads.keys() {
        let expected = trl.get(&format!("grad.{param}")).unwrap_or_else(|| panic!("TRL has no gradient for {param}"));
        assert!(expected.norm().double_value(&[]) > 0.0, "{label}: TRL's gradient of {param} is zero");
        assert_reference_agrees(label, &format!("gradient of {param} (relative L2)"), relative_l2(expected, &exact[&format!("grad.{param}")]), 1e-4);
    }
    assert_eq!(ours.grads.len(), trl.keys().filter(|k| k.starts_with("grad.")).count(), "{label}: parameter sets differ");
    println!("{label}: loss {loss:.9} (TRL {theirs:.9}, {:.1e} from float64), log-probs {lp_error:.1e} from float64 (TRL {trl_lp_error:.1e}), advantages {adv_error:.1e}", (theirs - exact["loss"].double_value(&[])).abs());
}

/// TRL's own value `distance` from the float64 one, within `bound`: the float64 reference
/// (`trl_grpo.py`'s independent loss, no TRL code) computes TRL's objective, so our bounds of
/// twice TRL's distance to it are bounds to TRL's formula. Measured here (AMD EPYC, 2026-11-28)
/// TRL is 4.4e-6 from float64 in log-probs and at most 1.09e-5 in gradients (relative L2), about
/// a tenth of these bounds; a different formula is off by O(1e-2) or more. No float32 result is
/// held to another.
fn assert_reference_agrees(label: &str, what: &str, distance: f64, bound: f64) {
    assert!(distance <= bound, "{label}: TRL's {what} is {distance:.2e} from the float64 reference (bound {bound:.0e}): the reference no longer computes TRL's objective");
}

/// Our float32 loss and gradients against the float64 ones (the independent loss of
/// `trl_grpo.py`, unpadded rows, no TRL code). Each parameter's gradient within twice TRL's own
/// distance to float64 on the same inputs, or 2e-5 (relative L2) where TRL is closer: measured
/// on 2026-11-28 on an AMD EPYC (AVX2), ours 2.9e-6 to 1.09e-5 from float64 (the largest on the
/// entropy-bonus cases) and TRL 2.7e-6 to 1.09e-5; an Intel Xeon with AMX put TRL 1.6e-5 from
/// float64 (issue 44), where the old bound between the two float32 results failed. The loss
/// within 1e-6 absolutely (ours 2.4e-11 to 3.9e-7). A summation order
/// that loses digits (a first head, `w_target - p W`, reached 1.9e-5 with TRL at 5e-6) or a wrong
/// formula (O(1)) fails here.
fn compare_with_float64(label: &str, ours: &BTreeMap<String, Tensor>, loss: &Tensor, trl: &BTreeMap<String, Tensor>, exact: &BTreeMap<String, Tensor>) {
    let mut worst = (0.0f64, 0.0f64);
    for (param, grad) in ours {
        let float64 = &exact[&format!("grad.{param}")];
        let (ours_error, trl_error) = (relative_l2(grad, float64), relative_l2(&trl[&format!("grad.{param}")], float64));
        let bound = (2.0 * trl_error).max(2e-5);
        assert!(ours_error <= bound, "{label}: our gradient of {param} is {ours_error:.2e} from float64 (relative L2; bound {bound:.1e}: TRL is {trl_error:.2e} from it){}", common::machine_note());
        worst = (worst.0.max(ours_error), worst.1.max(trl_error));
    }
    let loss_error = (loss.double_value(&[]) - exact["loss"].double_value(&[])).abs();
    println!("{label}: against float64: gradients ours {:.2e} (TRL {:.2e}), loss ours {loss_error:.1e}", worst.0, worst.1);
    assert!(loss_error <= 1e-6, "{label}: our loss is {loss_error:.2e} from float64 (bound 1e-6){}", common::machine_note());
}
