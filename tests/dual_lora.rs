//! DualLoRA, DualMLP and gradient routing: adapter scales behave as the formula says (also
//! through the fused decoder and a merged HF export), and a routed single-pass step has exactly
//! the gradients of the original's per-class backward passes.

mod common;

use std::collections::BTreeMap;

use common::{fixture, max_abs_diff, one_thread};
use smallrl::adapters::{AdapterConfig, FORGET, RETAIN};
use smallrl::grpo::{self, LossSettings, LossType};
use smallrl::model::decode::DecodeModel;
use smallrl::model::export::save_hf_dir;
use smallrl::model::generate::{Generation, SamplingParams, generate};
use smallrl::model::linear::{AdapterCtl, RowScale};
use smallrl::model::{self, Llama, LoadedModel};
use smallrl::routing::{self, RoutingMode, RowWeights};
use smallrl::train::TrainConfig;
use tch::{Device, Kind, Tensor};

fn load() -> LoadedModel {
    one_thread();
    model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap()
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
    let builders: [(&str, fn(&mut Llama) -> AdapterConfig); 2] = [("dual-lora", dual_lora), ("dual-mlp", dual_mlp)];
    builders
        .into_iter()
        .map(|(name, build)| {
            let mut loaded = load();
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
    let params = SamplingParams { max_new_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0 };
    let generation = generate(&DecodeModel::new(&loaded.model, &[1.0, 1.0]), &vec![prompt; 8], &params, 9).unwrap();
    tch::manual_seed(4);
    let advantages = Tensor::randn([8], (Kind::Float, Device::Cpu));
    Routed { generation, advantages }
}

fn settings(loss_type: LossType) -> LossSettings {
    LossSettings { beta: 0.0, loss_type, max_completion_length: 24, ..TrainConfig::default().loss_settings() }
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
    let lp = grpo::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
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
    let batch = grpo::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes };
    grpo::backward_micro_batches(model, &batch, 1.0, &settings(loss_type), micro_batches, &mut |_, _| {});
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
    // The routing table of the README, by hand: (retain, forget) on clean and flagged rows.
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
        let ctl = [AdapterCtl::on(), AdapterCtl { scale: RowScale::All(forget_scale), learn: smallrl::model::linear::RowLearn::All }];
        let (prompt_ids, prompt_mask, completion_ids, completion_mask) = (pick(&g.prompt_ids), pick(&g.prompt_mask), pick(&g.completion_ids), pick(&g.completion_mask));
        let seqs = grpo::Sequences { prompt_ids: &prompt_ids, prompt_mask: &prompt_mask, completion_ids: &completion_ids, completion_mask: &completion_mask };
        let lp = grpo::completion_logprobs(model, seqs, 1.0, &ctl);
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
    let largest = reference.values().map(|g| g.abs().max().double_value(&[])).fold(0.0, f64::max);
    assert!(largest > 0.0, "{label}: the reference gradient is all zeros");
    for (name, grad) in ours {
        let scale = reference[name].abs().max().double_value(&[]);
        let diff = max_abs_diff(grad, &reference[name]);
        assert!(diff <= 1e-5 * scale + 1e-9 * largest, "{label}: gradient of {name} differs by {diff} (its scale {scale})");
    }
}

#[test]
fn routed_gradients_equal_per_class_backward_passes() {
    for (kind, loaded, config) in dual_adapters() {
        routed_equal_per_class(kind, &loaded, &config);
    }
}

fn routed_equal_per_class(kind: &str, loaded: &LoadedModel, config: &AdapterConfig) {
    let b = batch(loaded);
    let is_rh = [false, true, false, false, true, false, true, false];
    let ablated = [false, false, true, false, false, false, false, true];
    let none = [false; 8];
    for mode in [RoutingMode::None, RoutingMode::Classic, RoutingMode::Exclusive] {
        for loss_type in [LossType::Grpo, LossType::Dapo] {
            let ablation: &[bool] = if mode == RoutingMode::None { &none } else { &ablated };
            let label = format!("{kind} {mode:?}/{loss_type:?}");
            let ours = routed_grads(&loaded.model, config, &b, mode, &is_rh, ablation, loss_type);
            let reference = per_class_grads(&loaded.model, config, &b, mode, &is_rh, ablation, loss_type);
            assert_same(&label, &ours, &reference);
            // grpo's and dapo's weights do not depend on micro-batching (only bnpo's do).
            let micro = micro_batched_grads(&loaded.model, &config, &b, (mode, &is_rh, ablation), loss_type, 2);
            assert_same(&format!("{label}, two micro-batches"), &micro, &reference);
        }
    }
}

/// The absorption diagnostics (`absorption/<adapter>/grad_norm[_flagged|_unflagged]`): each
/// adapter's gradient norm from the routed pass, and from the flagged and unflagged samples'
/// loss terms through the kept graph, against the per-class backward passes of the reference
/// (norms in float64, relative 1e-5).
#[test]
fn per_adapter_gradient_norms_equal_separate_backward_passes() {
    let mut loaded = load();
    let config = dual_lora(&mut loaded.model);
    let b = batch(&loaded);
    let model = &loaded.model;
    let is_rh = [false, true, false, false, true, false, true, false];
    let ablated = [false, false, true, false, false, false, false, true];
    let norms = |grads: &BTreeMap<String, Tensor>| config.slot_norms(&grads.iter().map(|(k, v)| (k.clone(), v.shallow_clone())).collect::<Vec<_>>());
    for mode in [RoutingMode::Classic, RoutingMode::Exclusive] {
        zero_grads(&config, model);
        let plan = routing::plan(&config, RowWeights::gates(mode), &routing::Labels::routed(is_rh.to_vec(), ablated.to_vec()), Device::Cpu);
        let g = &b.generation;
        let lp = grpo::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
        let flagged = routing::row_mask(&is_rh, Device::Cpu);
        let loss_of = |rows: &Tensor| {
            let weights = grpo::row_token_weights(&g.completion_mask, &plan.classes, &settings(LossType::Grpo), rows);
            grpo::weighted_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &weights, &settings(LossType::Grpo)).loss
        };
        let ours_flagged = config.slot_gradient_norms(model, &loss_of(&flagged));
        let ours_unflagged = config.slot_gradient_norms(model, &loss_of(&(1.0 - &flagged)));
        loss_of(&flagged.ones_like()).backward();
        let ours_total = norms(&grads(&config, model));
        let reference_total = norms(&per_class_grads(model, &config, &b, mode, &is_rh, &ablated, LossType::Grpo));
        let reference_flagged = norms(&per_class_grads_of(model, &config, &b, mode, &is_rh, &ablated, LossType::Grpo, |c| c == "flagged"));
        let reference_unflagged = norms(&per_class_grads_of(model, &config, &b, mode, &is_rh, &ablated, LossType::Grpo, |c| c != "flagged"));
        for (label, ours, reference) in [("total", &ours_total, &reference_total), ("flagged", &ours_flagged, &reference_flagged), ("unflagged", &ours_unflagged, &reference_unflagged)] {
            let largest = reference.iter().copied().fold(0.0, f64::max);
            assert!(largest > 0.0, "{mode:?} {label}: the reference is all zeros");
            for slot in [RETAIN, FORGET] {
                let diff = (ours[slot] - reference[slot]).abs();
                assert!(diff <= 1e-5 * reference[slot] + 1e-9 * largest, "{mode:?} {label} slot {slot}: {} vs {} (diff {diff})", ours[slot], reference[slot]);
            }
        }
        assert_eq!(ours_flagged[RETAIN], 0.0, "{mode:?}: retain learns nothing from flagged samples");
        if mode == RoutingMode::Exclusive {
            assert_eq!(ours_unflagged[FORGET], 0.0, "exclusive: forget learns nothing from clean samples");
        }
    }
}

/// The original's balanced renormalisation (RENORMALIZATION.md #2, `routing_grad_mask_weights`):
/// the surviving adapter learns kappa times its per-class gradient where the other is masked.
/// With r8/r4 LoRA ranks and 6/3 MLP neurons kappa is (1.5, 3): classic flagged rows give
/// forget 3x, exclusive clean rows give retain 1.5x.
#[test]
fn balanced_weights_scale_the_per_class_gradients() {
    let is_rh = [false, true, false, false, true, false, true, false];
    let ablated = [false, false, true, false, false, false, false, true];
    for (kind, loaded, config) in dual_adapters() {
        let b = batch(&loaded);
        let kappas = routing::adapter_kappas(config.ranks[0], config.ranks[1]);
        for (mode, clean, flagged) in [(RoutingMode::Classic, [1.0, 1.0], [0.0, 3.0]), (RoutingMode::Exclusive, [1.5, 0.0], [0.0, 3.0])] {
            for loss_type in [LossType::Grpo, LossType::Dapo] {
                let label = format!("balanced {kind} {mode:?}/{loss_type:?}");
                let ours = weighted_grads(&loaded.model, &config, &b, routing::balanced_weights(mode, kappas), &is_rh, &ablated, loss_type);
                let reference = scaled_per_class_grads(&loaded.model, &config, &b, (clean, flagged), &is_rh, &ablated, loss_type, |_| true);
                assert_same(&label, &ours, &reference);
            }
        }
    }
}

#[test]
fn flagged_only_batch_leaves_retain_untouched() {
    for (kind, loaded, config) in dual_adapters() {
        let b = batch(&loaded);
        let grads = routed_grads(&loaded.model, &config, &b, RoutingMode::Classic, &[true; 8], &[false; 8], LossType::Grpo);
        for (name, grad) in &grads {
            let is_zero = grad.abs().max().double_value(&[]) == 0.0;
            match config.slot_of(name) {
                Some(RETAIN) => assert!(is_zero, "{kind} {name}: retain must get exactly zero gradient from flagged samples"),
                _ => assert!(!is_zero, "{kind} {name}: forget must learn from flagged samples"),
            }
        }
    }
}

#[test]
fn ablated_rows_train_retain_on_the_forget_ablated_output() {
    let mut loaded = load();
    let config = dual_lora(&mut loaded.model);
    let b = batch(&loaded);
    // All rows clean and ablated: forget is off in the forward pass, so it learns nothing and
    // retain's gradient is that of the model with only retain switched on.
    let routed = routed_grads(&loaded.model, &config, &b, RoutingMode::Classic, &[false; 8], &[true; 8], LossType::Grpo);
    zero_grads(&config, &loaded.model);
    let g = &b.generation;
    let ctl = [AdapterCtl::on(), AdapterCtl::off()];
    let lp = grpo::completion_logprobs(&loaded.model, g.into(), 1.0, &ctl);
    let ones = vec![Tensor::ones([8], (Kind::Float, Device::Cpu))];
    grpo::grpo_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &ones, &settings(LossType::Grpo)).loss.backward();
    let retain_only = grads(&config, &loaded.model);
    assert_same("ablated", &routed, &retain_only);
    for (name, grad) in &routed {
        if config.slot_of(name) == Some(FORGET) {
            assert_eq!(grad.abs().max().double_value(&[]), 0.0, "{name}: ablated forget must not learn");
        }
    }
}

/// The filter as the trainer applies it (loss mask, loss classes from the labels), on
/// hand-made log-probabilities: the flagged rows' log-probabilities get exactly zero
/// gradient (policy term and KL), and the loss is the kept rows' loss alone weighted
/// n_kept / n.
#[test]
fn a_filtered_sample_contributes_no_gradient() {
    use smallrl::grpo::grpo_loss;
    use smallrl::intervention::filtered_loss_mask;
    let device = Device::Cpu;
    let flagged = [false, true, false, false, true, false];
    let kept_rows: Vec<bool> = flagged.iter().map(|f| !f).collect();
    let kept = routing::row_mask(&kept_rows, device);
    tch::manual_seed(3);
    let logprobs = (Tensor::randn([6, 5], (Kind::Float, device)) * 0.3 - 1.0).set_requires_grad(true);
    let reference = Tensor::randn([6, 5], (Kind::Float, device)) * 0.3 - 1.0;
    let advantages = Tensor::from_slice(&[0.5f32, 2.0, -0.7, 0.1, 1.5, -1.2]);
    let completion_mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]).view([6, 5]);
    let loss_mask = filtered_loss_mask(&completion_mask, &kept);
    let plan = routing::plan(&AdapterConfig::full(), RowWeights::gates(RoutingMode::None), &routing::Labels::routed(flagged.to_vec(), vec![false; 6]), device);
    for loss_type in [LossType::Grpo, LossType::Dapo, LossType::DrGrpo] {
        let settings = LossSettings { beta: 0.1, max_completion_length: 5, ..settings(loss_type) };
        let loss = grpo_loss(&logprobs, None, Some(&reference), &advantages, (&loss_mask).into(), &plan.classes, &settings).loss;
        let grad = Tensor::run_backward(&[&loss], &[&logprobs], false, false).remove(0);
        for (row, &is_flagged) in flagged.iter().enumerate() {
            let row_grad = grad.get(row as i64).abs().sum(Kind::Float).double_value(&[]);
            assert_eq!(row_grad == 0.0, is_flagged, "{loss_type:?} row {row}: gradient {row_grad}");
        }
        // The kept rows alone, as a batch of their own, weighted n_kept / n = 4 / 6.
        let index = Tensor::from_slice(&[0i64, 2, 3, 5]);
        let pick = |t: &Tensor| t.index_select(0, &index);
        let ones = [Tensor::ones([4], (Kind::Float, device))];
        let alone = grpo_loss(&pick(&logprobs), None, Some(&pick(&reference)), &pick(&advantages), (&pick(&completion_mask)).into(), &ones, &settings).loss;
        let expected = alone.double_value(&[]) * 4.0 / 6.0;
        assert!((loss.double_value(&[]) - expected).abs() < 1e-6, "{loss_type:?}: {} vs {expected}", loss.double_value(&[]));
    }
}

/// Coherence rows (the original's interlaced coherence: forget forward-off, retain alone
/// learning, the detector ignored) get the per-class reference's gradients of clean rows with
/// the forget adapter off, even when flagged (row 6 here).
#[test]
fn coherence_rows_train_retain_alone_with_forget_off() {
    let is_rh = [false, true, false, false, true, false, true, false];
    let coherence = [false, false, true, false, false, false, true, false];
    for (kind, loaded, config) in dual_adapters() {
        let b = batch(&loaded);
        let labels = routing::Labels { is_rh: is_rh.to_vec(), ablated: vec![false; 8], coherence: coherence.to_vec(), dropped: vec![false; 8] };
        zero_grads(&config, &loaded.model);
        let plan = routing::plan(&config, RowWeights::gates(RoutingMode::Classic), &labels, Device::Cpu);
        let g = &b.generation;
        let lp = grpo::completion_logprobs(&loaded.model, g.into(), 1.0, &plan.ctl);
        grpo::grpo_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &plan.classes, &settings(LossType::Dapo)).loss.backward();
        let ours = grads(&config, &loaded.model);
        let as_clean: Vec<bool> = (0..8).map(|i| is_rh[i] && !coherence[i]).collect();
        let reference = per_class_grads(&loaded.model, &config, &b, RoutingMode::Classic, &as_clean, &coherence, LossType::Dapo);
        assert_same(&format!("{kind} coherence"), &ours, &reference);
    }
}

/// Every trainable tensor's gradient of `loss` (zeros where it has none), flattened into one
/// float64 vector; the graph is kept for the next call.
fn flat_gradient(config: &AdapterConfig, model: &Llama, loss: &Tensor) -> Tensor {
    let params = config.trainable(model);
    let tensors: Vec<&Tensor> = params.iter().map(|(_, t)| t).collect();
    let grads = Tensor::run_backward(&[loss], &tensors, true, false);
    let flat: Vec<Tensor> = grads.iter().zip(&tensors).map(|(g, t)| smallrl::adapters::gradient_or_zeros(g.shallow_clone(), t).to_kind(Kind::Double).reshape([-1])).collect();
    Tensor::cat(&flat, 0)
}

#[test]
fn the_gradient_noise_scale_follows_mccandlish_from_per_row_gradients() {
    // A routed DualLoRA step (classic, two flagged rows, one ablated), grpo: each row's term of
    // the loss is the loss with its classes restricted to that row (grpo's weights do not
    // depend on the class sizes), so per-row gradients come from one forward pass.
    let mut loaded = load();
    let config = dual_lora(&mut loaded.model);
    let model = &loaded.model;
    let b = batch(&loaded);
    let rows = 8;
    let is_rh = [false, true, false, false, false, false, true, false];
    let ablated = [false, false, true, false, false, false, false, false];
    let plan = routing::plan(&config, RowWeights::gates(RoutingMode::Classic), &routing::Labels::routed(is_rh.to_vec(), ablated.to_vec()), Device::Cpu);
    let settings = settings(LossType::Grpo);
    let g = &b.generation;
    let lp = grpo::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
    let per_row: Vec<Tensor> = (0..rows)
        .map(|i| {
            let row = Tensor::zeros([rows], (Kind::Float, Device::Cpu)).index_fill(0, &Tensor::from_slice(&[i]), 1.0);
            let weights = grpo::row_token_weights(&g.completion_mask, &plan.classes, &settings, &row);
            flat_gradient(&config, model, &grpo::weighted_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &weights, &settings).loss)
        })
        .collect();
    let batch = grpo::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes };
    // The two halves (gradient_accumulation_steps 1), and two and four micro-batches.
    for passes in [grpo::Passes { micro_batches: 1, splits: 2 }, grpo::Passes { micro_batches: 2, splits: 1 }, grpo::Passes { micro_batches: 4, splits: 1 }] {
        // McCandlish et al. (2018), appendix A.1, in float64: part j's gradient estimate from
        // B_small rows is k times its rows' share of the batch loss.
        let k = passes.count();
        let norm_sq = |t: &Tensor| t.square().sum(Kind::Double).double_value(&[]);
        let part = |j: usize| per_row[j * rows as usize / k..(j + 1) * rows as usize / k].iter().fold(Tensor::zeros_like(&per_row[0]), |sum, g| sum + g);
        let small_sq = (0..k).map(|j| norm_sq(&(part(j) * k as f64))).sum::<f64>() / k as f64;
        let big_sq = norm_sq(&per_row.iter().fold(Tensor::zeros_like(&per_row[0]), |sum, g| sum + g));
        let (b_big, b_small) = (rows as f64, rows as f64 / k as f64);
        let grad_squared = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
        let trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);

        zero_grads(&config, model);
        let trained: Vec<Tensor> = config.trainable(model).into_iter().map(|(_, t)| t).collect();
        let mut gradients = smallrl::probes::PassGradients::default();
        let mut after_backward = || {
            let accumulated = trained.iter().map(|t| smallrl::adapters::gradient_or_zeros(t.grad(), t)).collect();
            let last = gradients.pass_squared_norms.len() + 1 == k;
            gradients.record(accumulated, last);
        };
        grpo::backward_passes(model, &batch, 1.0, &settings, passes, &mut |_, _| {}, &mut after_backward);
        let ours = smallrl::probes::NoiseScale::from_passes(&gradients, rows as usize);
        // Bounds relative to the float64 terms each estimate is a difference of.
        let grad_bound = 1e-5 * (b_big * big_sq + b_small * small_sq) / (b_big - b_small);
        let trace_bound = 1e-5 * (small_sq + big_sq) / (1.0 / b_small - 1.0 / b_big);
        let (grad_error, trace_error) = ((ours.grad_squared - grad_squared).abs(), (ours.trace - trace).abs());
        println!("{passes:?}: |G|² {:.6e} (f64 {grad_squared:.6e}, error {grad_error:.1e}, bound {grad_bound:.1e}), tr {:.6e} (f64 {trace:.6e}, error {trace_error:.1e}, bound {trace_bound:.1e})", ours.grad_squared, ours.trace);
        assert!(grad_error <= grad_bound && trace_error <= trace_bound, "{passes:?}: ours {ours:?}, float64 |G|² {grad_squared}, tr {trace}");
        assert!(trace > 0.0 && ours.simple().is_finite(), "{passes:?}: rows that differ must show noise");
    }
}

/// How far a stacked pass's gradient may be from the run's own pass, absolutely, in any element:
/// float32 rounding of other matrix-product shapes (measured: up to 1.2e-6, the embedding table
/// of full fine-tuning), where another run's or a wrongly routed gradient is off by the
/// gradient itself (about 1e-2 to 1).
const STACKED_GRADIENT_TOLERANCE: f64 = 1e-5;

/// One backward pass of three runs stacked on a leading axis (`Llama::stacked`,
/// `grpo::backward_stacked`) gives each run the log-probabilities and gradients of its own pass
/// alone: runs with their own weights (every base and adapter tensor perturbed), prompts and
/// completions of different widths (the stacked batch pads them), routing plans (per-row
/// scales and learning rows that differ between the runs), temperatures and loss types. DualLoRA,
/// DualMLP and full fine-tuning (the head and the embeddings learn through the stacked tables).
#[test]
fn a_stacked_backward_pass_gives_each_run_its_own_gradients() {
    let full = |model: &mut Llama| {
        smallrl::adapters::set_base_trainable(model, true);
        AdapterConfig::full()
    };
    let builders: [(&str, &dyn Fn(&mut Llama) -> AdapterConfig); 3] = [("dual-lora", &dual_lora), ("dual-mlp", &dual_mlp), ("full", &full)];
    let prompts = ["once upon a time", "a little girl named lily found a ball in the", "the dog"];
    let routes = [(RoutingMode::Classic, [false, true, false, false, true, false, false, false], [false; 8]), (RoutingMode::Exclusive, [true, false, false, false, false, false, true, false], [false, false, true, false, false, false, false, false]), (RoutingMode::None, [false; 8], [false; 8])];
    let temperatures = [1.0, 0.7, 1.0];
    let loss_types = [LossType::Grpo, LossType::Dapo, LossType::Bnpo];
    for (kind, build) in builders {
        let runs: Vec<(LoadedModel, AdapterConfig)> = (0..3)
            .map(|run| {
                let mut loaded = load();
                let config = build(&mut loaded.model);
                tch::manual_seed(100 + run);
                tch::no_grad(|| {
                    let base = loaded.model.base_tensors().into_iter().map(|(_, t)| t.shallow_clone());
                    for tensor in base.chain(config.trainable(&loaded.model).into_iter().map(|(_, t)| t)) {
                        let noise = tensor.randn_like() * tensor.abs().mean(Kind::Float) * 0.1;
                        let _ = tensor.shallow_clone().g_add_(&noise);
                    }
                });
                (loaded, config)
            })
            .collect();
        let batches: Vec<(Routed, routing::RoutePlan, LossSettings)> = runs
            .iter()
            .zip(prompts)
            .zip(&routes)
            .zip(loss_types)
            .enumerate()
            .map(|(run, (((run_model, prompt), (mode, is_rh, ablated)), loss_type))| {
                let (loaded, config) = run_model;
                let prompt = loaded.tokenizer.encode(prompt).unwrap();
                let params = SamplingParams { max_new_tokens: 12 + 6 * run, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0 };
                let scales = vec![1.0; loaded.model.adapter_slots()];
                let generation = generate(&DecodeModel::new(&loaded.model, &scales), &vec![prompt; 8], &params, 9 + run as u64).unwrap();
                tch::manual_seed(4 + run as i64);
                let advantages = Tensor::randn([8], (Kind::Float, Device::Cpu));
                let plan = routing::plan(config, RowWeights::gates(*mode), &routing::Labels::routed(is_rh.to_vec(), ablated.to_vec()), Device::Cpu);
                (Routed { generation, advantages }, plan, settings(loss_type))
            })
            .collect();
        let widths: Vec<i64> = batches.iter().map(|(b, ..)| b.generation.prompt_ids.size()[1] + b.generation.completion_ids.size()[1]).collect();
        assert!(widths[0] != widths[1] && widths[1] != widths[2], "{kind}: the runs' sequences differ in width: {widths:?}");
        fn loss_batch((b, plan, _): &(Routed, routing::RoutePlan, LossSettings)) -> grpo::LossBatch<'_> {
            let g = &b.generation;
            grpo::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes }
        }
        let alone: Vec<(grpo::BackwardPass, BTreeMap<String, Tensor>)> = runs
            .iter()
            .zip(&batches)
            .zip(temperatures)
            .map(|(((loaded, config), batch), temperature)| {
                zero_grads(config, &loaded.model);
                let pass = grpo::backward_micro_batches(&loaded.model, &loss_batch(batch), temperature, &batch.2, 1, &mut |_, _| {});
                (pass, grads(config, &loaded.model))
            })
            .collect();
        for (loaded, config) in &runs {
            zero_grads(config, &loaded.model);
        }
        let models: Vec<&Llama> = runs.iter().map(|(loaded, _)| &loaded.model).collect();
        let settings: Vec<&LossSettings> = batches.iter().map(|b| &b.2).collect();
        let passes = grpo::backward_stacked(&models, &batches.iter().map(loss_batch).collect::<Vec<_>>(), &temperatures, &settings);
        for (run, (((loaded, config), pass), (solo, solo_grads))) in runs.iter().zip(passes).zip(&alone).enumerate() {
            let label = format!("{kind} run {run}");
            let logprob_diff = max_abs_diff(&pass.logprobs.logprobs, &solo.logprobs.logprobs);
            assert!(logprob_diff <= 1e-4, "{label}: log-probabilities differ by {logprob_diff}");
            let loss_diff = (pass.terms.loss.double_value(&[]) - solo.terms.loss.double_value(&[])).abs();
            assert!(loss_diff <= 1e-6, "{label}: the loss differs by {loss_diff}");
            for (name, grad) in grads(config, &loaded.model) {
                let diff = max_abs_diff(&grad, &solo_grads[&name]);
                assert!(diff <= STACKED_GRADIENT_TOLERANCE, "{label}: gradient of {name} differs by {diff}");
            }
        }
    }
}
