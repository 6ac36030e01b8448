//! `train_dtype: bfloat16` (issue 50): the training passes' matrix products in bfloat16 with
//! float32 master weights, as `torch.autocast` (TRL's `bf16=True`) runs them. Held to float64
//! on the same batch within a small multiple of transformers' own autocast distance to float64
//! (`scripts/reference/autocast_grads.py`), never to another float32 or bfloat16 result.

mod common;

use std::collections::BTreeMap;

use common::{fixture, machine_note, one_thread, python, repo_root};
use smallrl::adapters::set_base_trainable;
use smallrl::engine;
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{SamplingParams, generate};
use smallrl::model::weights::{read_safetensors, write_safetensors};
use smallrl::model::{self, Llama};
use tch::{Device, Kind, Tensor};

/// How far ours may be from float64, in multiples of torch.autocast's distance on the same
/// batch: the two round different intermediate values to bfloat16 (our adapters fold their
/// scaling into B, our head's backward is analytic), so they are alike in size, not in bits.
const TIMES_AUTOCAST: f64 = 3.0;

fn rel_l2(a: &Tensor, truth: &Tensor) -> f64 {
    let diff = (a.to_kind(Kind::Double) - truth).norm().double_value(&[]);
    diff / truth.norm().double_value(&[]).max(f64::MIN_POSITIVE)
}

/// The weighted log-prob sum's log-probs and every base parameter's gradient, with the model's
/// matrix products in `autocast` (None: float32).
fn ours(model: &mut Llama, g: &model::batch::Generation, weights: &Tensor, autocast: Option<Kind>) -> (Tensor, BTreeMap<String, Tensor>) {
    model.autocast = autocast;
    for (_, t) in model.base_tensors() {
        t.shallow_clone().zero_grad();
    }
    let logp = engine::completion_logprobs(model, g.into(), 1.0, &[]).logprobs;
    (&logp * weights).sum(Kind::Float).backward();
    let grads = model.base_tensors().into_iter().map(|(n, t)| (n, t.grad().to_kind(Kind::Double))).collect();
    (logp.detach().to_kind(Kind::Double), grads)
}

#[test]
fn bfloat16_passes_are_as_close_to_float64_as_torch_autocast() {
    one_thread();
    eprintln!("{}", machine_note());
    let loaded = model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let mut policy = loaded.model;
    set_base_trainable(&mut policy, true);
    let prompts: Vec<Vec<u32>> = ["once upon a time", "the little dog found a red ball and"]
        .iter()
        .flat_map(|p| std::iter::repeat_n(loaded.tokenizer.encode(p).unwrap(), 3))
        .collect();
    let params = SamplingParams { max_new_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let g = generate(&DecodeModel::new(&policy, &[]), &prompts, &params, 5).unwrap();
    tch::manual_seed(3);
    let weights = Tensor::randn(g.completion_ids.size(), (Kind::Float, Device::Cpu));

    let (logp32, grads32) = ours(&mut policy, &g, &weights, None);
    let (logp_bf, grads_bf) = ours(&mut policy, &g, &weights, Some(Kind::BFloat16));

    let work = tempfile::tempdir().unwrap();
    let batch = work.path().join("batch.safetensors");
    let named = |name: &str, t: &Tensor| (name.to_string(), t.shallow_clone());
    write_safetensors(
        &batch,
        &[named("prompt_ids", &g.prompt_ids), named("prompt_mask", &g.prompt_mask), named("completion_ids", &g.completion_ids), named("completion_mask", &g.completion_mask), named("weights", &weights)],
    )
    .unwrap();
    let out = work.path().join("reference.safetensors");
    let status = std::process::Command::new(python())
        .current_dir(repo_root())
        .args(["scripts/reference/autocast_grads.py", fixture("tiny-stories").to_str().unwrap()])
        .args([&batch, &out])
        .status()
        .unwrap();
    assert!(status.success(), "autocast_grads.py failed");
    let reference = read_safetensors(&out).unwrap();
    let (logp64, logp_autocast) = (&reference["logp64"], &reference["logp_bf16"]);

    let max_abs = |a: &Tensor| (a - logp64).abs().max().double_value(&[]);
    let (ours_bf, autocast, ours32) = (max_abs(&logp_bf), max_abs(logp_autocast), max_abs(&logp32));
    eprintln!("log-probs, max |x - float64|: ours bfloat16 {ours_bf:.3e}, torch.autocast {autocast:.3e}, ours float32 {ours32:.3e}");
    assert!(ours_bf <= TIMES_AUTOCAST * autocast, "bfloat16 log-probs {ours_bf:.3e} from float64, torch.autocast's {autocast:.3e}");
    assert!(ours_bf > 10.0 * ours32, "the bfloat16 path must round like bfloat16 ({ours_bf:.3e}), not like float32 ({ours32:.3e})");

    let (mut worst, mut all_bf, mut all_autocast, mut all_64) = (0.0f64, Vec::new(), Vec::new(), Vec::new());
    for (name, ours) in &grads_bf {
        let truth = &reference[&format!("grad64.{name}")];
        let theirs = &reference[&format!("grad_bf16.{name}")];
        let (ratio_ours, ratio_theirs) = (rel_l2(ours, truth), rel_l2(theirs, truth));
        worst = worst.max(ratio_ours / ratio_theirs);
        assert!(rel_l2(&grads32[name], truth) < 1e-4, "{name}: our float32 gradient is the float64 one within float32 rounding");
        all_bf.push(ours.flatten(0, -1));
        all_autocast.push(theirs.flatten(0, -1));
        all_64.push(truth.flatten(0, -1));
    }
    let truth = Tensor::cat(&all_64, 0);
    let (ours_all, autocast_all) = (rel_l2(&Tensor::cat(&all_bf, 0), &truth), rel_l2(&Tensor::cat(&all_autocast, 0), &truth));
    eprintln!("gradients, relative L2 to float64 over every parameter: ours bfloat16 {ours_all:.3e}, torch.autocast {autocast_all:.3e}; worst parameter ratio {worst:.2}");
    assert!(ours_all <= TIMES_AUTOCAST * autocast_all, "bfloat16 gradients {ours_all:.3e} from float64, torch.autocast's {autocast_all:.3e}");
    assert!(autocast_all > 1e-4, "torch.autocast must be measurably off float64 here ({autocast_all:.3e}), or the bound says nothing");
}

/// Floors below which a distance to float64 is float32 rounding, whatever TRL's: per-token
/// log-probs 1e-5, the loss 1e-6 absolutely, gradients 2e-5 relative L2 (the bounds of
/// `tests/grpo_trl.rs` for a float32 step, whose measured distances are a tenth of them).
const FLOORS: (f64, f64, f64) = (1e-5, 1e-6, 2e-5);

/// A smallrl `train_dtype: bfloat16` GRPO step (policy and reference passes in bfloat16
/// products, the trainer's own forward-and-backward) and TRL 1.16's `bf16=True` step on the same
/// batch (`trl_grpo.py`: TRL's `_generate_and_score_completions` and `compute_loss` under its
/// `accelerator.autocast()`, checked to give bfloat16 from the linear layers), both held to the
/// float64 step (the harness's independent loss, unpadded rows): per-token log-probs (max abs),
/// the loss (abs) and the gradients (relative L2 over every parameter, and per parameter),
/// each ours within [`TIMES_AUTOCAST`] times TRL's distance plus [`FLOORS`]. dapo (TRL's
/// default) with beta 0.02 against the unperturbed fixture, so the loss's value carries the
/// reference's and the policy's bfloat16 log-probs through the KL term.
#[test]
fn bfloat16_step_is_as_close_to_float64_as_trl_bf16_step() {
    use smallrl::grpo;
    use smallrl::train::TrainConfig;
    const GROUP: usize = 4;
    one_thread();
    eprintln!("{}", machine_note());
    let work = tempfile::tempdir().unwrap();
    let policy = common::perturbed_policy(&work.path().join("policy"));
    let mut reference = model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap().model;
    reference.autocast = Some(Kind::BFloat16);
    let prompts: Vec<Vec<u32>> = ["once upon a time", "the little dog found a red ball and"]
        .iter()
        .flat_map(|p| std::iter::repeat_n(policy.tokenizer.encode(p).unwrap(), GROUP))
        .collect();
    let params = SamplingParams { max_new_tokens: 32, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let g = generate(&DecodeModel::new(&policy.model, &[]), &prompts, &params, 3).unwrap();
    let rewards = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.5, 0.0, 0.25, 1.0, 0.75]);
    let keys = serde_json::json!({
        "beta": 0.02, "epsilon": 0.2, "loss_type": "dapo", "temperature": 1.0, "max_completion_length": params.max_new_tokens,
        "num_generations": GROUP, "num_iterations": 1,
    });
    let mut config_keys = keys.clone();
    config_keys["train_dtype"] = "bfloat16".into();
    let config: TrainConfig = serde_json::from_value(config_keys).unwrap();
    let settings = config.objective().unwrap();
    let (advantages, _) = grpo::group_advantages(&rewards, GROUP, config.scale_rewards, 1e-4);
    let loss_mask = grpo::loss_mask(&g, false);
    let ref_logprobs = engine::frozen_logprobs(&reference, (&g).into(), 1.0, &[]);
    let mut policy_model = policy.model;
    set_base_trainable(&mut policy_model, true);
    policy_model.autocast = config.train_dtype.matmul_kind();
    let classes = vec![Tensor::ones([prompts.len() as i64], (Kind::Float, Device::Cpu))];
    let batch = engine::LossBatch {
        seqs: (&g).into(),
        ctl: &[],
        old_logprobs: None,
        ref_logprobs: Some(&ref_logprobs),
        sampling_logprobs: None,
        old_is_sampler: false,
        advantages: &advantages,
        loss_mask: &loss_mask,
        classes: &classes,
        entropy_coef: None,
    };
    let engine::BackwardPass { logprobs, terms } = engine::backward_micro_batches(&policy_model, &batch, 1.0, &settings, 1, &mut |_, _| {});
    let ours: BTreeMap<String, Tensor> = policy_model.base_tensors().into_iter().map(|(n, t)| (n, t.grad().to_kind(Kind::Double))).collect();

    let dir = work.path().join("case");
    std::fs::create_dir_all(&dir).unwrap();
    let named = |name: &str, t: &Tensor| (name.to_string(), t.shallow_clone());
    let tensors = [("prompt_ids", &g.prompt_ids), ("prompt_mask", &g.prompt_mask), ("completion_ids", &g.completion_ids), ("completion_mask", &g.completion_mask), ("rewards", &rewards), ("advantages", &advantages)];
    write_safetensors(&dir.join("batch.safetensors"), &tensors.map(|(n, t)| named(n, t))).unwrap();
    let mut args = keys;
    args["bf16"] = true.into();
    args["model_dir"] = work.path().join("policy").to_str().unwrap().into();
    args["ref_model_dir"] = fixture("tiny-stories").to_str().unwrap().into();
    std::fs::write(dir.join("args.json"), args.to_string()).unwrap();
    let status = std::process::Command::new(python()).current_dir(repo_root()).args(["scripts/reference/trl_grpo.py", "--case-dirs"]).arg(&dir).status().unwrap();
    assert!(status.success(), "trl_grpo.py failed");
    let trl = read_safetensors(&dir.join("trl.safetensors")).unwrap();
    let exact = read_safetensors(&dir.join("exact.safetensors")).unwrap();
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("trl.metrics.json")).unwrap()).unwrap();
    assert_eq!(metrics["product_dtypes"], serde_json::json!({"policy": ["torch.bfloat16"], "ref": ["torch.bfloat16"]}), "TRL's passes ran under bfloat16 autocast");
    held_to_float64_with_trl(&logprobs.logprobs, &terms.loss, &ours, &loss_mask, &trl, &exact);
}

/// Ours and TRL's distances to float64 (log-probs, loss, gradients), ours within
/// [`TIMES_AUTOCAST`] times TRL's plus [`FLOORS`]; TRL's log-probs must be off float64 as
/// bfloat16 is (above 1e-3), or the comparison says nothing.
fn held_to_float64_with_trl(logprobs: &Tensor, loss: &Tensor, ours: &BTreeMap<String, Tensor>, mask: &Tensor, trl: &BTreeMap<String, Tensor>, exact: &BTreeMap<String, Tensor>) {
    let keep = mask.to_kind(Kind::Double);
    let float64 = &exact["per_token_logps64"] * &keep;
    let distance = |x: &Tensor| (x.detach().to_kind(Kind::Double) * &keep - &float64).abs().max().double_value(&[]);
    let (lp_ours, lp_trl) = (distance(logprobs), distance(&trl["per_token_logps"]));
    let loss64 = exact["loss"].double_value(&[]);
    let (loss_ours, loss_trl) = ((loss.double_value(&[]) - loss64).abs(), (trl["loss"].double_value(&[]) - loss64).abs());
    let (mut all_ours, mut all_trl, mut all_64, mut worst) = (Vec::new(), Vec::new(), Vec::new(), (String::new(), 0.0f64));
    for (name, grad) in ours {
        let (truth, theirs) = (&exact[&format!("grad.{name}")], trl[&format!("grad.{name}")].to_kind(Kind::Double));
        let (ours_error, trl_error) = (rel_l2(grad, truth), rel_l2(&theirs, truth));
        let bound = TIMES_AUTOCAST * trl_error + FLOORS.2;
        assert!(ours_error <= bound, "gradient of {name}: ours {ours_error:.3e} from float64, TRL bf16 {trl_error:.3e} (bound {bound:.3e}){}", machine_note());
        if ours_error / trl_error > worst.1 {
            worst = (name.clone(), ours_error / trl_error);
        }
        all_ours.push(grad.flatten(0, -1));
        all_trl.push(theirs.flatten(0, -1));
        all_64.push(truth.flatten(0, -1));
    }
    let truth = Tensor::cat(&all_64, 0);
    let (grad_ours, grad_trl) = (rel_l2(&Tensor::cat(&all_ours, 0), &truth), rel_l2(&Tensor::cat(&all_trl, 0), &truth));
    eprintln!(
        "against float64: log-probs ours {lp_ours:.3e} TRL bf16 {lp_trl:.3e}; loss ours {loss_ours:.3e} TRL {loss_trl:.3e} (float64 {loss64:.9}); gradients ours {grad_ours:.3e} TRL {grad_trl:.3e}, worst parameter ratio {:.2} ({})",
        worst.1, worst.0
    );
    assert!(lp_trl > 1e-3, "TRL's bf16 log-probs must be off float64 as bfloat16 rounds ({lp_trl:.3e}), or this compares float32 with float32");
    assert!(lp_ours <= TIMES_AUTOCAST * lp_trl + FLOORS.0, "log-probs: ours {lp_ours:.3e} from float64, TRL bf16 {lp_trl:.3e}");
    assert!(loss_ours <= TIMES_AUTOCAST * loss_trl + FLOORS.1, "loss: ours {loss_ours:.3e} from float64, TRL bf16 {loss_trl:.3e}");
    assert!(grad_ours <= TIMES_AUTOCAST * grad_trl + FLOORS.2, "gradients: ours {grad_ours:.3e} from float64, TRL bf16 {grad_trl:.3e}");
}

/// A `train_dtype: bfloat16` run's reference pass rounds its products as the policy's do, as
/// TRL's `bf16=True` runs its reference under the same autocast (it was the float32 native
/// scorer: a float32 reference against a bfloat16 policy puts the policy's rounding into the KL
/// term). The dumped reference log-probs of a one-step full fine-tuning run with beta > 0 are
/// held to the float64 pass over the same batch: farther from it than 10x the float32 pass's
/// distance (bfloat16 rounding, not float32's) and within 0.1 (torch.autocast's own distance on
/// this fixture is 2.75e-2, `bfloat16_passes_are_as_close_to_float64_as_torch_autocast`).
#[test]
fn a_bfloat16_runs_reference_pass_rounds_as_the_policys_do() {
    use smallrl::model::batch::Generation;
    eprintln!("{}", machine_note());
    let work = tempfile::tempdir().unwrap();
    let mut config = common::tiny_stories_run(work.path(), &common::standard_plugin("happy"), "reference");
    for (key, value) in [("adapter", serde_json::json!("full")), ("train_dtype", "bfloat16".into()), ("beta", 0.02.into()), ("max_steps", 1.into())] {
        config.insert(key.into(), value);
    }
    config.remove("lora_preset");
    config.insert("dump_batches".into(), work.path().join("dump").to_str().unwrap().into());
    common::train(config, None, None);
    let dumped = read_safetensors(&work.path().join("dump/step-1.safetensors")).unwrap();
    let g = Generation::from_saved(&dumped, "", Device::Cpu).unwrap();
    let mask = g.completion_mask.to_kind(Kind::Double);
    let logprobs_in = |kind: Kind| {
        let model = model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, kind).unwrap().model;
        engine::frozen_logprobs(&model, (&g).into(), 1.0, &[]).to_kind(Kind::Double)
    };
    let float64 = logprobs_in(Kind::Double);
    let distance = |logprobs: &Tensor| ((logprobs.to_kind(Kind::Double) - &float64) * &mask).abs().max().double_value(&[]);
    let (reference, float32) = (distance(&dumped["ref_logprobs"]), distance(&logprobs_in(Kind::Float)));
    eprintln!("reference log-probs, max |x - float64|: the run's {reference:.3e}, a float32 pass {float32:.3e}");
    assert!(reference > 10.0 * float32, "the run's reference pass must round like bfloat16 ({reference:.3e}), not like float32 ({float32:.3e})");
    assert!(reference < 0.1, "the run's reference log-probs are {reference:.3e} from float64");
}
