//! The sketched Fisher kernel (`fisher_kernel_every`, `train::fisher`): the sketch against the
//! exact Gram matrix of per-sequence gradients computed another way (each sequence alone,
//! unpadded, full log-softmax in float64), its error against what CountSketch's variance
//! predicts at each sketch size, the summary metrics against numpy and hand-computed values, and
//! a training run whose trajectory the probe leaves bit for bit unchanged.

mod common;

use std::path::Path;

use common::{fixture, one_thread};
use serde_json::{Map, Value, json};
use smallrl::adapters::{self, AdapterConfig};
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Generation, SamplingParams, generate};
use smallrl::model::{self, LoadedModel};
use smallrl::train::fisher::{self, CountSketch, FisherSummary};
use smallrl::train::metrics::key;
use smallrl::train::{TrainConfig, Trainer};
use tch::{Device, Kind, Tensor};

const TEMPERATURE: f64 = 0.7;

/// tiny-random, fully trainable, with 8 sampled completions of three prompts of different
/// lengths (so prompts are left-padded and completions end at different lengths).
fn setup() -> (LoadedModel, Vec<Tensor>, Generation) {
    one_thread();
    let mut loaded = model::load(fixture("tiny-random").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    adapters::set_base_trainable(&mut loaded.model, true);
    let params: Vec<Tensor> = AdapterConfig::full().trainable(&loaded.model).into_iter().map(|(_, t)| t).collect();
    let texts = ["once upon a time", "the dog", "a little girl named lily found a ball in the park"];
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| loaded.tokenizer.encode(texts[i % 3]).unwrap()).collect();
    let sampling = SamplingParams { max_new_tokens: 12, temperature: TEMPERATURE, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let generation = generate(&DecodeModel::new(&loaded.model, &[]), &prompts, &sampling, 3).unwrap();
    (loaded, params, generation)
}

/// Each sequence's gradient of its total log-probability over the completion tokens `counted`
/// marks (`[n, completion_len]` 0/1), `[n, n_params]`, computed apart from the engine in
/// float64: the fixture's weights loaded as float64 (only the RMS normalisation rounds through
/// float32, as `llama::rms_norm` computes it), the sequence alone without padding (every
/// completion token in it, counted or not), logits of the whole vocabulary divided by the
/// temperature, log-softmaxed.
fn exact_gradients(g: &Generation, counted: &Tensor) -> Tensor {
    let mut loaded = model::load(fixture("tiny-random").to_str().unwrap(), "main", Device::Cpu, Kind::Double).unwrap();
    adapters::set_base_trainable(&mut loaded.model, true);
    let params: Vec<Tensor> = AdapterConfig::full().trainable(&loaded.model).into_iter().map(|(_, t)| t).collect();
    let params = &params;
    let rows = g.completion_ids.size()[0];
    let mut out = Vec::new();
    for i in 0..rows {
        let real = |ids: &Tensor, mask: &Tensor| ids.get(i).masked_select(&mask.get(i).to_kind(Kind::Bool));
        let (prompt, completion) = (real(&g.prompt_ids, &g.prompt_mask), real(&g.completion_ids, &g.completion_mask));
        let (p, c) = (prompt.size()[0], completion.size()[0]);
        let ids = Tensor::cat(&[&prompt, &completion], 0).unsqueeze(0);
        let logits = loaded.model.logits(&loaded.model.forward(&ids, &ids.ones_like(), &[])).squeeze_dim(0);
        let logprobs = (logits.to_kind(Kind::Double) / TEMPERATURE).log_softmax(-1, Kind::Double);
        let weights = real(counted, &g.completion_mask).to_kind(Kind::Double);
        let total = (logprobs.narrow(0, p - 1, c).gather(1, &completion.unsqueeze(1), false).squeeze_dim(1) * weights).sum(Kind::Double);
        assert_eq!(total.kind(), Kind::Double);
        let grads = Tensor::run_backward(&[&total], params, false, false);
        let flat: Vec<Tensor> = grads.iter().zip(params).map(|(g, t)| adapters::gradient_or_zeros(g.shallow_clone(), t).to_kind(Kind::Double).reshape([-1])).collect();
        out.push(Tensor::cat(&flat, 0));
    }
    Tensor::stack(&out, 0)
}

fn frobenius(t: &Tensor) -> f64 {
    t.square().sum(Kind::Double).double_value(&[]).sqrt()
}

/// The parameter tensors' sizes, and exact gradients split back into one tensor per parameter.
fn split(params: &[Tensor], flat: &Tensor) -> Vec<Tensor> {
    let mut at = 0;
    params
        .iter()
        .map(|t| {
            let n = t.numel() as i64;
            at += n;
            flat.narrow(0, at - n, n)
        })
        .collect()
}

#[test]
fn the_sketch_estimates_the_exact_gram_matrix_with_countsketch_variance() {
    let (loaded, params, g) = setup();
    let numels: Vec<i64> = params.iter().map(|t| t.numel() as i64).collect();
    let exact = exact_gradients(&g, &g.completion_mask);
    let k = exact.matmul(&exact.tr());
    let k_norm = frobenius(&k);
    // CountSketch: Var(K̂_ij) = (K_ii K_jj + K_ij² - 2 Σ_a g_i[a]² g_j[a]²) / D, summed over i, j.
    let squares = exact.square();
    let trace = k.trace().double_value(&[]);
    let variance_times_d = trace * trace + k_norm * k_norm - 2.0 * squares.matmul(&squares.tr()).sum(Kind::Double).double_value(&[]);
    let expected_error = |dim: usize| (variance_times_d / dim as f64).sqrt() / k_norm;

    // The engine's per-sequence passes: the same sketch as the exact gradients' (the same hash
    // functions) up to float32 rounding, and an error that shrinks with the sketch size.
    let mut pipeline_errors = Vec::new();
    for dim in [64, 4096] {
        let sketch = CountSketch::new(11, &numels, dim, Device::Cpu);
        let ours = fisher::kernel(&fisher::sketch_sequences(&loaded.model, &g, TEMPERATURE, &[], &params, &sketch));
        let exact_rows: Vec<Tensor> = (0..exact.size()[0]).map(|i| sketch.project(&split(&params, &exact.get(i)))).collect();
        let of_exact = fisher::kernel(&Tensor::stack(&exact_rows, 0));
        let rounding = frobenius(&(&ours - &of_exact)) / frobenius(&of_exact);
        let error = frobenius(&(&ours - &k)) / k_norm;
        println!("D {dim}: relative error {error:.4} (expected rms {:.4}), against the exact gradients' sketch {rounding:.2e}", expected_error(dim));
        assert!(rounding < 1e-5, "D {dim}: the engine's sketch is {rounding:e} from the exact gradients' sketch");
        // Markov's inequality on the squared error: above 3x the rms in 1 of 9 draws at most.
        assert!(error < 3.0 * expected_error(dim), "D {dim}: error {error} vs expected rms {}", expected_error(dim));
        pipeline_errors.push(error);
    }
    assert!(pipeline_errors[1] < pipeline_errors[0], "the error does not shrink with the sketch size: {pipeline_errors:?}");

    // Over many draws, the mean squared error is CountSketch's variance at every size (1 / D):
    // within 4 standard errors of the draws' own spread.
    let draws = 24;
    for dim in [16, 64, 256, 1024, 4096] {
        let ratios: Vec<f64> = (0..draws)
            .map(|seed| {
                let sketch = CountSketch::new(1000 + seed, &numels, dim, Device::Cpu);
                let rows: Vec<Tensor> = (0..exact.size()[0]).map(|i| sketch.project(&split(&params, &exact.get(i)))).collect();
                let error = frobenius(&(fisher::kernel(&Tensor::stack(&rows, 0)) - &k)) / k_norm;
                (error / expected_error(dim)).powi(2)
            })
            .collect();
        let mean = ratios.iter().sum::<f64>() / draws as f64;
        let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (draws - 1) as f64).sqrt();
        let standard_error = sd / (draws as f64).sqrt();
        println!("D {dim}: mean squared error / predicted {mean:.3} ± {standard_error:.3}");
        assert!((mean - 1.0).abs() < 4.0 * standard_error.max(0.02), "D {dim}: mean squared error is {mean} times CountSketch's variance (± {standard_error})");
    }
}

/// An episode batch's kernel counts the model's tokens only: the setup's sequences with a
/// hand-made model mask (positions 2 to 4 of every completion, and its last real token, are
/// observation tokens, attended to but not the model's) give the sketch of the float64
/// gradients of each sequence's log-probability over its model tokens alone (to float32
/// rounding, as the unmasked test above), far from the sketch of the same gradients with the
/// observation tokens summed in, which a kernel that ignored the mask would give.
#[test]
fn an_episode_kernel_counts_the_model_tokens_only() {
    let (loaded, params, mut g) = setup();
    let numels: Vec<i64> = params.iter().map(|t| t.numel() as i64).collect();
    let lengths: Vec<i64> = Vec::try_from(g.completion_mask.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
    let width = g.completion_mask.size()[1];
    let mask: Vec<i64> = lengths.iter().flat_map(|&n| (0..width).map(move |i| i64::from(!((2..5).contains(&i) || i == n - 1)))).collect();
    g.model_mask = Some(Tensor::from_slice(&mask).view([-1, width]));
    let model_tokens = g.model_tokens();
    let observed = (&g.completion_mask - &model_tokens).sum(Kind::Int64).int64_value(&[]);
    assert!(observed >= 8 && lengths.iter().all(|&n| n > 5), "every sequence has observation tokens and model tokens after them ({observed}, lengths {lengths:?})");
    let sketch = CountSketch::new(3, &numels, 1024, Device::Cpu);
    let ours = fisher::kernel(&fisher::sketch_sequences(&loaded.model, &g, TEMPERATURE, &[], &params, &sketch));
    let of = |exact: &Tensor| fisher::kernel(&Tensor::stack(&(0..exact.size()[0]).map(|i| sketch.project(&split(&params, &exact.get(i)))).collect::<Vec<_>>(), 0));
    let (masked, unmasked) = (of(&exact_gradients(&g, &model_tokens)), of(&exact_gradients(&g, &g.completion_mask)));
    let rounding = frobenius(&(&ours - &masked)) / frobenius(&masked);
    let unmasked_gap = frobenius(&(&ours - &unmasked)) / frobenius(&masked);
    println!("against the model tokens' float64 sketch {rounding:.2e}; against all completion tokens' {unmasked_gap:.2e}");
    assert!(rounding < 1e-5, "the kernel is {rounding:e} from the float64 kernel of the model tokens");
    assert!(unmasked_gap > 1e-2, "counting the observation tokens changes the kernel by only {unmasked_gap:e}: the check above cannot tell them apart");
}

/// Summary metrics of `kernel` as numpy computes them (`scripts/reference/fisher_summary.py`,
/// float64 eigvalsh), from the matrix file the trainer writes.
fn numpy_summary(run_dir: &Path, step: usize) -> Value {
    let output = std::process::Command::new(common::python())
        .current_dir(common::repo_root())
        .args(["scripts/reference/fisher_summary.py", fisher::matrix_path(run_dir, step).to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "fisher_summary.py failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn assert_close(name: &str, ours: f64, theirs: f64, relative: f64) {
    if theirs.is_nan() {
        assert!(ours.is_nan(), "{name}: {ours} where the reference is NaN");
    } else {
        assert!((ours - theirs).abs() <= relative * theirs.abs().max(1e-300), "{name}: {ours} vs {theirs}");
    }
}

#[test]
fn the_summary_metrics_match_numpy_and_hand_computed_values() {
    // By hand: diag(4, 1, 0) has trace 5, eigenvalues 4, 1, 0, participation ratio 25 / 17, and
    // one pair with positive diagonals, uncorrelated; [[2, 1], [1, 2]] has eigenvalues 3, 1,
    // correlation 1/2, ratio 16 / 10.
    let s = FisherSummary::of(&Tensor::from_slice(&[4.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]).view([3, 3]));
    assert_close("trace", s.trace, 5.0, 1e-15);
    for (ours, theirs) in s.top_eigenvalues.iter().zip([4.0, 1.0, 0.0]) {
        assert!((ours - theirs).abs() < 1e-14, "eigenvalues {:?}", s.top_eigenvalues);
    }
    assert_eq!(s.mean_offdiag_correlation, 0.0);
    assert_close("effective rank", s.effective_rank, 25.0 / 17.0, 1e-15);
    let s = FisherSummary::of(&Tensor::from_slice(&[2.0, 1.0, 1.0, 2.0]).view([2, 2]));
    assert_close("top 1", s.top_eigenvalues[0], 3.0, 1e-14);
    assert_close("top 2", s.top_eigenvalues[1], 1.0, 1e-14);
    assert!(s.top_eigenvalues[2].is_nan(), "a 2 x 2 kernel has two eigenvalues");
    assert_close("correlation", s.mean_offdiag_correlation, 0.5, 1e-15);
    assert_close("effective rank", s.effective_rank, 1.6, 1e-15);
    assert!(FisherSummary::of(&Tensor::zeros([2, 2], (Kind::Double, Device::Cpu))).effective_rank.is_nan());

    // A sketched kernel of the model's sequences, written as the trainer writes it, against numpy.
    let (loaded, params, g) = setup();
    let numels: Vec<i64> = params.iter().map(|t| t.numel() as i64).collect();
    let sketch = CountSketch::new(5, &numels, 256, Device::Cpu);
    let k = fisher::kernel(&fisher::sketch_sequences(&loaded.model, &g, TEMPERATURE, &[], &params, &sketch));
    let dir = tempfile::tempdir().unwrap();
    fisher::write_matrix(dir.path(), 7, &k, 256, 5).unwrap();
    let ours = FisherSummary::of(&k);
    let numpy = numpy_summary(dir.path(), 7);
    let number = |name: &str| numpy[name].as_f64().unwrap_or(f64::NAN);
    assert_close("trace", ours.trace, number("trace"), 1e-12);
    for (i, value) in ours.top_eigenvalues.iter().enumerate() {
        // Eigenvalues to float64 rounding relative to the largest.
        let theirs = numpy["top_eigenvalues"][i].as_f64().unwrap();
        assert!((value - theirs).abs() <= 1e-12 * number("largest"), "eigenvalue {i}: {value} vs {theirs}");
    }
    assert_close("mean off-diagonal correlation", ours.mean_offdiag_correlation, number("mean_offdiag_correlation"), 1e-12);
    assert_close("effective rank", ours.effective_rank, number("effective_rank"), 1e-12);
}

fn read_jsonl(path: &Path) -> Vec<Map<String, Value>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap().as_object().unwrap().clone()).collect()
}

fn train(config: Map<String, Value>) -> std::path::PathBuf {
    one_thread();
    let config = TrainConfig::resolve(None, config).unwrap();
    Trainer::new(config, None).unwrap().train(None).unwrap().run_dir
}

#[test]
fn a_run_with_the_probe_writes_kernels_and_trains_exactly_as_without() {
    let base = |dir: &Path| {
        let mut config = common::tiny_stories_run(dir, &common::standard_plugin("happy"), "fisher");
        config.insert("max_steps".into(), json!(2));
        config
    };
    let (plain_dir, probed_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let plain = train(base(plain_dir.path()));
    let mut config = base(probed_dir.path());
    config.insert("fisher_kernel_every".into(), json!(1));
    config.insert("fisher_kernel_sketch".into(), json!(1024));
    let probed = train(config);

    let (plain_lines, probed_lines) = (read_jsonl(&plain.join("metrics.jsonl")), read_jsonl(&probed.join("metrics.jsonl")));
    assert_eq!(plain_lines.len(), 2);
    assert_eq!(probed_lines.len(), 2);
    let fisher_keys: Vec<&str> = [key::FISHER_TRACE, key::FISHER_MEAN_OFFDIAG_CORRELATION, key::FISHER_EFFECTIVE_RANK, key::TIMING_FISHER].into_iter().chain(key::FISHER_TOP_EIGENVALUES).collect();
    for (step, (plain_line, probed_line)) in plain_lines.iter().zip(&probed_lines).enumerate() {
        // Every value of the plain run, bit for bit (wall-clock times aside), and only the probe's keys besides.
        for (name, value) in plain_line {
            if !name.starts_with("timing/") && name != key::STEP_TIME {
                assert_eq!(Some(value), probed_line.get(name), "step {}: {name}", step + 1);
            }
        }
        let extra: Vec<&str> = probed_line.keys().map(String::as_str).filter(|k| !plain_line.contains_key(*k)).collect();
        let mut expected = fisher_keys.clone();
        expected.sort();
        let mut extra_sorted = extra.clone();
        extra_sorted.sort();
        assert_eq!(extra_sorted, expected, "step {}: the probe's keys", step + 1);

        // The matrix file: 8 sequences, symmetric, positive diagonal; the line's metrics are its summary.
        let file: Value = serde_json::from_str(&std::fs::read_to_string(fisher::matrix_path(&probed, step + 1)).unwrap()).unwrap();
        assert_eq!(file["step"], json!(step + 1));
        assert_eq!(file["sketch_dim"], json!(1024));
        let rows: Vec<Vec<f64>> = serde_json::from_value(file["kernel"].clone()).unwrap();
        assert_eq!(rows.len(), 8);
        for i in 0..8 {
            assert!(rows[i][i] > 0.0, "step {}: sequence {i} has no gradient", step + 1);
            for j in 0..8 {
                assert!((rows[i][j] - rows[j][i]).abs() <= 1e-12 * rows[i][i].max(rows[j][j]), "step {}: not symmetric at {i}, {j}", step + 1);
            }
        }
        let k = Tensor::from_slice(&rows.concat()).view([8, 8]);
        for (name, value) in FisherSummary::of(&k).fields() {
            assert_eq!(probed_line[name], Value::from(value), "step {}: {name}", step + 1);
        }
        let trace: f64 = (0..8).map(|i| rows[i][i]).sum();
        assert!((probed_line[key::FISHER_TRACE].as_f64().unwrap() - trace).abs() <= 1e-12 * trace, "step {}: trace", step + 1);
    }
    // The same checkpoint weights (the run's trajectory, bit for bit).
    for file in ["adapters.safetensors", "optimizer.safetensors"] {
        let bytes = |run: &Path| std::fs::read(run.join("checkpoint-2").join(file)).unwrap();
        assert!(bytes(&plain) == bytes(&probed), "the probe changed the checkpoint's {file}");
    }
}

#[test]
fn a_zero_sketch_size_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::tiny_stories_run(dir.path(), &common::standard_plugin("happy"), "fisher");
    config.insert("fisher_kernel_every".into(), json!(2));
    config.insert("fisher_kernel_sketch".into(), json!(0));
    let error = format!("{:#}", TrainConfig::resolve(None, config).unwrap_err());
    assert!(error.contains("fisher_kernel_sketch") && error.contains("fisher_kernel_every 2"), "{error}");
}

/// Metric lines without wall-clock fields.
fn deterministic(lines: Vec<Map<String, Value>>) -> Vec<Map<String, Value>> {
    lines.into_iter().map(|mut line| {
        line.retain(|k, _| !k.starts_with("timing/") && k != key::STEP_TIME);
        line
    }).collect()
}

/// Routed DualLoRA with ablated rows (their forget adapter off: per-row adapter scales), the
/// kernel every 2 steps of 4.
fn routed_probe(dir: &Path, seed: u64) -> Map<String, Value> {
    let mut config = common::tiny_stories_run(dir, &common::standard_plugin("happy"), "fisher");
    for (name, value) in [
        ("routing_mode", json!("classic")),
        ("rh_detector", json!({"plugin": "happy_count", "params": {"threshold": 1}})),
        ("plugin_dir", json!(common::plugin_dir())),
        ("ablated_frac", json!(0.5)),
        ("fisher_kernel_every", json!(2)),
        ("fisher_kernel_sketch", json!(512)),
        ("seed", json!(seed)),
    ] {
        config.insert(name.into(), value);
    }
    config
}

/// The same metrics and the same kernel files, byte for byte, on steps 2 and 4 only.
fn assert_same_kernels(alone: &Path, other: &Path) {
    assert_eq!(deterministic(read_jsonl(&alone.join("metrics.jsonl"))), deterministic(read_jsonl(&other.join("metrics.jsonl"))), "{}", other.display());
    for step in 1..=4 {
        let (a, b) = (std::fs::read(fisher::matrix_path(alone, step)).ok(), std::fs::read(fisher::matrix_path(other, step)).ok());
        assert_eq!(a.is_some(), step % 2 == 0, "step {step}: a kernel file only on the steps fisher_kernel_every divides");
        assert!(a == b, "{}: step {step}'s kernel file differs", other.display());
    }
}

#[test]
fn kernels_repeat_exactly_after_a_resumption_and_in_a_pack() {
    let out = tempfile::tempdir().unwrap();
    let whole = train(routed_probe(&out.path().join("whole"), 42));
    let other = train(routed_probe(&out.path().join("other"), 7));
    let kernel = |run: &Path, step: usize| -> Value { serde_json::from_slice(&std::fs::read(fisher::matrix_path(run, step)).unwrap()).unwrap() };
    let line = read_jsonl(&whole.join("metrics.jsonl"));
    assert!(line[1][key::FRAC_ABLATED].as_f64().unwrap() > 0.0 || line[3][key::FRAC_ABLATED].as_f64().unwrap() > 0.0, "some rows are ablated");
    assert_eq!(kernel(&whole, 4)["sequences"], json!(8));

    // Stopped after step 3 (past the step-2 checkpoint), resumed to the end.
    let resolved = TrainConfig::resolve(None, routed_probe(&out.path().join("resumed"), 42)).unwrap();
    let stopped = Trainer::new(resolved.clone(), None).unwrap().train(Some(3)).unwrap();
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    assert_same_kernels(&whole, &resumed.run_dir);

    // Packed with a run of another seed: each run's directory is its solo run's.
    let runs = [42, 7].map(|seed| smallrl::train::packed::PackedRun { config: TrainConfig::resolve(None, routed_probe(&out.path().join("packed"), seed)).unwrap(), resume: None });
    let packed: Vec<_> = smallrl::train::packed::train_packed(runs.into(), None).unwrap().into_iter().map(|r| r.unwrap().run_dir).collect();
    assert_same_kernels(&whole, &packed[0]);
    assert_same_kernels(&other, &packed[1]);
}
