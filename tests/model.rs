//! The model against transformers: logits on the fixtures (single prompts, a left-padded batch
//! on both position conventions), KV-cached decoding against the full forward pass.

mod common;

use std::collections::BTreeMap;

use common::{cuda_device, fixture, max_abs_diff, one_thread};
use smallrl::model::cuda_graph::{self, CudaGraph};
use smallrl::model::decode::{DecodeModel, additive_mask, prefill_mask};
use smallrl::model::generate::{Decoder, Generation, SamplingParams, generate_stacked, generate_with};
use smallrl::model::{self, LoadedModel};
use tch::{Device, Kind, Tensor};

/// Logits within 1e-4 (absolute) of transformers' float32 logits from the fixture's
/// `reference.safetensors`: kept against a float32 reference because the fixtures ship no float64
/// logits. The bound is about a hundred times float32's relative rounding of logits of order 1
/// to 10 on either side, whatever the processor; a wrong weight or mask is off by far more.
const TOLERANCE: f64 = 1e-4;

fn load(name: &str) -> (LoadedModel, BTreeMap<String, Tensor>) {
    load_on(name, Device::Cpu)
}

fn load_on(name: &str, device: Device) -> (LoadedModel, BTreeMap<String, Tensor>) {
    one_thread();
    let dir = fixture(name);
    let loaded = model::load(dir.to_str().unwrap(), "main", device, Kind::Float).unwrap();
    let reference = model::weights::read_safetensors(&dir.join("reference.safetensors")).unwrap();
    (loaded, reference)
}

fn full_forward_logits(model: &smallrl::model::Llama, ids: &Tensor, mask: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    model.logits(&model.forward(ids, mask, &[]))
}

fn check_single_prompts(name: &str, device: Device) {
    let (loaded, reference) = load_on(name, device);
    for i in 0..4 {
        let ids = reference[&format!("input_ids_{i}")].unsqueeze(0).to_device(device);
        let logits = full_forward_logits(&loaded.model, &ids, &ids.ones_like());
        let diff = max_abs_diff(&logits.squeeze_dim(0), &reference[&format!("logits_{i}")]);
        assert!(diff <= TOLERANCE, "{name} prompt {i} on {device:?}: max |logits - transformers| = {diff}");
    }
}

#[test]
fn logits_match_transformers_on_tiny_random() {
    check_single_prompts("tiny-random", Device::Cpu);
}

#[test]
fn logits_match_transformers_on_tiny_stories() {
    check_single_prompts("tiny-stories", Device::Cpu);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
fn logits_match_transformers_on_cuda() {
    let cuda = cuda_device();
    check_single_prompts("tiny-random", cuda);
    check_single_prompts("tiny-stories", cuda);
}

/// Compares only positions where the attention mask is 1.
fn masked_diff(logits: &Tensor, expected: &Tensor, mask: &Tensor) -> f64 {
    let keep = mask.to_kind(Kind::Bool).unsqueeze(-1);
    max_abs_diff(&(logits * &keep), &(expected * &keep))
}

#[test]
fn left_padded_batch_matches_both_position_conventions() {
    for name in ["tiny-random", "tiny-stories"] {
        let (loaded, reference) = load(name);
        let ids = &reference["batch_input_ids"];
        let mask = &reference["batch_attention_mask"];
        // TRL's scoring path: positions 0..T on every row.
        let logits = full_forward_logits(&loaded.model, ids, mask);
        let diff = masked_diff(&logits, &reference["batch_logits"], mask);
        assert!(diff <= TOLERANCE, "{name}: scoring forward differs by {diff}");
        // generate's path: positions cumsum(mask) - 1 through the fused, cached decoder.
        let decoder = DecodeModel::new(&loaded.model, &[]);
        let (batch, len) = ids.size2().unwrap();
        let mut cache = decoder.new_cache(batch, len);
        let positions = (mask.cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let hidden = tch::no_grad(|| decoder.forward(ids, &positions, &mut cache, 0, &prefill_mask(mask, len)));
        let diff = masked_diff(&decoder.logits(&hidden), &reference["batch_gen_logits"], mask);
        assert!(diff <= TOLERANCE, "{name}: prefill differs from generate's logits by {diff}");
    }
}

#[test]
fn incremental_decoding_matches_the_full_forward_pass() {
    let (loaded, reference) = load("tiny-stories");
    let ids = reference["input_ids_2"].unsqueeze(0);
    let len = ids.size()[1];
    let expected = full_forward_logits(&loaded.model, &ids, &ids.ones_like()).squeeze_dim(0);
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let mut cache = decoder.new_cache(1, len);
    let prefix = 3;
    let _guard = tch::no_grad_guard();
    let head = ids.narrow(1, 0, prefix);
    let positions = Tensor::arange(prefix, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let hidden = decoder.forward(&head, &positions, &mut cache, 0, &prefill_mask(&head.ones_like(), len));
    let mut rows = vec![decoder.logits(&hidden).squeeze_dim(0)];
    let key_valid = Tensor::zeros([1, len], (Kind::Bool, Device::Cpu));
    let _ = key_valid.narrow(1, 0, prefix).fill_(1);
    for slot in prefix..len {
        let _ = key_valid.narrow(1, slot, 1).fill_(1);
        let token = ids.narrow(1, slot, 1);
        let position = Tensor::from_slice(&[slot]).view([1, 1]);
        let mask = additive_mask(&key_valid.unsqueeze(1).unsqueeze(1), Kind::Float);
        let hidden = decoder.forward(&token, &position, &mut cache, slot, &mask);
        rows.push(decoder.logits(&hidden).squeeze_dim(0));
    }
    let diff = max_abs_diff(&Tensor::cat(&rows, 0), &expected);
    assert!(diff <= TOLERANCE, "cached decoding differs from the full pass by {diff}");
}

/// Runs `scripts/reference/llama_variants.py` once per test process into a temporary
/// directory: random models for config paths SimpleStories does not use, with transformers'
/// logits, and transformers' greedy decodes of tiny-stories.
fn variants() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(common::python())
            .current_dir(common::repo_root())
            .args(["scripts/reference/llama_variants.py", dir.path().to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success(), "llama_variants.py failed");
        dir
    })
    .path()
}

#[test]
fn other_llama_configs_match_transformers() {
    one_thread();
    for variant in ["untied", "mha", "rope_theta", "head_dim"] {
        let dir = variants().join(variant);
        // The variants have no tokenizer: load config and weights only.
        let config = model::LlamaConfig::from_file(&dir.join("config.json")).unwrap_or_else(|e| panic!("{variant}: {e:#}"));
        let files = model::weights::weight_files(&dir).unwrap();
        let llama = model::weights::load_llama(config, &files, Device::Cpu, Kind::Float).unwrap_or_else(|e| panic!("{variant}: {e:#}"));
        let reference = model::weights::read_safetensors(&dir.join("reference.safetensors")).unwrap();
        for i in 0..4 {
            let ids = reference[&format!("input_ids_{i}")].unsqueeze(0);
            let logits = full_forward_logits(&llama, &ids, &ids.ones_like());
            let diff = max_abs_diff(&logits.squeeze_dim(0), &reference[&format!("logits_{i}")]);
            assert!(diff <= TOLERANCE, "{variant} prompt {i}: max |logits - transformers| = {diff}");
        }
        let (ids, mask) = (&reference["batch_input_ids"], &reference["batch_attention_mask"]);
        let diff = masked_diff(&full_forward_logits(&llama, ids, mask), &reference["batch_logits"], mask);
        assert!(diff <= TOLERANCE, "{variant}: padded batch differs by {diff}");
        let decoder = DecodeModel::new(&llama, &[]);
        let (batch, len) = ids.size2().unwrap();
        let mut cache = decoder.new_cache(batch, len);
        let hidden = tch::no_grad(|| decoder.forward(ids, &reference["batch_gen_position_ids"], &mut cache, 0, &prefill_mask(mask, len)));
        let diff = masked_diff(&decoder.logits(&hidden), &reference["batch_gen_logits"], mask);
        assert!(diff <= TOLERANCE, "{variant}: fused decoder differs by {diff}");
        // The native sampler on this architecture: prompts 0-2 of the reference, sampled.
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| Vec::<i64>::try_from(&reference[&format!("input_ids_{i}")]).unwrap().iter().map(|&t| t as u32).collect()).collect();
        check_engines_agree(variant, &decoder, &prompts, &sampling(24, 1.0, 0, 1.0, 1.0));
    }
}

#[test]
fn greedy_decoding_matches_transformers_token_for_token() {
    check_greedy_decoding(Device::Cpu, &[Decoder::Libtorch, Decoder::Native { threads: 1 }, Decoder::Native { threads: 2 }]);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
fn greedy_decoding_on_cuda_matches_transformers_token_for_token() {
    check_greedy_decoding(cuda_device(), &[Decoder::Libtorch, Decoder::CudaGraphs]);
}

fn check_greedy_decoding(device: Device, engines: &[Decoder]) {
    let (loaded, _) = load_on("tiny-stories", device);
    let text = std::fs::read_to_string(variants().join("greedy.json")).unwrap();
    let greedy: serde_json::Value = serde_json::from_str(&text).unwrap();
    let max_new_tokens = greedy["max_new_tokens"].as_u64().unwrap() as usize;
    let params = SamplingParams { max_new_tokens, temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let results = greedy["results"].as_array().unwrap();
    assert!(results.len() >= 5);
    let to_ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    let prompts: Vec<Vec<u32>> = results.iter().map(|r| to_ids(&r["prompt_ids"])).collect();
    // All prompts in one batch (left-padded for libtorch, split into streams natively): the
    // batched paths must not change greedy choices.
    let penalty = greedy["repetition_penalty"].as_f64().unwrap();
    let penalized = SamplingParams { repetition_penalty: penalty, ..params.clone() };
    for &engine in engines {
        for (params, key) in [(&params, "generated_ids"), (&penalized, "generated_ids_repetition_penalty")] {
            let generation = generate_with(engine, &decoder, &prompts, params, 0).unwrap();
            for (result, row) in results.iter().zip(&generation.rows) {
                let mut ours = row.ids.clone();
                if row.ended_with_eos {
                    ours.push(loaded.model.config.eos_token_id);
                }
                assert_eq!(ours, to_ids(&result[key]), "{engine:?} on {device:?}, {key}: greedy decode of {:?}", result["prompt"]);
            }
        }
    }
    let differs = results.iter().filter(|r| r["generated_ids"] != r["generated_ids_repetition_penalty"]).count();
    assert!(differs > 0, "the repetition penalty changed no greedy decode: the check is void");
}

/// Samples `prompts` with both engines (the native one with 1 and 3 streams) and requires the
/// same tokens, masks and, within the logits tolerance, the same sampling log-probabilities.
fn check_engines_agree(what: &str, decoder: &DecodeModel, prompts: &[Vec<u32>], params: &SamplingParams) {
    let reference = generate_with(Decoder::Libtorch, decoder, prompts, params, 7).unwrap();
    let finished = reference.rows.iter().filter(|r| r.ended_with_eos).count();
    for threads in [1, 3] {
        let native = generate_with(Decoder::Native { threads }, decoder, prompts, params, 7).unwrap();
        let context = format!("{what}, {threads} stream(s), {params:?}");
        assert_eq!(native.prompt_ids, reference.prompt_ids, "{context}: prompt ids");
        assert_eq!(native.prompt_mask, reference.prompt_mask, "{context}: prompt mask");
        assert_eq!(native.completion_ids, reference.completion_ids, "{context}: sampled tokens");
        assert_eq!(native.completion_mask, reference.completion_mask, "{context}: completion mask");
        let diff = max_abs_diff(&native.sampling_logprobs, &reference.sampling_logprobs);
        assert!(diff <= TOLERANCE, "{context}: sampling log-probs differ by {diff}");
        let rows: Vec<_> = native.rows.iter().map(|r| (r.ids.clone(), r.ended_with_eos)).collect();
        let expected: Vec<_> = reference.rows.iter().map(|r| (r.ids.clone(), r.ended_with_eos)).collect();
        assert_eq!(rows, expected, "{context}: rows");
    }
    eprintln!("{what}: {} rows agree ({finished} ended with EOS)", prompts.len());
}

fn sampling(max_new_tokens: usize, temperature: f64, top_k: usize, top_p: f64, repetition_penalty: f64) -> SamplingParams {
    SamplingParams { max_new_tokens, temperature, top_k, top_p, repetition_penalty, kept_sets: false }
}

#[test]
fn native_and_libtorch_samplers_draw_the_same_tokens() {
    let (loaded, _) = load("tiny-stories");
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    // Prompts of different lengths (left padding on the libtorch side), 10 rows over 3 streams.
    let mut prompts: Vec<Vec<u32>> = text.lines().take(10).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    prompts[3].truncate(3);
    prompts[7].truncate(5);
    let decoder = DecodeModel::new(&loaded.model, &[]);
    check_engines_agree("tiny-stories", &decoder, &prompts, &sampling(80, 1.0, 0, 1.0, 1.0));
    check_engines_agree("tiny-stories", &decoder, &prompts, &sampling(40, 0.7, 20, 0.9, 1.3));
    check_engines_agree("tiny-stories", &decoder, &prompts, &sampling(40, 1.5, 0, 0.8, 1.0));
    // A length that is no multiple of the finished-check interval (a shorter last chunk).
    check_engines_agree("tiny-stories", &decoder, &prompts, &sampling(21, 1.0, 0, 1.0, 1.0));
}

/// The same tokens, masks and rows, and log-probabilities within `tolerance`.
fn assert_same_generation(context: &str, ours: &Generation, expected: &Generation, tolerance: f64) {
    assert_eq!(ours.completion_ids, expected.completion_ids, "{context}: sampled tokens");
    assert_eq!(ours.completion_mask, expected.completion_mask, "{context}: completion mask");
    let diff = max_abs_diff(&ours.sampling_logprobs, &expected.sampling_logprobs);
    assert!(diff <= tolerance, "{context}: sampling log-probs differ by {diff}");
    let rows = |g: &Generation| g.rows.iter().map(|r| (r.ids.clone(), r.ended_with_eos)).collect::<Vec<_>>();
    assert_eq!(rows(ours), rows(expected), "{context}: rows");
}

/// Prompts of different lengths from the tiny-stories fixture (left padding in libtorch).
fn story_prompts(loaded: &LoadedModel, rows: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    let mut prompts: Vec<Vec<u32>> = text.lines().cycle().take(rows).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    prompts[1].truncate(3);
    prompts
}

#[test]
fn the_cuda_graph_shim_is_linked_when_libtorch_is_a_cuda_build() {
    let cuda_build = common::repo_root().join(".libtorch/lib/libtorch_cuda.so").exists();
    assert_eq!(cuda_graph::shim_linked(), cuda_build, "shim build status: {}", cuda_graph::build_status());
    if !cuda_build || tch::Cuda::is_available() {
        return;
    }
    // No GPU here: the shim's C++ side reports the missing device as an error (an exception
    // crossing into Rust would abort), and the body is never run.
    let error = CudaGraph::run_and_capture(Device::Cuda(0), || panic!("the body must not run without a device")).err().expect("no CUDA device, no graph");
    eprintln!("the shim without a device: {error:#}");
    assert!(format!("{error:#}").contains("CUDA graph creation"), "{error:#}");
}

#[test]
fn cuda_graphs_without_a_cuda_device_decode_eagerly_with_the_same_tokens() {
    let (loaded, _) = load("tiny-stories");
    let decoder = DecodeModel::new(&loaded.model, &[]);
    assert!(cuda_graph::availability(Device::Cpu).is_err());
    let prompts = story_prompts(&loaded, 6);
    let params = sampling(20, 1.0, 0, 1.0, 1.3);
    let eager = generate_with(Decoder::Libtorch, &decoder, &prompts, &params, 5).unwrap();
    let asked_for_graphs = generate_with(Decoder::CudaGraphs, &decoder, &prompts, &params, 5).unwrap();
    assert_same_generation("graphs asked for on the CPU", &asked_for_graphs, &eager, 0.0);
}

#[test]
fn a_refreshed_decoder_samples_as_a_new_one_from_the_changed_weights() {
    let (mut loaded, _) = load("tiny-stories");
    let prompts = story_prompts(&loaded, 6);
    let params = sampling(24, 1.0, 0, 1.0, 1.0);
    let mut decoder = DecodeModel::new(&loaded.model, &[]);
    let before = generate_with(Decoder::Libtorch, &decoder, &prompts, &params, 9).unwrap();
    // A change of the weights in place, as AdamW makes it.
    tch::no_grad(|| {
        for block in &mut loaded.model.layers {
            let _ = block.mlp.down_proj.weight.g_mul_scalar_(1.1);
        }
    });
    decoder.refresh(&loaded.model, &[]);
    let rebuilt = DecodeModel::new(&loaded.model, &[]);
    for engine in [Decoder::Libtorch, Decoder::Native { threads: 1 }] {
        let refreshed = generate_with(engine, &decoder, &prompts, &params, 9).unwrap();
        let expected = generate_with(engine, &rebuilt, &prompts, &params, 9).unwrap();
        assert_same_generation(&format!("{engine:?}, refreshed"), &refreshed, &expected, 0.0);
    }
    let after = generate_with(Decoder::Libtorch, &decoder, &prompts, &params, 9).unwrap();
    assert_ne!(after.completion_ids, before.completion_ids, "the weight change changed no token: the check is void");
}

/// Runs stacked on a leading axis sample what each samples alone: three runs of one
/// architecture with different weights, prompts (run 1's all shorter than the others', so its
/// part is cut back to its own padding) and seeds decode together, and each run gets the tokens
/// its own decoder draws (libtorch, and the native sampler on the CPU), log-probabilities within
/// 1e-4; after a weight change, a refreshed stack follows.
#[test]
fn stacked_runs_sample_what_each_run_samples_alone() {
    check_stacked_runs(Device::Cpu, &[Decoder::Libtorch]);
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
fn stacked_runs_sample_what_each_run_samples_alone_on_cuda() {
    check_stacked_runs(cuda_device(), &[Decoder::Libtorch, Decoder::CudaGraphs]);
}

fn check_stacked_runs(device: Device, engines: &[Decoder]) {
    // Every tensor of run r > 0 (embeddings, norms, projections, head) perturbed by its own
    // noise, so a run reading another run's tensor anywhere samples differently.
    let perturb = |loaded: &mut LoadedModel, seed: i64| {
        tch::manual_seed(seed);
        tch::no_grad(|| {
            for (_, tensor) in loaded.model.base_tensors() {
                let noise = tensor.randn_like() * tensor.abs().mean(Kind::Float) * 0.1;
                let _ = tensor.shallow_clone().g_add_(&noise);
            }
        })
    };
    let mut runs: Vec<LoadedModel> = (0..3)
        .map(|run| {
            let (mut loaded, _) = load_on("tiny-stories", device);
            if run > 0 {
                perturb(&mut loaded, run);
            }
            loaded
        })
        .collect();
    let mut parts: Vec<DecodeModel> = runs.iter().map(|r| DecodeModel::new(&r.model, &[])).collect();
    let mut stacked = DecodeModel::stacked(&parts.iter().collect::<Vec<_>>());
    assert_eq!(stacked.runs(), 3);
    let story = story_prompts(&runs[0], 5);
    let short: Vec<Vec<u32>> = story.iter().map(|p| p[..p.len().min(3)].to_vec()).collect();
    // Runs 0 and 2 have the same prompts and seed: only their weights differ.
    let prompts = [story.clone(), short, story];
    let seeds = [3, 11, 3];
    let check = |stacked: &DecodeModel, parts: &[DecodeModel], label: &str| {
        for params in [sampling(40, 1.0, 0, 1.0, 1.0), sampling(21, 0.7, 20, 0.9, 1.3), sampling(12, 0.0, 0, 1.0, 1.0)] {
            for &engine in engines {
                let prompt_refs: Vec<&[Vec<u32>]> = prompts.iter().map(Vec::as_slice).collect();
                let together: Vec<Generation> = generate_stacked(engine, stacked, &prompt_refs, &params, &seeds).unwrap().into_iter().map(Result::unwrap).collect();
                assert_eq!(together.len(), 3);
                let context = |run: usize| format!("{label}, {engine:?}, {params:?}, run {run}");
                for (run, part) in parts.iter().enumerate() {
                    let mut alone_engines = vec![Decoder::Libtorch];
                    alone_engines.extend(part.native().map(|_| Decoder::Native { threads: 2 }));
                    for alone_engine in alone_engines {
                        let alone = generate_with(alone_engine, part, &prompts[run], &params, seeds[run]).unwrap();
                        assert_eq!(together[run].prompt_ids, alone.prompt_ids, "{}: prompt ids", context(run));
                        assert_eq!(together[run].prompt_mask, alone.prompt_mask, "{}: prompt mask", context(run));
                        assert_same_generation(&format!("{} against {alone_engine:?} alone", context(run)), &together[run], &alone, TOLERANCE);
                    }
                }
                assert_ne!(together[0].completion_ids, together[2].completion_ids, "{}: runs 0 and 2 differ only in weights", context(2));
            }
        }
    };
    check(&stacked, &parts, "stacked");
    let run_1 = |part: &DecodeModel| generate_with(Decoder::Libtorch, part, &prompts[1], &sampling(40, 1.0, 0, 1.0, 1.0), seeds[1]).unwrap().completion_ids;
    let before = run_1(&parts[1]);
    perturb(&mut runs[1], 7);
    parts[1].refresh(&runs[1].model, &[]);
    // Otherwise a stack that kept run 1's old weights would pass the check below.
    assert_ne!(run_1(&parts[1]), before, "the new weights sample differently");
    stacked.refresh_stacked(&parts.iter().collect::<Vec<_>>());
    check(&stacked, &parts, "refreshed");
}

/// A run whose weights diverged (a NaN in one layer) fails with the same message on every
/// engine, alone or stacked, and the run stacked with it samples what it samples alone.
#[test]
fn a_diverged_run_fails_alone_on_every_engine_and_in_a_stack() {
    let (healthy, _) = load("tiny-stories");
    let (broken, _) = load("tiny-stories");
    tch::no_grad(|| {
        let _ = broken.model.layers[2].mlp.down_proj.weight.shallow_clone().get(0).get(0).fill_(f64::NAN);
    });
    let parts = [DecodeModel::new(&healthy.model, &[]), DecodeModel::new(&broken.model, &[])];
    let stacked = DecodeModel::stacked(&parts.iter().collect::<Vec<_>>());
    let prompts = story_prompts(&healthy, 4);
    for params in [sampling(16, 1.0, 0, 1.0, 1.0), sampling(16, 0.0, 0, 1.0, 1.0)] {
        let diverged = |outcome: anyhow::Result<Generation>, engine: &str| {
            let error = format!("{:#}", outcome.err().unwrap_or_else(|| panic!("{engine}, {params:?}: a NaN weight must fail the sampling")));
            assert!(error.contains("sampling row 0: the logits are not a distribution") && error.contains("the weights diverged"), "{engine}: {error}");
        };
        diverged(generate_with(Decoder::Libtorch, &parts[1], &prompts, &params, 5), "libtorch");
        diverged(generate_with(Decoder::Native { threads: 2 }, &parts[1], &prompts, &params, 5), "native");
        let mut together = generate_stacked(Decoder::Libtorch, &stacked, &[&prompts, &prompts], &params, &[5, 5]).unwrap().into_iter();
        let first = together.next().unwrap().unwrap();
        assert_same_generation(&format!("the healthy run, {params:?}"), &first, &generate_with(Decoder::Libtorch, &parts[0], &prompts, &params, 5).unwrap(), TOLERANCE);
        diverged(together.next().unwrap(), "stacked");
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
fn cuda_graph_and_eager_decoding_draw_the_same_tokens() {
    let cuda = cuda_device();
    let (loaded, _) = load_on("tiny-stories", cuda);
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let prompts = story_prompts(&loaded, 12);
    // Seeds 3, 4, 3: the second and third calls replay the graphs captured by the first on
    // new inputs; 21 tokens need a graph for the shorter last chunk too.
    for params in [sampling(40, 1.0, 0, 1.0, 1.0), sampling(21, 0.7, 20, 0.9, 1.3), sampling(16, 0.0, 0, 1.0, 1.0)] {
        for seed in [3, 4, 3] {
            let eager = generate_with(Decoder::Libtorch, &decoder, &prompts, &params, seed).unwrap();
            let graphs = generate_with(Decoder::CudaGraphs, &decoder, &prompts, &params, seed).unwrap();
            // The same kernels on the same inputs: identical up to float rounding.
            assert_same_generation(&format!("{params:?}, seed {seed}"), &graphs, &eager, TOLERANCE);
        }
    }
}

/// Copies tiny-random into a temporary directory after `edit` changes its tensors or config,
/// and returns the load error.
fn load_error(edit: impl FnOnce(&mut BTreeMap<String, Tensor>, &mut serde_json::Value)) -> String {
    one_thread();
    let source = fixture("tiny-random");
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = model::weights::read_safetensors(&source.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    edit(&mut tensors, &mut config);
    let tensors: Vec<(String, Tensor)> = tensors.into_iter().collect();
    model::weights::write_safetensors(&dir.path().join("model.safetensors"), &tensors).unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(source.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    match model::load(dir.path().to_str().unwrap(), "main", Device::Cpu, Kind::Float) {
        Ok(_) => panic!("a broken model directory loaded"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_model_directories_name_the_file_and_the_problem() {
    let q = "model.layers.1.self_attn.q_proj.weight";
    let missing = load_error(|t, _| { t.remove(q); });
    assert!(missing.contains(q) && missing.contains("missing"), "{missing}");
    let shape = load_error(|t, _| { t.insert(q.into(), Tensor::zeros([128, 64], (Kind::Float, Device::Cpu))); });
    assert!(shape.contains(q) && shape.contains("[128, 64]") && shape.contains("model.safetensors"), "{shape}");
    let dtype = load_error(|t, _| { t.insert(q.into(), Tensor::zeros([128, 128], (Kind::Int64, Device::Cpu))); });
    assert!(dtype.contains(q) && dtype.contains("dtype"), "{dtype}");
    let unknown = load_error(|t, _| { t.insert("model.layers.0.self_attn.q_proj.bias".into(), Tensor::zeros([128], (Kind::Float, Device::Cpu))); });
    assert!(unknown.contains("q_proj.bias") && unknown.contains("not part of"), "{unknown}");
    let scaling = load_error(|_, c| { c["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0}); });
    assert!(scaling.contains("rope_scaling") && scaling.contains("config.json"), "{scaling}");
    let new_key = load_error(|_, c| { c["sliding_window"] = 128.into(); });
    assert!(new_key.contains("sliding_window"), "{new_key}");
    let untied = load_error(|_, c| { c["tie_word_embeddings"] = false.into(); });
    assert!(untied.contains("lm_head.weight") && untied.contains("missing"), "{untied}");
    let theta = load_error(|_, c| { c["rope_theta"] = 500000.0.into(); });
    assert!(theta.contains("disagree"), "{theta}");
}

#[test]
fn native_scorer_matches_the_training_forward_pass() {
    // The reference log-probabilities of GRPO: native (unpadded rows, positions from 0) against
    // the libtorch scoring path (left-padded batch, positions 0..T, as TRL).
    let (loaded, _) = load("tiny-stories");
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    let mut prompts: Vec<Vec<u32>> = text.lines().take(6).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    prompts[1].truncate(2);
    prompts[4].truncate(6);
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let generation = generate_with(Decoder::Libtorch, &decoder, &prompts, &sampling(60, 1.0, 0, 1.0, 1.0), 3).unwrap();
    assert!(generation.rows.iter().any(|r| r.ended_with_eos) && generation.rows.iter().any(|r| !r.ended_with_eos));
    for (temperature, threads) in [(1.0, 1), (0.7, 2)] {
        let native = smallrl::model::native::frozen_logprobs(decoder.native().unwrap(), &generation, temperature, threads).unwrap();
        let reference = smallrl::engine::frozen_logprobs(&loaded.model, (&generation).into(), temperature, &[]);
        let mask = &generation.completion_mask;
        let diff = masked_diff(&native.unsqueeze(-1), &reference.unsqueeze(-1), mask);
        assert!(diff <= TOLERANCE, "temperature {temperature}: native vs libtorch log-probs differ by {diff}");
        assert_eq!(native.masked_select(&mask.eq(0)).abs().sum(Kind::Float).double_value(&[]), 0.0, "padding must be 0");
    }
}

/// The architecture is described once (`Llama::build`: each base tensor's name and shape beside
/// its field) and walked back by `base_tensors`: the same names in the same order with the same
/// shapes, exactly the tensors transformers saved for each fixture; the frozen copy built
/// through it holds equal values in storage of its own.
#[test]
fn the_model_is_described_once_and_its_walk_names_what_transformers_saved() {
    for name in ["tiny-random", "tiny-stories"] {
        let (loaded, _) = load(name);
        let model = &loaded.model;
        let mut built = Vec::new();
        let mut record = |name: &str, shape: &[usize]| {
            built.push((name.to_string(), shape.to_vec()));
            Ok(Tensor::zeros(shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), (Kind::Float, Device::Cpu)))
        };
        smallrl::model::Llama::build(model.config.clone(), &mut record, model.rope.shared(), Device::Cpu, Kind::Float).unwrap();
        let walked: Vec<(String, Vec<usize>)> = model.base_tensors().iter().map(|(n, t)| (n.clone(), t.size().iter().map(|&d| d as usize).collect())).collect();
        assert_eq!(built, walked, "{name}: build and base_tensors disagree");
        let saved: std::collections::BTreeSet<String> = model::weights::read_safetensors(&fixture(name).join("model.safetensors"))
            .unwrap()
            .into_keys()
            .filter(|n| !n.ends_with("rotary_emb.inv_freq") && !(model.config.tie_word_embeddings && n == "lm_head.weight"))
            .collect();
        assert_eq!(walked.iter().map(|(n, _)| n.clone()).collect::<std::collections::BTreeSet<_>>(), saved, "{name}: the walk names what transformers saved");
        let frozen = model.frozen_copy();
        for ((n, ours), (_, copy)) in model.base_tensors().into_iter().zip(frozen.base_tensors()) {
            assert!(ours.equal(copy), "{name}: {n} copied exactly");
            assert_ne!(ours.data_ptr(), copy.data_ptr(), "{name}: {n} in storage of its own");
        }
    }
}

/// At 135M the native sampler runs one stream of all rows whose matrix products the threads
/// split (each weight read once per step); at 1.25M one stream per thread. Either way a row's
/// tokens and log-probabilities are its own: the same bits with 1 thread and with 2, on the real
/// SmolLM2-135M-Instruct (the shared path) and on tiny-stories (the per-thread one).
#[test]
fn the_native_sampler_draws_the_same_bits_with_one_thread_or_two() {
    one_thread();
    for dir in [common::real_model_dir(), fixture("tiny-stories")] {
        let loaded = model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
        let decoder = DecodeModel::new(&loaded.model, &[]);
        let native = decoder.native().expect("the native sampler on the CPU in float32");
        let prompts: Vec<Vec<u32>> = ["Once upon a time", "The cat", "Why is the sky blue?", "1 2 3"].iter().map(|p| loaded.tokenizer.encode(p).unwrap()).collect();
        let params = sampling(12, 1.0, 50, 1.0, 1.0);
        let one = model::native::generate(native, &prompts, &params, 7, 1).unwrap();
        let two = model::native::generate(native, &prompts, &params, 7, 2).unwrap();
        assert!(one.completion_ids.equal(&two.completion_ids), "{}: tokens differ between 1 and 2 threads", dir.display());
        assert!(one.sampling_logprobs.equal(&two.sampling_logprobs), "{}: log-probabilities differ between 1 and 2 threads", dir.display());
    }
}

/// With top_k the sampler's log-probability of a token is that of the distribution it draws
/// from: the temperature-scaled softmax truncated to the k most likely tokens and renormalised
/// (vLLM's `processed_logprobs`, which TRL's GRPO asks for so that its importance-sampling
/// correction sees the sampler's own probabilities), not the full softmax. Recomputed here in
/// float64 from a full forward pass over each prompt and its completion, for both engines.
#[test]
fn top_k_sampling_log_probabilities_are_those_of_the_truncated_renormalised_distribution() {
    let (loaded, _) = load("tiny-stories");
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    let prompts: Vec<Vec<u32>> = text.lines().take(4).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let (k, temperature) = (5_i64, 0.8);
    let params = sampling(16, temperature, k as usize, 1.0, 1.0);
    let (mut tokens, mut truncation_matters) = (0, 0);
    for engine in [Decoder::Libtorch, Decoder::Native { threads: 1 }] {
        let generation = generate_with(engine, &decoder, &prompts, &params, 3).unwrap();
        for (r, (prompt, row)) in prompts.iter().zip(&generation.rows).enumerate() {
            let mut completion = row.ids.clone();
            if row.ended_with_eos {
                completion.push(loaded.model.config.eos_token_id);
            }
            let ids: Vec<i64> = prompt.iter().chain(&completion).map(|&t| t as i64).collect();
            let input = Tensor::from_slice(&ids).unsqueeze(0);
            let logits = full_forward_logits(&loaded.model, &input, &input.ones_like()).squeeze_dim(0).to_kind(Kind::Double) / temperature;
            for (j, &token) in completion.iter().enumerate() {
                let scores = logits.get((prompt.len() + j - 1) as i64);
                let (top, _) = scores.topk(k, -1, true, true);
                let threshold = top.double_value(&[k - 1]);
                assert!(scores.double_value(&[token as i64]) >= threshold, "{engine:?} row {r} step {j}: token {token} is outside the top {k}");
                let kept = scores.masked_fill(&scores.lt(threshold), f64::NEG_INFINITY);
                let truncated = kept.log_softmax(-1, Kind::Double).double_value(&[token as i64]);
                let full = scores.log_softmax(-1, Kind::Double).double_value(&[token as i64]);
                let ours = generation.sampling_logprobs.double_value(&[r as i64, j as i64]);
                assert!((ours - truncated).abs() <= TOLERANCE, "{engine:?} row {r} step {j}: sampler {ours}, truncated softmax {truncated} (full {full})");
                tokens += 1;
                truncation_matters += usize::from(truncated - full > 10.0 * TOLERANCE);
            }
        }
    }
    assert!(tokens > 40 && truncation_matters > tokens / 4, "the truncated and the full softmax differ on {truncation_matters} of {tokens} tokens: the check cannot tell them apart");
}
