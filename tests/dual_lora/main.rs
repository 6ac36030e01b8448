//! DualLoRA, DualMLP and gradient routing: adapter scales behave as the formula says (also
//! through the fused decoder and a merged HF export), and a routed single-pass step has exactly
//! the gradients of the original's per-class backward passes.

#[path = "../common/mod.rs"]
mod common;
mod routed;
mod passes;

use std::collections::BTreeMap;

use common::{fixture, max_abs_diff, one_thread};
use smallrl::adapters::{AdapterConfig, FORGET, RETAIN};
use smallrl::engine;
use smallrl::grpo::{self, Aggregation, LossType, Objective};
use smallrl::model::decode::DecodeModel;
use smallrl::model::export::save_hf_dir;
use smallrl::model::generate::{Generation, SamplingParams, generate};
use smallrl::model::linear::{AdapterCtl, RowScale};
use smallrl::model::{self, Llama, LoadedModel};
use smallrl::routing::{self, RoutingMode, RowWeights};
use smallrl::train::TrainConfig;
use tch::{Device, Kind, Tensor};

fn load() -> LoadedModel {
    load_in(Kind::Float)
}

fn load_in(kind: Kind) -> LoadedModel {
    one_thread();
    model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, kind).unwrap()
}

/// DualLoRA r8/r4 with B drawn at random (B = 0 would make every A gradient zero).
fn dual_lora(model: &mut Llama) -> AdapterConfig {
    attach_with_random(AdapterConfig::dual_lora(8, 4, 16.0, 1), model, "lora_B")
}

/// DualMLP with 6 retain and 3 forget neurons (kappa 1.5 and 3), down weights drawn at random
/// (down = 0 would make every gate and up gradient zero).
fn dual_mlp(model: &mut Llama) -> AdapterConfig {
    attach_with_random(AdapterConfig::dual_mlp(6, 3, 1), model, "adapter_down")
}

/// Attaches `config` and draws the zero-initialised tensors (names containing `zero_part`) at
/// random.
fn attach_with_random(config: AdapterConfig, model: &mut Llama, zero_part: &str) -> AdapterConfig {
    config.attach(model, 5).unwrap();
    tch::manual_seed(6);
    tch::no_grad(|| {
        for (name, tensor) in config.trainable(model) {
            if name.contains(zero_part) {
                tensor.shallow_clone().copy_(&(tensor.randn_like() * 0.05));
            }
        }
    });
    config
}

/// Both dual adapter kinds, with their names, each on a fresh copy of the fixture.
fn dual_adapters() -> Vec<(&'static str, LoadedModel, AdapterConfig)> {
    dual_adapters_in(Kind::Float)
}

/// [`dual_adapters`] on the fixture loaded in `kind`.
fn dual_adapters_in(kind: Kind) -> Vec<(&'static str, LoadedModel, AdapterConfig)> {
    let builders: [(&str, fn(&mut Llama) -> AdapterConfig); 2] = [("dual-lora", dual_lora), ("dual-mlp", dual_mlp)];
    builders
        .into_iter()
        .map(|(name, build)| {
            let mut loaded = load_in(kind);
            let config = build(&mut loaded.model);
            (name, loaded, config)
        })
        .collect()
}

fn ids(loaded: &LoadedModel) -> Tensor {
    let ids: Vec<i64> = loaded.tokenizer.encode("once upon a time, a little girl named lily found a ball").unwrap().iter().map(|&i| i as i64).collect();
    Tensor::from_slice(&ids).unsqueeze(0)
}

fn logits(model: &Llama, ids: &Tensor, ctl: &[AdapterCtl]) -> Tensor {
    tch::no_grad(|| model.logits(&model.forward(ids, &ids.ones_like(), ctl)))
}

#[test]
fn fresh_adapters_leave_the_model_unchanged() {
    let mut loaded = load();
    let ids = ids(&loaded);
    let base = logits(&loaded.model, &ids, &[]);
    AdapterConfig::dual_lora(32, 32, 32.0, 1).attach(&mut loaded.model, 1).unwrap();
    let with_adapters = logits(&loaded.model, &ids, &[AdapterCtl::on(), AdapterCtl::on()]);
    assert!(base.equal(&with_adapters), "B = 0 must give exactly the base model");
    let mut loaded = load();
    AdapterConfig::dual_mlp(16, 16, 1).attach(&mut loaded.model, 1).unwrap();
    let with_adapters = logits(&loaded.model, &ids, &[AdapterCtl::on(), AdapterCtl::on()]);
    assert!(base.equal(&with_adapters), "down = 0 must give exactly the base model");
}

#[test]
fn adapter_scales_select_the_adapters() {
    let base = {
        let loaded = load();
        logits(&loaded.model, &ids(&loaded), &[])
    };
    for (kind, loaded, _) in dual_adapters() {
        scales_select_the_adapters(kind, &loaded, &base);
    }
}

fn scales_select_the_adapters(kind: &str, loaded: &LoadedModel, base: &Tensor) {
    let ids = ids(loaded);
    let off = logits(&loaded.model, &ids, &[AdapterCtl::off(), AdapterCtl::off()]);
    assert!(base.equal(&off), "{kind}: scales (0, 0) must give exactly the base model");
    let work = tempfile::tempdir().unwrap();
    for (scales, mode) in [([1.0, 0.0], "retain_only"), ([0.0, 1.0], "forget_only"), ([1.0, 1.0], "both")] {
        let name = format!("{kind}-{mode}");
        // An independent route to the same function: merge the adapters into the weights,
        // write an HF model and load it back as a plain model.
        let dir = work.path().join(&name);
        save_hf_dir(&loaded.model, &scales, &loaded.files.tokenizer, &dir).unwrap();
        let merged = model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
        let expected = logits(&merged.model, &ids, &[]);
        let ctl = [AdapterCtl::frozen(scales[0]), AdapterCtl::frozen(scales[1])];
        let diff = max_abs_diff(&logits(&loaded.model, &ids, &ctl), &expected);
        assert!(diff < 1e-4, "{name}: adapter forward differs from merged weights by {diff}");
        assert!(max_abs_diff(&expected, base) > 1e-3, "{name}: the adapters must change the output");
        // The fused decoder folds the same scales in.
        let decoder = DecodeModel::new(&loaded.model, &scales);
        let len = ids.size()[1];
        let mut cache = decoder.new_cache(1, len);
        let positions = Tensor::arange(len, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let mask = smallrl::model::decode::prefill_mask(&ids.ones_like(), len);
        let fused = tch::no_grad(|| decoder.logits(&decoder.forward(&ids, &positions, &mut cache, 0, &mask)));
        let diff = max_abs_diff(&fused, &expected);
        assert!(diff < 1e-4, "{name}: fused decoder differs from merged weights by {diff}");
    }
}

struct Routed {
    generation: Generation,
    advantages: Tensor,
}

fn batch(loaded: &LoadedModel) -> Routed {
    let prompt = loaded.tokenizer.encode("once upon a time").unwrap();
    let params = SamplingParams { max_new_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let generation = generate(&DecodeModel::new(&loaded.model, &[1.0, 1.0]), &vec![prompt; 8], &params, 9).unwrap();
    tch::manual_seed(4);
    let advantages = Tensor::randn([8], (Kind::Float, Device::Cpu));
    Routed { generation, advantages }
}

fn settings(loss_type: LossType) -> Objective {
    Objective { kl: None, aggregation: Aggregation::of(loss_type, 24), ..TrainConfig::default().objective().unwrap() }
}

fn grads(config: &AdapterConfig, model: &Llama) -> BTreeMap<String, Tensor> {
    config
        .trainable(model)
        .into_iter()
        .map(|(name, t)| {
            let g = t.grad();
            (name, if g.defined() { g.copy() } else { t.zeros_like() })
        })
        .collect()
}

fn zero_grads(config: &AdapterConfig, model: &Llama) {
    for (_, mut t) in config.trainable(model) {
        t.zero_grad();
    }
}

/// The single-pass routed step.
fn routed_grads(model: &Llama, config: &AdapterConfig, b: &Routed, mode: RoutingMode, is_rh: &[bool], ablated: &[bool], loss_type: LossType) -> BTreeMap<String, Tensor> {
    weighted_grads(model, config, b, RowWeights::gates(mode), is_rh, ablated, loss_type)
}

/// The single-pass step with per-row adapter gradient weights.
fn weighted_grads(model: &Llama, config: &AdapterConfig, b: &Routed, weights: RowWeights, is_rh: &[bool], ablated: &[bool], loss_type: LossType) -> BTreeMap<String, Tensor> {
    zero_grads(config, model);
    let plan = routing::plan(config, weights, &routing::Labels::routed(is_rh.to_vec(), ablated.to_vec()), Device::Cpu);
    let g = &b.generation;
    let lp = engine::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
    grpo::grpo_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &plan.classes, &settings(loss_type)).loss.backward();
    grads(config, model)
}

/// The trainer's routed step in `micro_batches` chunks of rows (the per-row adapter controls cut
/// to each chunk).
fn micro_batched_grads(model: &Llama, config: &AdapterConfig, b: &Routed, routes: (RoutingMode, &[bool], &[bool]), loss_type: LossType, micro_batches: usize) -> BTreeMap<String, Tensor> {
    zero_grads(config, model);
    let (mode, is_rh, ablated) = routes;
    let plan = routing::plan(config, RowWeights::gates(mode), &routing::Labels::routed(is_rh.to_vec(), ablated.to_vec()), Device::Cpu);
    let g = &b.generation;
    let batch = engine::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, sampling_logprobs: None, old_is_sampler: false, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes, entropy_coef: None };
    engine::backward_micro_batches(model, &batch, 1.0, &settings(loss_type), micro_batches, &mut |_, _| {});
    grads(config, model)
}

/// The original's reference: one backward pass per sample class on that class's rows only,
/// loss scaled by n_class / n_total, the masked adapter's gradients replaced by zeros.
fn per_class_grads(model: &Llama, config: &AdapterConfig, b: &Routed, mode: RoutingMode, is_rh: &[bool], ablated: &[bool], loss_type: LossType) -> BTreeMap<String, Tensor> {
    per_class_grads_of(model, config, b, mode, is_rh, ablated, loss_type, |_| true)
}

/// [`per_class_grads`] summed over the classes `wanted` names only (clean, ablated, flagged).
#[allow(clippy::too_many_arguments)]
fn per_class_grads_of(model: &Llama, config: &AdapterConfig, b: &Routed, mode: RoutingMode, is_rh: &[bool], ablated: &[bool], loss_type: LossType, wanted: impl Fn(&str) -> bool) -> BTreeMap<String, Tensor> {
    // The routing modes' gradient weights, by hand: (retain, forget) on clean and flagged rows.
    let (clean, flagged) = match mode {
        RoutingMode::None => ([1.0, 1.0], [1.0, 1.0]),
        RoutingMode::Classic => ([1.0, 1.0], [0.0, 1.0]),
        RoutingMode::Exclusive => ([1.0, 0.0], [0.0, 1.0]),
    };
    scaled_per_class_grads(model, config, b, (clean, flagged), is_rh, ablated, loss_type, wanted)
}

/// [`per_class_grads_of`] with each class's gradient of each adapter multiplied by a weight
/// (`[retain, forget]` on clean and on flagged classes) instead of kept or zeroed: the
/// original's balanced renormalisation scales the surviving adapter's gradient by its kappa.
#[allow(clippy::too_many_arguments)]
fn scaled_per_class_grads(model: &Llama, config: &AdapterConfig, b: &Routed, (clean, flagged): ([f64; 2], [f64; 2]), is_rh: &[bool], ablated: &[bool], loss_type: LossType, wanted: impl Fn(&str) -> bool) -> BTreeMap<String, Tensor> {
    let n = is_rh.len();
    let mut total: BTreeMap<String, Tensor> = grads(config, model).into_iter().map(|(k, v)| (k, v.zeros_like())).collect();
    let classes: [(&str, Vec<usize>); 3] = [
        ("clean", (0..n).filter(|&i| !is_rh[i] && !ablated[i]).collect()),
        ("ablated", (0..n).filter(|&i| ablated[i]).collect()),
        ("flagged", (0..n).filter(|&i| is_rh[i]).collect()),
    ];
    let g = &b.generation;
    for (class, rows) in classes.iter().filter(|(class, rows)| !rows.is_empty() && wanted(class)) {
        zero_grads(config, model);
        let index = Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>());
        let pick = |t: &Tensor| t.index_select(0, &index);
        let forget_scale = if *class == "ablated" { 0.0 } else { 1.0 };
        let ctl = [AdapterCtl::on(), AdapterCtl::new(RowScale::All(forget_scale), smallrl::model::linear::RowLearn::All)];
        let (prompt_ids, prompt_mask, completion_ids, completion_mask) = (pick(&g.prompt_ids), pick(&g.prompt_mask), pick(&g.completion_ids), pick(&g.completion_mask));
        let seqs = engine::Sequences { prompt_ids: &prompt_ids, prompt_mask: &prompt_mask, completion_ids: &completion_ids, completion_mask: &completion_mask, kept: None };
        let lp = engine::completion_logprobs(model, seqs, 1.0, &ctl);
        let ones = vec![Tensor::ones([rows.len() as i64], (Kind::Float, Device::Cpu))];
        let loss = grpo::grpo_loss(&lp.logprobs, None, None, &pick(&b.advantages), (&pick(&g.completion_mask)).into(), &ones, &settings(loss_type)).loss;
        (loss * (rows.len() as f64 / n as f64)).backward();
        let weights = if *class == "flagged" { flagged } else { clean };
        for (name, grad) in grads(config, model) {
            let slot = config.slot_of(&name).expect("adapter tensors have a slot");
            let weight = weights[if slot == RETAIN { 0 } else { 1 }];
            if weight != 0.0 {
                total.insert(name.clone(), &total[&name] + grad * weight);
            }
        }
    }
    total
}

/// Each parameter's gradient against its own scale (a small gradient cannot hide behind a large
/// one); a masked (all-zero) reference gradient must be zero up to 1e-9 of the largest one.
fn assert_same(label: &str, ours: &BTreeMap<String, Tensor>, reference: &BTreeMap<String, Tensor>) {
    assert_within(label, ours, reference, 1e-5);
}

/// [`assert_same`] with `relative` of each parameter's own scale.
fn assert_within(label: &str, ours: &BTreeMap<String, Tensor>, reference: &BTreeMap<String, Tensor>, relative: f64) {
    let largest = reference.values().map(|g| g.abs().max().double_value(&[])).fold(0.0, f64::max);
    assert!(largest > 0.0, "{label}: the reference gradient is all zeros");
    for (name, grad) in ours {
        let scale = reference[name].abs().max().double_value(&[]);
        let diff = max_abs_diff(grad, &reference[name]);
        assert!(diff <= relative * scale + 1e-9 * largest, "{label}: gradient of {name} differs by {diff} (its scale {scale})");
    }
}
