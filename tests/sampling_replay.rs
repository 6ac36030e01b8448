//! Sampling replay (issue 46): the kept sets both samplers record with top_k/top_p, against
//! HF's warpers recomputed in float64, and the policy's log-probabilities renormalised over
//! them, against float64 and the sampler's.

mod common;

use common::{fixture, one_thread};
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Decoder, SamplingParams, generate_with};
use smallrl::model::{self, LoadedModel};
use tch::{Device, Kind, Tensor};

/// The logits tolerance of `tests/model.rs`.
const TOLERANCE: f64 = 1e-4;

fn load_tiny_stories() -> LoadedModel {
    one_thread();
    model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap()
}

fn full_forward_logits(model: &smallrl::model::Llama, ids: &Tensor, mask: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    model.logits(&model.forward(ids, mask, &[]))
}

/// The first `rows` prompts of the tiny-stories fixture, the second cut to 3 tokens (left
/// padding in libtorch).
fn story_prompts(loaded: &LoadedModel, rows: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    let mut prompts: Vec<Vec<u32>> = text.lines().cycle().take(rows).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    prompts[1].truncate(3);
    prompts
}

/// HF's `TopKLogitsWarper` then `TopPLogitsWarper` in float64 on one position's scores (logits
/// over the temperature): whether each token survives, and for each token how far it is from
/// the boundary (its score minus the k-th largest; its ascending cumulative probability minus
/// `1 - top_p`), so that a disagreement can be told from float32 rounding.
fn hf_warpers_kept(scores: &Tensor, top_k: i64, top_p: f64) -> (Vec<bool>, Vec<f64>) {
    let vocab = scores.size()[0];
    let mut scores = scores.shallow_clone();
    let mut margin = vec![f64::INFINITY; vocab as usize];
    if top_k > 0 {
        let (top, _) = scores.topk(top_k, -1, true, true);
        let threshold = top.double_value(&[top_k - 1]);
        for (v, m) in margin.iter_mut().enumerate() {
            *m = (scores.double_value(&[v as i64]) - threshold).abs();
        }
        scores = scores.masked_fill(&scores.lt(threshold), f64::NEG_INFINITY);
    }
    if top_p < 1.0 {
        let (sorted, order) = scores.sort(-1, false);
        let cumulative = Vec::<f64>::try_from(sorted.softmax(-1, Kind::Double).cumsum(-1, Kind::Double)).unwrap();
        let order = Vec::<i64>::try_from(order).unwrap();
        let mut removed = vec![false; vocab as usize];
        for (rank, &v) in order.iter().enumerate().take(vocab as usize - 1) {
            removed[v as usize] = cumulative[rank] <= 1.0 - top_p;
            margin[v as usize] = margin[v as usize].min((cumulative[rank] - (1.0 - top_p)).abs());
        }
        let removed = Tensor::from_slice(&removed);
        scores = scores.masked_fill(&removed, f64::NEG_INFINITY);
    }
    (Vec::<bool>::try_from(scores.ne(f64::NEG_INFINITY)).unwrap(), margin)
}

/// Sampling replay. Both engines record, for each sampled token, the tokens that survived
/// top_k/top_p: the sets HF's warpers keep, recomputed in float64 from a full forward pass
/// (a token on the other side only within float32 rounding of the boundary). The policy's
/// log-probabilities renormalised over those sets (`TokenLogprobs::replayed`, the training
/// pass) are float64's from the full forward pass within the logits tolerance and the sampler's
/// own within it (on policy, float32 sampler: ratio 1), where the full softmax is far from the
/// sampler's.
#[test]
fn kept_sets_are_hf_warpers_and_replayed_log_probabilities_match_the_sampler() {
    let loaded = load_tiny_stories();
    let prompts = story_prompts(&loaded, 4);
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let temperature = 0.9;
    let eos = loaded.model.config.eos_token_id;
    for (top_k, top_p) in [(5_i64, 1.0), (0, 0.8), (20, 0.9)] {
        let params = SamplingParams { max_new_tokens: 12, temperature, top_k: top_k as usize, top_p, repetition_penalty: 1.0, kept_sets: true };
        let capacity = smallrl::model::generate::kept_capacity(&params, loaded.model.config.vocab_size).unwrap() as i64;
        let (mut tokens, mut boundary, mut far_from_full) = (0, 0, 0);
        for engine in [Decoder::Libtorch, Decoder::Native { threads: 1 }] {
            let context = format!("{engine:?} top_k {top_k} top_p {top_p}");
            let generation = generate_with(engine, &decoder, &prompts, &params, 5).unwrap();
            let kept = generation.kept.as_ref().expect("kept sets recorded");
            assert_eq!(kept.size(), [4, generation.completion_ids.size()[1], capacity], "{context}");
            let replayed = smallrl::engine::completion_logprobs(&loaded.model, (&generation).into(), temperature, &[]);
            let (replayed, full) = (replayed.replayed.expect("replayed with kept sets"), replayed.logprobs);
            for (r, (prompt, row)) in prompts.iter().zip(&generation.rows).enumerate() {
                let mut completion = row.ids.clone();
                if row.ended_with_eos {
                    completion.push(eos);
                }
                let ids: Vec<i64> = prompt.iter().chain(&completion).map(|&t| t as i64).collect();
                let input = Tensor::from_slice(&ids).unsqueeze(0);
                let logits = full_forward_logits(&loaded.model, &input, &input.ones_like()).squeeze_dim(0).to_kind(Kind::Double) / temperature;
                for (j, &token) in completion.iter().enumerate() {
                    let scores = logits.get((prompt.len() + j - 1) as i64);
                    let (expected, margin) = hf_warpers_kept(&scores, top_k, top_p);
                    let recorded = Vec::<i64>::try_from(kept.get(r as i64).get(j as i64)).unwrap();
                    assert!(recorded.contains(&(token as i64)), "{context} row {r} step {j}: the drawn token is in its kept set");
                    let mut ours = vec![false; expected.len()];
                    recorded.iter().for_each(|&v| ours[v as usize] = true);
                    for v in 0..expected.len() {
                        if ours[v] != expected[v] {
                            assert!(margin[v] < 1e-4, "{context} row {r} step {j}: token {v} kept {} by the sampler, {} by HF's warpers (margin {})", ours[v], expected[v], margin[v]);
                            boundary += 1;
                        }
                    }
                    // float64 log-probability over the recorded set (and the token).
                    let in_set = Tensor::from_slice(&ours).logical_or(&Tensor::zeros([expected.len() as i64], (Kind::Bool, Device::Cpu)).index_fill(0, &Tensor::from_slice(&[token as i64]), 1));
                    let reference = scores.masked_fill(&in_set.logical_not(), f64::NEG_INFINITY).log_softmax(-1, Kind::Double).double_value(&[token as i64]);
                    let at = [r as i64, j as i64];
                    let (ours_replayed, sampler, ours_full) = (replayed.double_value(&at), generation.sampling_logprobs.double_value(&at), full.double_value(&at));
                    assert!((ours_replayed - reference).abs() <= TOLERANCE, "{context} row {r} step {j}: replayed {ours_replayed}, float64 {reference}");
                    assert!((ours_replayed - sampler).abs() <= TOLERANCE, "{context} row {r} step {j}: replayed {ours_replayed}, sampler {sampler}");
                    far_from_full += usize::from(sampler - ours_full > 10.0 * TOLERANCE);
                    tokens += 1;
                }
            }
        }
        eprintln!("top_k {top_k} top_p {top_p}: {tokens} tokens, {boundary} boundary disagreements, the full softmax off on {far_from_full}");
        assert!(tokens > 40 && far_from_full > tokens / 4, "top_k {top_k} top_p {top_p}: the full softmax differs from the sampler on {far_from_full} of {tokens} tokens: the check cannot tell");
        assert!(boundary <= tokens / 20, "top_k {top_k} top_p {top_p}: {boundary} boundary disagreements in {tokens} tokens");
    }
}
