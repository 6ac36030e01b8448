//! The model against transformers: logits on the fixtures (single prompts, a left-padded batch
//! on both position conventions), KV-cached decoding against the full forward pass.

mod common;

use std::collections::BTreeMap;

use common::{fixture, max_abs_diff, one_thread};
use smallrl::model::decode::{DecodeModel, prefill_mask};
use smallrl::model::{self, LoadedModel};
use tch::{Device, Kind, Tensor};

const TOLERANCE: f64 = 1e-4;

fn load(name: &str) -> (LoadedModel, BTreeMap<String, Tensor>) {
    one_thread();
    let dir = fixture(name);
    let loaded = model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let reference = model::weights::read_safetensors(&dir.join("reference.safetensors")).unwrap();
    (loaded, reference)
}

fn full_forward_logits(loaded: &LoadedModel, ids: &Tensor, mask: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    let hidden = loaded.model.forward(ids, mask, &[]);
    loaded.model.logits(&hidden)
}

fn check_single_prompts(name: &str) {
    let (loaded, reference) = load(name);
    for i in 0..4 {
        let ids = reference[&format!("input_ids_{i}")].unsqueeze(0);
        let logits = full_forward_logits(&loaded, &ids, &ids.ones_like());
        let diff = max_abs_diff(&logits.squeeze_dim(0), &reference[&format!("logits_{i}")]);
        assert!(diff <= TOLERANCE, "{name} prompt {i}: max |logits - transformers| = {diff}");
    }
}

#[test]
fn logits_match_transformers_on_tiny_random() {
    check_single_prompts("tiny-random");
}

#[test]
fn logits_match_transformers_on_tiny_stories() {
    check_single_prompts("tiny-stories");
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
        let logits = full_forward_logits(&loaded, ids, mask);
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
    let expected = full_forward_logits(&loaded, &ids, &ids.ones_like()).squeeze_dim(0);
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
        let mask = key_valid.unsqueeze(1).unsqueeze(1);
        let hidden = decoder.forward(&token, &position, &mut cache, slot, &mask);
        rows.push(decoder.logits(&hidden).squeeze_dim(0));
    }
    let diff = max_abs_diff(&Tensor::cat(&rows, 0), &expected);
    assert!(diff <= TOLERANCE, "cached decoding differs from the full pass by {diff}");
}
