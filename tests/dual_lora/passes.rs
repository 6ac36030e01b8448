//! Gradients of whole passes: the gradient noise scale and a stacked backward pass.

use super::*;

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
    let lp = engine::completion_logprobs(model, g.into(), 1.0, &plan.ctl);
    let per_row: Vec<Tensor> = (0..rows)
        .map(|i| {
            let row = Tensor::zeros([rows], (Kind::Float, Device::Cpu)).index_fill(0, &Tensor::from_slice(&[i]), 1.0);
            let weights = grpo::row_token_weights(&g.completion_mask, &plan.classes, settings.aggregation, &row);
            flat_gradient(&config, model, &grpo::weighted_loss(&lp.logprobs, None, None, &b.advantages, (&g.completion_mask).into(), &weights, &settings).loss)
        })
        .collect();
    let batch = engine::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, sampling_logprobs: None, old_is_sampler: false, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes, entropy_coef: None };
    // The two halves (gradient_accumulation_steps 1), and two and four micro-batches.
    for passes in [engine::Passes { micro_batches: 1, splits: 2 }, engine::Passes { micro_batches: 2, splits: 1 }, engine::Passes { micro_batches: 4, splits: 1 }] {
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
        engine::backward_passes(model, &batch, 1.0, &settings, passes, &mut |_, _| {}, &mut after_backward);
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
/// `engine::backward_stacked`) gives each run the log-probabilities and gradients of its own pass
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
        let batches: Vec<(Routed, routing::RoutePlan, Objective)> = runs
            .iter()
            .zip(prompts)
            .zip(&routes)
            .zip(loss_types)
            .enumerate()
            .map(|(run, (((run_model, prompt), (mode, is_rh, ablated)), loss_type))| {
                let (loaded, config) = run_model;
                let prompt = loaded.tokenizer.encode(prompt).unwrap();
                let params = SamplingParams { max_new_tokens: 12 + 6 * run, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
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
        fn loss_batch((b, plan, _): &(Routed, routing::RoutePlan, Objective)) -> engine::LossBatch<'_> {
            let g = &b.generation;
            engine::LossBatch { seqs: g.into(), ctl: &plan.ctl, old_logprobs: None, ref_logprobs: None, sampling_logprobs: None, old_is_sampler: false, advantages: &b.advantages, loss_mask: &g.completion_mask, classes: &plan.classes, entropy_coef: None }
        }
        let alone: Vec<(engine::BackwardPass, BTreeMap<String, Tensor>)> = runs
            .iter()
            .zip(&batches)
            .zip(temperatures)
            .map(|(((loaded, config), batch), temperature)| {
                zero_grads(config, &loaded.model);
                let pass = engine::backward_micro_batches(&loaded.model, &loss_batch(batch), temperature, &batch.2, 1, &mut |_, _| {});
                (pass, grads(config, &loaded.model))
            })
            .collect();
        for (loaded, config) in &runs {
            zero_grads(config, &loaded.model);
        }
        let models: Vec<&Llama> = runs.iter().map(|(loaded, _)| &loaded.model).collect();
        let settings: Vec<&Objective> = batches.iter().map(|b| &b.2).collect();
        let passes = engine::backward_stacked(&models, &batches.iter().map(loss_batch).collect::<Vec<_>>(), &temperatures, &settings);
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
