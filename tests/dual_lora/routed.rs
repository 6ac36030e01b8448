//! Routed gradients equal the original's per-class backward passes, for each class of row.

use super::*;

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
        let lp = engine::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
        let flagged = routing::row_mask(&is_rh, Device::Cpu);
        let loss_of = |rows: &Tensor| {
            let weights = grpo::row_token_weights(&g.completion_mask, &plan.classes, settings(LossType::Grpo).aggregation, rows);
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

/// `split_moment` in one pass (`routing::plan_with_natural`): the routed pass of a balanced
/// plan leaves the routed gradient in the parameters, and the natural share's leaves the rest of
/// the natural plan's (every adapter learning from every row), whole and in two micro-batches:
/// both against the original's per-class backward passes, in float64 (the weights kappa
/// (1.5, 3) of r8/r4 ranks and 6/3 neurons).
#[test]
fn one_routed_pass_gives_split_moments_natural_gradient() {
    let is_rh = [false, true, false, false, true, false, true, false];
    let ablated = [false, false, true, false, false, false, false, true];
    for (kind, loaded, config) in dual_adapters_in(Kind::Double) {
        let b = batch(&loaded);
        let model = &loaded.model;
        let kappas = routing::adapter_kappas(config.ranks[0], config.ranks[1]);
        let labels = routing::Labels::routed(is_rh.to_vec(), ablated.to_vec());
        for (mode, clean, flagged) in [(RoutingMode::Classic, [1.0, 1.0], [0.0, 3.0]), (RoutingMode::Exclusive, [1.5, 0.0], [0.0, 3.0])] {
            let routed_reference = scaled_per_class_grads(model, &config, &b, (clean, flagged), &is_rh, &ablated, LossType::Dapo, |_| true);
            let natural_reference = scaled_per_class_grads(model, &config, &b, ([1.0, 1.0], [1.0, 1.0]), &is_rh, &ablated, LossType::Dapo, |_| true);
            let largest = natural_reference.values().map(|g| g.abs().max().double_value(&[])).fold(0.0, f64::max);
            let gap = natural_reference.iter().map(|(name, g)| max_abs_diff(g, &routed_reference[name])).fold(0.0, f64::max);
            assert!(gap > 0.1 * largest, "{kind} {mode:?}: the natural and routed gradients differ ({gap} of {largest}), so the test tells them apart");
            for micro_batches in [1, 2] {
                let label = format!("{kind} {mode:?}, {micro_batches} micro-batch(es)");
                zero_grads(&config, model);
                let plan = routing::plan_with_natural(&config, routing::balanced_weights(mode, kappas), Some(RowWeights::gates(RoutingMode::None)), &labels, Device::Cpu);
                let g = &b.generation;
                let batch = engine::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, sampling_logprobs: None, old_is_sampler: false, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes, entropy_coef: None };
                engine::backward_micro_batches(model, &batch, 1.0, &settings(LossType::Dapo), micro_batches, &mut |_, _| {});
                let routed = grads(&config, model);
                let (names, params): (Vec<String>, Vec<Tensor>) = config.trainable(model).into_iter().unzip();
                let natural: BTreeMap<String, Tensor> = names.into_iter().zip(plan.natural.as_ref().expect("a natural plan's leaves").take_gradients(&params)).collect();
                assert_within(&format!("{label}: routed"), &routed, &routed_reference, 1e-10);
                assert_within(&format!("{label}: natural"), &natural, &natural_reference, 1e-10);
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
    let lp = engine::completion_logprobs(&loaded.model, g.into(), 1.0, &ctl);
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
        let settings = Objective { kl: Some(grpo::KlPenalty { beta: 0.1, estimator: grpo::KlEstimator::K3, bias_correction: false }), aggregation: Aggregation::of(loss_type, 5), ..settings(loss_type) };
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
        let labels = routing::Labels { is_rh: is_rh.to_vec(), ablated: vec![false; 8], coherence: coherence.to_vec(), dropped: vec![false; 8], unscored: vec![false; 8] };
        zero_grads(&config, &loaded.model);
        let plan = routing::plan(&config, RowWeights::gates(RoutingMode::Classic), &labels, Device::Cpu);
        let g = &b.generation;
        let lp = engine::completion_logprobs(&loaded.model, g.into(), 1.0, &plan.ctl);
        grpo::grpo_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &plan.classes, &settings(LossType::Dapo)).loss.backward();
        let ours = grads(&config, &loaded.model);
        let as_clean: Vec<bool> = (0..8).map(|i| is_rh[i] && !coherence[i]).collect();
        let reference = per_class_grads(&loaded.model, &config, &b, RoutingMode::Classic, &as_clean, &coherence, LossType::Dapo);
        assert_same(&format!("{kind} coherence"), &ours, &reference);
    }
}
