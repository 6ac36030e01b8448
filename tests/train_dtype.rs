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
