//! `sampler_dtype: bfloat16` on tiny-stories: both decoders sample from bfloat16 weights (the
//! native sampler's matrices rounded, the libtorch decoder's folded weights cast), their
//! log-probabilities within bfloat16's precision of the float32 policy's and measurably not
//! equal to them; the native one draws the same bits with one stream or three. (On the real
//! SmolLM2 against float64: `tests/real_model.rs`.) And a run's sampler refreshed in place after
//! the policy's weights change (`DecodeModel::deliver`: the weights folded again, the native
//! copy refilled in its own memory, checked and fingerprinted) holds what a sampler made new
//! from the changed weights holds, in float32 and in bfloat16, its fingerprint the float64
//! formula's over the model's parameters.

mod common;

use common::{fixture, max_abs_diff, one_thread};
use smallrl::model::decode::DecodeModel;
use smallrl::model::folded::{FoldedWeights, SamplerDtype};
use smallrl::model::generate::{Decoder, Generation, SamplingParams, generate_with};
use smallrl::model::{self, Llama, LoadedModel};
use tch::{Device, Kind, Tensor};

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

/// Changes every tensor the fold reads in place, as an optimizer step does: the embeddings (and
/// the head tied to them), the norms, each projection.
fn change_weights(model: &mut Llama) {
    tch::no_grad(|| {
        let _ = model.embed_tokens.g_mul_scalar_(1.01);
        let _ = model.norm.g_add_scalar_(0.01);
        for (i, block) in model.layers.iter_mut().enumerate() {
            let factor = 1.0 + 0.01 * (i + 1) as f64;
            let _ = block.input_layernorm.g_add_scalar_(0.02);
            let _ = block.post_attention_layernorm.g_add_scalar_(-0.01);
            let attn = &mut block.self_attn;
            for weight in [&mut attn.q_proj.weight, &mut attn.k_proj.weight, &mut attn.v_proj.weight, &mut attn.o_proj.weight] {
                let _ = weight.g_mul_scalar_(factor);
            }
            for weight in [&mut block.mlp.gate_proj.weight, &mut block.mlp.up_proj.weight, &mut block.mlp.down_proj.weight] {
                let _ = weight.g_mul_scalar_(2.0 - factor);
            }
        }
    });
}

/// The sampler's fingerprint of `model`'s weights in float64, from its parameters with the
/// fold written out (as `tests/train/off_policy.rs` does from a checkpoint): the sum over the
/// folded tensors of (k + 1) * (sum + sum of squares), in their order (embeddings, final norm,
/// head; per layer: input norm, the q k rot(q) rot(k) v columns with q's rows times
/// head_dim^-0.5 in float32, o, post-attention norm, gate and up, down). With a bfloat16
/// sampler the matrices' values are rounded to bfloat16 first. A rotated row set is each head's
/// second half negated then its first half: its squares are the rows', its sum the first half's
/// minus the second's.
fn fingerprint_f64(model: &Llama, dtype: SamplerDtype) -> f64 {
    let read = |t: &Tensor, matrix: bool| match (matrix, dtype) {
        (true, SamplerDtype::Bfloat16) => t.to_kind(Kind::BFloat16).to_kind(Kind::Double),
        _ => t.to_kind(Kind::Double),
    };
    let sums = |t: &Tensor| (t.sum(Kind::Double).double_value(&[]), t.square().sum(Kind::Double).double_value(&[]));
    let head_dim = model.config.head_dim as i64;
    let halves_apart = |t: &Tensor| {
        let per_head = t.view([-1, head_dim, t.size()[1]]);
        (per_head.narrow(1, 0, head_dim / 2).sum(Kind::Double) - per_head.narrow(1, head_dim / 2, head_dim / 2).sum(Kind::Double)).double_value(&[])
    };
    let scale = (head_dim as f64).powf(-0.5);
    let mut tensors = vec![sums(&read(&model.embed_tokens, false)), sums(&read(&model.norm, false)), sums(&read(model.head_weight(), true))];
    for block in &model.layers {
        let attn = &block.self_attn;
        let q = read(&(&attn.q_proj.weight * scale), true);
        let (k, v) = (read(&attn.k_proj.weight, true), read(&attn.v_proj.weight, true));
        let ((sq, qq), (sk, qk), (sv, qv)) = (sums(&q), sums(&k), sums(&v));
        let qkv = (sq + sk + halves_apart(&q) + halves_apart(&k) + sv, 2.0 * qq + 2.0 * qk + qv);
        let ((sg, qg), (su, qu)) = (sums(&read(&block.mlp.gate_proj.weight, true)), sums(&read(&block.mlp.up_proj.weight, true)));
        tensors.extend([
            sums(&read(&block.input_layernorm, false)),
            qkv,
            sums(&read(&attn.o_proj.weight, true)),
            sums(&read(&block.post_attention_layernorm, false)),
            (sg + su, qg + qu),
            sums(&read(&block.mlp.down_proj.weight, true)),
        ]);
    }
    tensors.iter().enumerate().map(|(k, (sum, squares))| (k + 1) as f64 * (sum + squares)).sum()
}

/// A decoder made before the weights change (and decoded with libtorch once, so that its
/// libtorch weights exist), then refreshed in place, against one made new from the changed
/// weights: the same fingerprint bit for bit (exact: the same values summed in the same
/// chunks) and within 1e-12 relative of the float64 formula (the change moves it by over
/// 1e-3), the same libtorch weights' fingerprints (made again from the refreshed copy), and the
/// same tokens and log-probabilities from both engines bit for bit (exact: the same weights and
/// the same random streams).
#[test]
fn a_sampler_refreshed_in_place_holds_what_a_new_one_folded_from_the_changed_weights_holds() {
    let params = SamplingParams { max_new_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    for dtype in [SamplerDtype::Float32, SamplerDtype::Bfloat16] {
        let (mut loaded, prompts) = tiny_stories();
        let mut refreshed = DecodeModel::sampling_in(&loaded.model, &[], dtype);
        let before = refreshed.delivered_fingerprint();
        let old_tokens = generate_with(Decoder::Libtorch, &refreshed, &prompts, &params, 4).unwrap().completion_ids;
        change_weights(&mut loaded.model);
        let delivered = refreshed.deliver(FoldedWeights::new(&loaded.model, &[]), true).expect("the refreshed copy holds the fold");
        let new = DecodeModel::sampling_in(&loaded.model, &[], dtype);
        assert_eq!(delivered.to_bits(), new.delivered_fingerprint().to_bits(), "{dtype:?}: fingerprints {delivered} and {}", new.delivered_fingerprint());
        let reference = fingerprint_f64(&loaded.model, dtype);
        assert!((delivered - reference).abs() <= 1e-12 * reference.abs(), "{dtype:?}: fingerprint {delivered}, float64 {reference}");
        assert!((before - reference).abs() > 1e-3 * reference.abs(), "{dtype:?}: the change moved the fingerprint only from {before} to {reference}");
        let bits = |values: Vec<f64>| values.into_iter().map(f64::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(refreshed.fingerprints()), bits(new.fingerprints()), "{dtype:?}: the libtorch weights");
        for engine in [Decoder::Native { threads: 1 }, Decoder::Libtorch] {
            let (ours, theirs) = (generate_with(engine, &refreshed, &prompts, &params, 4).unwrap(), generate_with(engine, &new, &prompts, &params, 4).unwrap());
            assert!(ours.completion_ids.equal(&theirs.completion_ids) && ours.sampling_logprobs.equal(&theirs.sampling_logprobs), "{dtype:?}, {engine:?}: the refreshed decoder samples otherwise");
            assert!(!ours.completion_ids.equal(&old_tokens), "{dtype:?}, {engine:?}: the change changed no token (the comparison is void)");
        }
    }
}

/// A fold made `owned` holds the snapshot: the model's weights changed in place after it (as
/// the optimizer changes them while the sampler thread decodes ahead) leave its fingerprints
/// as they were (exact: the same bits summed twice), while a plain fold, whose embeddings and
/// norms are views of the model's parameters, moves with them (the test sees the difference).
#[test]
fn an_owned_fold_keeps_its_snapshot_while_the_model_changes() {
    let (mut loaded, _) = tiny_stories();
    let (owned, plain) = (FoldedWeights::new(&loaded.model, &[]).owned(), FoldedWeights::new(&loaded.model, &[]));
    let (owned_before, plain_before) = (owned.fingerprints_in(Kind::Float), plain.fingerprints_in(Kind::Float));
    change_weights(&mut loaded.model);
    assert_eq!(owned.fingerprints_in(Kind::Float), owned_before, "an owned fold is the snapshot");
    assert_ne!(plain.fingerprints_in(Kind::Float), plain_before, "a plain fold reads the model's embeddings and norms");
}
