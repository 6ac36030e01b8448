//! `sampler_dtype: bfloat16` on tiny-stories: both decoders sample from bfloat16 weights (the
//! native sampler's matrices rounded, the libtorch decoder's folded weights cast), their
//! log-probabilities within bfloat16's precision of the float32 policy's and measurably not
//! equal to them; the native one draws the same bits with one stream or three. (On the real
//! SmolLM2 against float64: `tests/real_model.rs`.)

mod common;

use common::{fixture, max_abs_diff, one_thread};
use smallrl::model::decode::DecodeModel;
use smallrl::model::folded::SamplerDtype;
use smallrl::model::generate::{Decoder, Generation, SamplingParams, generate_with};
use smallrl::model::{self, LoadedModel};
use tch::{Device, Kind};

/// As `tests/real_model.rs`: bfloat16 keeps 8 significant bits; bounds on |log p - float32|.
const BF16_TOLERANCE: f64 = 0.5;
const BF16_MEAN_TOLERANCE: f64 = 0.1;

fn tiny_stories() -> (LoadedModel, Vec<Vec<u32>>) {
    one_thread();
    let dir = fixture("tiny-stories");
    let loaded = model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let text = std::fs::read_to_string(dir.join("prompts.txt")).unwrap();
    let prompts = text.lines().take(6).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    (loaded, prompts)
}

/// The largest and mean |sampler log-prob - the float32 policy's| over the completion tokens.
fn mismatch(loaded: &LoadedModel, generation: &Generation) -> (f64, f64) {
    let policy = smallrl::engine::frozen_logprobs(&loaded.model, generation.into(), 1.0, &[]);
    let mask = generation.completion_mask.to_kind(Kind::Double);
    let diff = (generation.sampling_logprobs.to_kind(Kind::Double) - policy.to_kind(Kind::Double)).abs() * &mask;
    (diff.max().double_value(&[]), diff.sum(Kind::Double).double_value(&[]) / mask.sum(Kind::Double).double_value(&[]))
}

#[test]
fn both_decoders_sample_in_bfloat16_within_its_precision_of_the_float32_policy() {
    let (loaded, prompts) = tiny_stories();
    let params = SamplingParams { max_new_tokens: 40, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let float32 = DecodeModel::new(&loaded.model, &[]);
    let bfloat16 = DecodeModel::sampling_in(&loaded.model, &[], SamplerDtype::Bfloat16);
    assert_eq!((float32.kind, bfloat16.kind), (Kind::Float, Kind::BFloat16), "the libtorch decoder's folded weights are cast");
    let exact = generate_with(Decoder::Native { threads: 1 }, &float32, &prompts, &params, 3).unwrap();
    let (exact_max, _) = mismatch(&loaded, &exact);
    for engine in [Decoder::Native { threads: 1 }, Decoder::Libtorch] {
        let generation = generate_with(engine, &bfloat16, &prompts, &params, 3).unwrap();
        let (max, mean) = mismatch(&loaded, &generation);
        println!("{engine:?}: |sampler log p - float32 policy| max {max:.3e}, mean {mean:.3e} (float32 sampler: max {exact_max:.3e})");
        assert!(max <= BF16_TOLERANCE && mean <= BF16_MEAN_TOLERANCE, "{engine:?}: bfloat16 sampler off the float32 policy by {max} (mean {mean})");
        assert!(max > 1e-3 && max > 100.0 * exact_max, "{engine:?}: a bfloat16 sampler within {max} of float32: the weights were not rounded");
    }
    let three = generate_with(Decoder::Native { threads: 3 }, &bfloat16, &prompts, &params, 3).unwrap();
    let one = generate_with(Decoder::Native { threads: 1 }, &bfloat16, &prompts, &params, 3).unwrap();
    assert!(one.completion_ids.equal(&three.completion_ids) && one.sampling_logprobs.equal(&three.sampling_logprobs), "one stream and three differ");
    assert!(max_abs_diff(&one.sampling_logprobs, &exact.sampling_logprobs) > 0.0);
}

#[test]
fn a_refreshed_bfloat16_decoder_samples_as_a_new_one() {
    let (loaded, prompts) = tiny_stories();
    let params = SamplingParams { max_new_tokens: 20, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let mut refreshed = DecodeModel::sampling_in(&loaded.model, &[], SamplerDtype::Float32);
    let mut bfloat16 = DecodeModel::sampling_in(&loaded.model, &[], SamplerDtype::Bfloat16);
    refreshed.refresh(&loaded.model, &[]);
    bfloat16.refresh(&loaded.model, &[]);
    let fresh = DecodeModel::sampling_in(&loaded.model, &[], SamplerDtype::Bfloat16);
    for engine in [Decoder::Native { threads: 1 }, Decoder::Libtorch] {
        let (a, b) = (generate_with(engine, &bfloat16, &prompts, &params, 5).unwrap(), generate_with(engine, &fresh, &prompts, &params, 5).unwrap());
        assert!(a.completion_ids.equal(&b.completion_ids) && a.sampling_logprobs.equal(&b.sampling_logprobs), "{engine:?}: a refreshed bfloat16 decoder differs from a new one");
    }
    assert_eq!(refreshed.kind, Kind::Float, "a float32 decoder stays float32 when refreshed");
}
