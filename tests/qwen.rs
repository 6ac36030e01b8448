//! Qwen2 and Qwen3 against transformers, on random models that transformers builds offline
//! (`scripts/reference/qwen_models.py`: GQA and MHA, tied and untied heads, Qwen2's q/k/v biases,
//! Qwen3's per-head q/k norms and a head_dim that is not hidden / heads, all non-trivial): the
//! training forward pass, the fused KV-cached decoder and the stacked (packed) paths within 1e-4
//! of transformers' logits and log-probabilities; greedy decoding token for token against
//! `generate` on both CPU engines (libtorch and the native sampler), which sample the same tokens;
//! an exported directory that transformers loads to the same log-probabilities; a GRPO step with
//! DualLoRA, DualMLP and full fine-tuning; packed runs trained stacked equal to the runs alone;
//! and, where a GPU is lent, the forward pass and greedy decoding (eager and CUDA graphs) on CUDA.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{max_abs_diff, one_thread, smallrl_ok, standard_plugin};
use serde_json::{Value, json};
use smallrl::model::decode::{DecodeModel, prefill_mask};
use smallrl::model::generate::{Decoder, Generation, SamplingParams, generate_stacked, generate_with};
use smallrl::model::{self, Llama, LoadedModel};
use tch::{Device, Kind, Tensor};

const TOLERANCE: f64 = 1e-4;
const VARIANTS: [&str; 4] = ["qwen2_gqa_tied", "qwen2_mha_untied", "qwen3_gqa_tied", "qwen3_untied"];

/// Runs `qwen_models.py` once per test process into a temporary directory.
fn variants() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(common::python())
            .current_dir(common::repo_root())
            .args(["scripts/reference/qwen_models.py", dir.path().to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success(), "qwen_models.py failed");
        dir
    })
    .path()
}

fn load(variant: &str) -> (LoadedModel, BTreeMap<String, Tensor>) {
    load_on(variant, Device::Cpu)
}

fn load_on(variant: &str, device: Device) -> (LoadedModel, BTreeMap<String, Tensor>) {
    one_thread();
    let dir = variants().join(variant);
    let loaded = model::load(dir.to_str().unwrap(), "main", device, Kind::Float).unwrap_or_else(|e| panic!("{variant}: {e:#}"));
    let reference = model::weights::read_safetensors(&dir.join("reference.safetensors")).unwrap();
    (loaded, reference)
}

fn logits(model: &Llama, ids: &Tensor, mask: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    model.logits(&model.forward(ids, mask, &[]))
}

/// `log_softmax(logits[t])[ids[t + 1]]` in float64, `[T - 1]`.
fn logprobs(logits: &Tensor, ids: &Tensor) -> Tensor {
    let t = ids.size()[0];
    logits.narrow(0, 0, t - 1).to_kind(Kind::Double).log_softmax(-1, Kind::Double).gather(1, &ids.narrow(0, 1, t - 1).unsqueeze(1), false).squeeze_dim(1)
}

fn masked_diff(logits: &Tensor, expected: &Tensor, mask: &Tensor) -> f64 {
    let keep = mask.to_kind(Kind::Bool).unsqueeze(-1);
    max_abs_diff(&(logits * &keep), &(expected * &keep))
}

fn ids(tensor: &Tensor) -> Vec<u32> {
    Vec::<i64>::try_from(tensor).unwrap().into_iter().map(|t| t as u32).collect()
}

#[test]
fn qwen_logits_and_logprobs_match_transformers_on_every_path() {
    for variant in VARIANTS {
        let (loaded, reference) = load(variant);
        let llama = &loaded.model;
        let family = if variant.starts_with("qwen2") { "qwen2" } else { "qwen3" };
        assert_eq!(llama.config.model_type.name(), family);
        // The training / scoring forward pass, one prompt at a time.
        for i in 0..3 {
            let ids = &reference[&format!("input_ids_{i}")];
            let ours = logits(llama, &ids.unsqueeze(0), &ids.unsqueeze(0).ones_like()).squeeze_dim(0);
            let diff = max_abs_diff(&ours, &reference[&format!("logits_{i}")]);
            assert!(diff <= TOLERANCE, "{variant} prompt {i}: max |logits - transformers| = {diff}");
            let diff = max_abs_diff(&logprobs(&ours, ids), &reference[&format!("logprobs_{i}")].to_kind(Kind::Double));
            assert!(diff <= TOLERANCE, "{variant} prompt {i}: max |log-probs - transformers| = {diff}");
        }
        // A left-padded batch, positions 0..T (the scoring convention).
        let (batch_ids, mask) = (&reference["batch_input_ids"], &reference["batch_attention_mask"]);
        let diff = masked_diff(&logits(llama, batch_ids, mask), &reference["batch_logits"], mask);
        assert!(diff <= TOLERANCE, "{variant}: padded batch differs by {diff}");
        // The fused KV-cached decoder (biases and q/k norms folded into its fused projection),
        // prefilled at generate's positions.
        let decoder = DecodeModel::new(llama, &[]);
        let (batch, len) = batch_ids.size2().unwrap();
        let mut cache = decoder.new_cache(batch, len);
        let hidden = tch::no_grad(|| decoder.forward(batch_ids, &reference["batch_gen_position_ids"], &mut cache, 0, &prefill_mask(mask, len)));
        let diff = masked_diff(&decoder.logits(&hidden), &reference["batch_gen_logits"], mask);
        assert!(diff <= TOLERANCE, "{variant}: fused decoder differs by {diff}");
        // The stacked (packed) forward pass: the model twice, run-major rows.
        let stacked = Llama::stacked(&[llama, llama]);
        let two = |t: &Tensor| Tensor::cat(&[t, t], 0);
        let ours = logits(&stacked, &two(batch_ids), &two(mask));
        let diff = masked_diff(&ours, &two(&reference["batch_logits"]), &two(mask));
        assert!(diff <= TOLERANCE, "{variant}: stacked forward pass differs by {diff}");
        // The native sampler (biases and q/k norms folded as in the libtorch decoder) scores
        // the sequences as the training forward pass does, and samples what libtorch samples.
        assert!(decoder.native().is_some(), "{variant}: the native sampler serves Qwen on the CPU");
        let native_scores = tch::no_grad(|| native_scores(&decoder, &reference));
        for (i, ours) in native_scores.iter().enumerate() {
            let diff = max_abs_diff(ours, &reference[&format!("logprobs_{i}")].to_kind(Kind::Double));
            assert!(diff <= TOLERANCE, "{variant} prompt {i}: native scorer's log-probs differ from transformers' by {diff}");
        }
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| ids(&reference[&format!("input_ids_{i}")])).collect();
        check_engines_agree(variant, &decoder, &prompts);
    }
}

/// Log-probabilities of each reference prompt's tokens after its first under the native scorer
/// (the first token as prompt, the rest as a completion).
fn native_scores(decoder: &DecodeModel, reference: &BTreeMap<String, Tensor>) -> Vec<Tensor> {
    (0..3)
        .map(|i| {
            let row = &reference[&format!("input_ids_{i}")];
            let t = row.size()[0];
            let generation = Generation {
                prompt_ids: row.narrow(0, 0, 1).unsqueeze(0),
                prompt_mask: Tensor::ones([1, 1], (Kind::Int64, Device::Cpu)),
                completion_ids: row.narrow(0, 1, t - 1).unsqueeze(0),
                completion_mask: Tensor::ones([1, t - 1], (Kind::Int64, Device::Cpu)),
                sampling_logprobs: Tensor::zeros([1, t - 1], (Kind::Float, Device::Cpu)),
                kept: None,
                model_mask: None,
                rows: vec![smallrl::model::batch::CompletionRow { ids: ids(&row.narrow(0, 1, t - 1)), ended_with_eos: false }],
            };
            // (The reference ids are drawn from [2, vocab): no EOS ends a completion early.)
            smallrl::model::native::frozen_logprobs(decoder.native().unwrap(), &generation, 1.0, 2).unwrap().squeeze_dim(0).to_kind(Kind::Double)
        })
        .collect()
}

/// Samples `prompts` with both engines (the native one with 1 and 3 streams): the same tokens,
/// and sampling log-probabilities within the tolerance.
fn check_engines_agree(variant: &str, decoder: &DecodeModel, prompts: &[Vec<u32>]) {
    let params = SamplingParams { max_new_tokens: 16, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let reference = generate_with(Decoder::Libtorch, decoder, prompts, &params, 7).unwrap();
    for threads in [1, 3] {
        let native = generate_with(Decoder::Native { threads }, decoder, prompts, &params, 7).unwrap();
        assert_eq!(native.completion_ids, reference.completion_ids, "{variant}, {threads} streams: sampled tokens");
        assert_eq!(native.completion_mask, reference.completion_mask, "{variant}, {threads} streams: completion mask");
        let diff = max_abs_diff(&native.sampling_logprobs, &reference.sampling_logprobs);
        assert!(diff <= TOLERANCE, "{variant}, {threads} streams: sampling log-probs differ by {diff}");
    }
}

/// `Llama::build` and `base_tensors` name exactly the tensors transformers saved (biases and
/// q/k norms included), in the same order and shapes.
#[test]
fn the_qwen_walk_names_what_transformers_saved() {
    for variant in VARIANTS {
        let (loaded, _) = load(variant);
        let model = &loaded.model;
        let mut built = Vec::new();
        let mut record = |name: &str, shape: &[usize]| {
            built.push((name.to_string(), shape.to_vec()));
            Ok(Tensor::zeros(shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), (Kind::Float, Device::Cpu)))
        };
        Llama::build(model.config.clone(), &mut record, model.rope.shared(), Device::Cpu, Kind::Float).unwrap();
        let walked: Vec<(String, Vec<usize>)> = model.base_tensors().iter().map(|(n, t)| (n.clone(), t.size().iter().map(|&d| d as usize).collect())).collect();
        assert_eq!(built, walked, "{variant}: build and base_tensors disagree");
        let saved: std::collections::BTreeSet<String> = model::weights::read_safetensors(&variants().join(variant).join("model.safetensors"))
            .unwrap()
            .into_keys()
            .filter(|n| !(model.config.tie_word_embeddings && n == "lm_head.weight"))
            .collect();
        let names: std::collections::BTreeSet<String> = walked.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names, saved, "{variant}: the walk names what transformers saved");
        let extra = if variant.starts_with("qwen2") { "model.layers.1.self_attn.v_proj.bias" } else { "model.layers.1.self_attn.k_norm.weight" };
        assert!(names.contains(extra), "{variant}: {extra}");
    }
}

#[test]
fn qwen_greedy_decoding_matches_transformers_token_for_token() {
    check_greedy(Device::Cpu, &[Decoder::Libtorch, Decoder::Native { threads: 1 }, Decoder::Native { threads: 2 }]);
}

/// float32 on CUDA: the forward pass within 1e-4 of transformers' logits, greedy decodes (eager
/// and replayed from CUDA graphs, alone and stacked) token for token.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
fn qwen_on_cuda_matches_transformers() {
    let cuda = common::cuda_device();
    for variant in VARIANTS {
        let (loaded, reference) = load_on(variant, cuda);
        for i in 0..3 {
            let ids = reference[&format!("input_ids_{i}")].to_device(cuda);
            let ours = logits(&loaded.model, &ids.unsqueeze(0), &ids.unsqueeze(0).ones_like()).squeeze_dim(0).to_device(Device::Cpu);
            let diff = max_abs_diff(&ours, &reference[&format!("logits_{i}")]);
            assert!(diff <= TOLERANCE, "{variant} prompt {i} on CUDA: max |logits - transformers| = {diff}");
        }
    }
    check_greedy(cuda, &[Decoder::Libtorch, Decoder::CudaGraphs]);
}

fn check_greedy(device: Device, engines: &[Decoder]) {
    for variant in VARIANTS {
        let (loaded, _) = load_on(variant, device);
        let greedy: Value = serde_json::from_str(&std::fs::read_to_string(variants().join(variant).join("greedy.json")).unwrap()).unwrap();
        let max_new_tokens = greedy["max_new_tokens"].as_u64().unwrap() as usize;
        let params = SamplingParams { max_new_tokens, temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
        let to_ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
        let results = greedy["results"].as_array().unwrap();
        let prompts: Vec<Vec<u32>> = results.iter().map(|r| to_ids(&r["prompt_ids"])).collect();
        let decoder = DecodeModel::new(&loaded.model, &[]);
        let eos = loaded.model.config.eos_token_id;
        let check = |rows: &[smallrl::model::batch::CompletionRow], what: &str| {
            for (result, row) in results.iter().zip(rows) {
                let mut ours = row.ids.clone();
                if row.ended_with_eos {
                    ours.push(eos);
                }
                assert_eq!(ours, to_ids(&result["generated_ids"]), "{variant} on {device:?}, {what}: greedy decode of {:?}", result["prompt_ids"]);
            }
        };
        // All prompts in one left-padded batch (libtorch), or split into streams (native).
        for &engine in engines {
            check(&generate_with(engine, &decoder, &prompts, &params, 0).unwrap().rows, &format!("{engine:?}"));
        }
        // Two runs stacked (packing): each run decodes what it decodes alone.
        let stacked = DecodeModel::stacked(&[&decoder, &decoder]);
        for &engine in engines.iter().filter(|e| !matches!(e, Decoder::Native { .. })) {
            for generation in generate_stacked(engine, &stacked, &[&prompts, &prompts], &params, &[0, 1]).unwrap() {
                check(&generation.unwrap().rows, &format!("stacked, {engine:?}"));
            }
        }
    }
}

/// transformers' log-probabilities of `rows` under the model in `dir` (`qwen_models.py --score`).
fn transformers_logprobs(dir: &Path, rows: &[Vec<u32>]) -> (Vec<Vec<f64>>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (request, out) = (tmp.path().join("ids.json"), tmp.path().join("out.json"));
    std::fs::write(&request, json!(rows).to_string()).unwrap();
    let status = std::process::Command::new(common::python())
        .current_dir(common::repo_root())
        .arg("scripts/reference/qwen_models.py")
        .arg("--score")
        .args([dir, &request, &out])
        .status()
        .unwrap();
    assert!(status.success(), "qwen_models.py --score failed");
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let logprobs = out["logprobs"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect();
    (logprobs, out["model_type"].as_str().unwrap().to_string())
}

/// A model written by smallrl with a DualLoRA adapter folded in loads in transformers as the same
/// family and scores as smallrl scores it (and smallrl loads it back).
#[test]
fn exported_qwen_models_load_in_transformers() {
    for variant in ["qwen2_gqa_tied", "qwen3_untied"] {
        let (mut loaded, reference) = load(variant);
        let adapters = smallrl::adapters::AdapterConfig::dual_lora(4, 4, 4.0, 1);
        adapters.attach(&mut loaded.model, 5).unwrap();
        // Non-zero adapters (B starts at zero), so the export has something to fold.
        tch::manual_seed(3);
        tch::no_grad(|| {
            for (_, linear) in loaded.model.projections_mut() {
                for lora in linear.adapters.iter_mut().flatten() {
                    let _ = lora.b.g_add_(&(lora.b.randn_like() * 0.05));
                }
            }
        });
        let scales = vec![1.0; loaded.model.adapter_slots()];
        let ctl: Vec<_> = scales.iter().map(|&s| smallrl::model::linear::AdapterCtl::frozen(s)).collect();
        let rows: Vec<Vec<u32>> = (0..3).map(|i| ids(&reference[&format!("input_ids_{i}")])).collect();
        let ours: Vec<Tensor> = rows
            .iter()
            .map(|row| {
                let t = Tensor::from_slice(&row.iter().map(|&x| x as i64).collect::<Vec<_>>());
                let hidden = tch::no_grad(|| loaded.model.forward(&t.unsqueeze(0), &t.unsqueeze(0).ones_like(), &ctl));
                logprobs(&loaded.model.logits(&hidden).squeeze_dim(0), &t)
            })
            .collect();
        let unchanged = max_abs_diff(&ours[2], &reference["logprobs_2"].to_kind(Kind::Double));
        assert!(unchanged > 1e-3, "{variant}: the adapters changed nothing ({unchanged})");
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("export");
        model::export::save_hf_dir(&loaded.model, &scales, &loaded.files.tokenizer, &dir).unwrap();
        let (theirs, model_type) = transformers_logprobs(&dir, &rows);
        assert_eq!(model_type, loaded.model.config.model_type.name());
        for (i, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
            let diff = max_abs_diff(ours, &Tensor::from_slice(theirs));
            assert!(diff <= TOLERANCE, "{variant} row {i}: exported model in transformers differs by {diff}");
        }
        let reloaded = model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
        assert_eq!(reloaded.model.config.model_type, loaded.model.config.model_type);
    }
}

fn run_dir(out: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(out).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// One GRPO step of `smallrl train` on `variant` with `adapter` (the native sampler and
/// reference scorer on the CPU), rewarded by letter counts (which differ within a group): it
/// finishes with a finite loss and a non-zero gradient, the sampler's and the trainer's
/// distributions agree, and its checkpoint loads as the same family.
fn one_grpo_step(variant: &str, adapter: Value) {
    let out = tempfile::tempdir().unwrap();
    let mut config = json!({
        "model": variants().join(variant),
        "prompts": common::fixture("tiny-stories/prompts.txt"),
        "reward": {"plugin": standard_plugin("string_count"), "params": {"strings": ["e", "a"], "max_count": 30}},
        "batch_size": 4, "num_generations": 2, "max_completion_length": 6, "max_steps": 1,
        "save_steps": 1, "eval_every": 1, "eval_samples": 2, "logging_steps": 1,
        "lr": 1e-3, "output_dir": out.path(), "threads": 1, "device": "cpu",
    });
    for (k, v) in adapter.as_object().unwrap() {
        config.as_object_mut().unwrap().insert(k.clone(), v.clone());
    }
    let path = out.path().join("config.yaml");
    std::fs::write(&path, config.to_string()).unwrap();
    smallrl_ok(&["train", "--config", path.to_str().unwrap()]);
    let run = run_dir(out.path());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps.len(), 1, "{variant} {adapter}: {metrics}");
    let loss = steps[0]["loss"].as_f64().unwrap_or_else(|| panic!("{variant} {adapter}: no loss in {}", steps[0]));
    assert!(loss.is_finite(), "{variant} {adapter}: loss {loss}");
    let grad_norm = steps[0]["grad_norm"].as_f64().unwrap();
    assert!(grad_norm.is_finite() && grad_norm > 0.0, "{variant} {adapter}: grad_norm {grad_norm} (rewards that differ within a group)");
    // The sampler (native) and the trainer (libtorch forward) give the same distributions.
    let kl = steps[0]["kl_sample_train_v1"].as_f64().unwrap();
    assert!(kl.abs() < 1e-5, "{variant} {adapter}: sampler-trainer KL {kl}");
    let restored = smallrl::train::checkpoint::restore_model(&run.join("checkpoint-1"), Device::Cpu).unwrap();
    assert_eq!(restored.model.config.model_type.name(), &variant[..5], "{variant} {adapter}");
}

#[test]
fn a_grpo_step_trains_qwen3_with_dual_lora() {
    one_grpo_step("qwen3_gqa_tied", json!({"adapter": "dual-lora", "lora_preset": "r4"}));
}

#[test]
fn a_grpo_step_trains_qwen2_with_dual_mlp() {
    one_grpo_step("qwen2_gqa_tied", json!({"adapter": "dual-mlp", "mlp_config": "m5"}));
}

/// Full fine-tuning with a KL term: the frozen reference (built through `Llama::build`) carries
/// the biases and q/k norms too.
#[test]
fn a_grpo_step_fine_tunes_qwen3_fully_with_a_kl_term() {
    one_grpo_step("qwen3_untied", json!({"adapter": "full", "beta": 0.04}));
}

/// Two Qwen runs packed and stacked on a leading run axis (`Stacking::Always`: the stacked
/// libtorch decoder, one forward and backward pass of both models with `[2, ...]` biases and
/// q/k norms) are the runs trained alone: the same completions, and checkpoints within 3e-6 of
/// the solo runs' (a few percent of one AdamW step at lr 1e-4; a wrong gradient of a bias or a
/// norm moves it by whole steps). Full fine-tuning, so the biases and norms learn.
#[test]
fn packed_qwen_runs_trained_stacked_equal_the_runs_trained_alone() {
    use smallrl::train::TrainConfig;
    use smallrl::train::packed::{PackOptions, PackedRun, Stacking, train_packed_with};
    for variant in ["qwen2_gqa_tied", "qwen3_untied"] {
        let out = tempfile::tempdir().unwrap();
        let config = |dir: &Path, seed: u64, lr: f64| -> serde_json::Map<String, Value> {
            let value = json!({
                "model": variants().join(variant), "prompts": common::fixture("tiny-stories/prompts.txt"),
                // Letters of random text: rewards that differ within a group, so weights move.
                "reward": {"plugin": standard_plugin("string_count"), "params": {"strings": ["e", "a"], "max_count": 30}}, "adapter": "full",
                "batch_size": 4, "num_generations": 2, "max_completion_length": 6, "max_steps": 2,
                "save_steps": 2, "eval_every": 2, "eval_samples": 2, "logging_steps": 1, "beta": 0.0,
                "log_completions": true, "lr": lr, "seed": seed, "output_dir": dir, "threads": 1, "device": "cpu",
            });
            value.as_object().unwrap().clone()
        };
        let pair = |dir: &Path| vec![config(dir, 1, 1e-4), config(dir, 7, 3e-4)];
        one_thread();
        let alone: Vec<PathBuf> = pair(&out.path().join("alone"))
            .into_iter()
            .map(|c| smallrl::train::Trainer::new(TrainConfig::resolve(None, c).unwrap(), None).unwrap().train(None).unwrap().run_dir)
            .collect();
        let runs = pair(&out.path().join("packed")).into_iter().map(|c| PackedRun { config: TrainConfig::resolve(None, c).unwrap(), resume: None }).collect();
        let options = PackOptions { stacking: Stacking::Always, workers: 2 };
        let packed: Vec<PathBuf> = train_packed_with(runs, None, options).unwrap().into_iter().map(|outcome| outcome.unwrap().run_dir).collect();
        for (alone, packed) in alone.iter().zip(&packed) {
            let log = std::fs::read_to_string(packed.join("train.log")).unwrap();
            assert!(log.contains("training stacked with 2 packed runs"), "{variant}: the pack trained stacked: {log}");
            let read = |run: &Path| std::fs::read_to_string(run.join("completions.jsonl")).unwrap().lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["completion"].clone()).collect::<Vec<_>>();
            assert_eq!(read(alone), read(packed), "{variant}: the same completions");
            let weights = |run: &Path| {
                let dir = run.join("checkpoint-2");
                smallrl::train::checkpoint::read_weights(&dir, &smallrl::train::checkpoint::read_state(&dir).unwrap()).unwrap()
            };
            let (a, b) = (weights(alone), weights(packed));
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
            // The biases (Qwen2) or q/k norms (Qwen3) learnt: they moved from the initial model.
            let initial = model::weights::read_safetensors(&variants().join(variant).join("model.safetensors")).unwrap();
            let learnt = a.iter().filter(|(n, _)| n.ends_with(".bias") || n.ends_with("q_norm.weight") || n.ends_with("k_norm.weight"));
            let moved: Vec<f64> = learnt.map(|(n, t)| (t - &initial[n.as_str()]).abs().max().double_value(&[])).collect();
            assert!(!moved.is_empty() && moved.iter().all(|&m| m > 1e-5), "{variant}: biases / q/k norms moved by {moved:?}");
            for (name, tensor) in &a {
                let difference = (tensor - &b[name]).abs().max().double_value(&[]);
                assert!(difference <= 3e-6, "{variant} {name} differs by {difference:e}");
            }
        }
    }
}
