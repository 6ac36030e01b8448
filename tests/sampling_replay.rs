//! Sampling replay (issue 46): the kept sets both samplers record with top_k/top_p, against
//! HF's warpers recomputed in float64, and the policy's log-probabilities renormalised over
//! them, against float64 and the sampler's. Also the samplers' log-probabilities under a
//! repetition penalty against HF's processors in float64.

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

/// A sampled row's completion (with its EOS) and the float64 logits `[len, vocab]` of a full
/// forward pass over the row alone (prompt and completion, no padding).
fn row_logits(loaded: &LoadedModel, prompt: &[u32], row: &smallrl::model::generate::CompletionRow) -> (Vec<u32>, Tensor) {
    let mut completion = row.ids.clone();
    if row.ended_with_eos {
        completion.push(loaded.model.config.eos_token_id);
    }
    let ids: Vec<i64> = prompt.iter().chain(&completion).map(|&t| t as i64).collect();
    let input = Tensor::from_slice(&ids).unsqueeze(0);
    (completion, full_forward_logits(&loaded.model, &input, &input.ones_like()).squeeze_dim(0).to_kind(Kind::Double))
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
                let (completion, logits) = row_logits(&loaded, prompt, row);
                let logits = logits / temperature;
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

/// HF's `RepetitionPenaltyLogitsProcessor` in float64: every id of `seen` (HF's `input_ids`)
/// has its score divided by `penalty`, or multiplied when negative.
fn hf_repetition_penalty(scores: &[f64], seen: &[u32], penalty: f64) -> Vec<f64> {
    let mut out = scores.to_vec();
    for &t in seen {
        let s = scores[t as usize];
        out[t as usize] = if s < 0.0 { s * penalty } else { s / penalty };
    }
    out
}

/// The float64 rule is transformers' own on a hand case (an id repeated, a zero and a negative
/// score): `RepetitionPenaltyLogitsProcessor(2.0)` of transformers 5.23 on these scores and
/// `input_ids = [[1, 0, 0, 5, 4]]` returns `[1, -2, 0.5, 3, -0.5, 0]`.
#[test]
fn repetition_penalty_reference_is_transformers_rule() {
    let penalized = hf_repetition_penalty(&[2.0, -1.0, 0.5, 3.0, -0.25, 0.0], &[1, 0, 0, 5, 4], 2.0);
    assert_eq!(penalized, [1.0, -2.0, 0.5, 3.0, -0.5, 0.0]);
}

/// Under a repetition penalty, each sampled token's log-probability from both engines (prompts
/// of different lengths: left padding in libtorch, none natively) is HF's processors in
/// float64 on a full forward pass of the row alone: the penalty on the raw logits over the
/// row's prompt and its completion so far (no padding: what HF penalises for an unpadded row,
/// and vLLM for every row), then temperature, top-k and top-p, the log-probability taken of
/// that processed distribution. Rules that penalise other ids (none, the completion only) are
/// counted, so the check shows what it tells apart. Also penalising the pad id (HF's rule in a
/// left-padded batch, whose `input_ids` hold the pads) moves these log-probabilities by under
/// 1e-5, below the tolerance: it is printed, not told apart. The tolerance is absolute: on a
/// near-certain token (log-probability about -5e-4) float32's softmax sum drops up to 4% of the
/// tail mass (about 2e-5; torch's float32 `log_softmax` on the same penalised logits gives the
/// sampler's value), so a bound relative to the tail would fail on float32 alone.
#[test]
fn repetition_penalty_log_probabilities_are_hf_processors_in_float64() {
    let loaded = load_tiny_stories();
    let mut prompts = story_prompts(&loaded, 5);
    prompts[3].truncate(5);
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let (eos, penalty) = (loaded.model.config.eos_token_id, 1.3);
    for (temperature, top_k, top_p) in [(1.0, 0_i64, 1.0), (0.7, 20, 0.9), (0.0, 0, 1.0)] {
        let params = SamplingParams { max_new_tokens: 16, temperature, top_k: top_k as usize, top_p, repetition_penalty: penalty, kept_sets: temperature > 0.0 };
        // Tokens where a rival rule is off the sampler by more than the tolerance (no penalty,
        // the completion only), and the most the pad id's penalty moves a padded row's.
        let (mut tokens, mut unpenalized, mut completion_only, mut with_pad, mut boundary) = (0, 0, 0, 0.0_f64, 0);
        for engine in [Decoder::Libtorch, Decoder::Native { threads: 1 }] {
            let context = format!("{engine:?} penalty {penalty} temperature {temperature} top_k {top_k} top_p {top_p}");
            let generation = generate_with(engine, &decoder, &prompts, &params, 11).unwrap();
            for (r, (prompt, row)) in prompts.iter().zip(&generation.rows).enumerate() {
                let (completion, logits) = row_logits(&loaded, prompt, row);
                for (j, &token) in completion.iter().enumerate() {
                    let raw = Vec::<f64>::try_from(logits.get((prompt.len() + j - 1) as i64)).unwrap();
                    let seen: Vec<u32> = prompt.iter().chain(&completion[..j]).copied().collect();
                    let kept = generation.kept.as_ref().map(|k| Vec::<i64>::try_from(k.get(r as i64).get(j as i64)).unwrap());
                    let at = [r as i64, j as i64];
                    let sampler = generation.sampling_logprobs.double_value(&at);
                    // A rival rule gets its own warpers' set: the sampler's recorded set is that of the rule it applied.
                    let logprob = |seen: &[u32], kept: Option<&[i64]>, boundary: &mut usize| {
                        processed_logprob(&hf_repetition_penalty(&raw, seen, penalty), token, temperature, top_k, top_p, kept, boundary)
                    };
                    let reference = logprob(&seen, kept.as_deref(), &mut boundary);
                    assert!((sampler - reference).abs() <= TOLERANCE, "{context} row {r} step {j}: sampler {sampler}, HF processors in float64 {reference}");
                    let mut ignored = 0;
                    unpenalized += usize::from((sampler - logprob(&[], None, &mut ignored)).abs() > TOLERANCE);
                    completion_only += usize::from((sampler - logprob(&completion[..j], None, &mut ignored)).abs() > TOLERANCE);
                    if prompt.len() < longest {
                        let padded: Vec<u32> = seen.iter().copied().chain([eos]).collect();
                        with_pad = with_pad.max((sampler - logprob(&padded, None, &mut ignored)).abs());
                    }
                    tokens += 1;
                }
            }
        }
        eprintln!("temperature {temperature} top_k {top_k} top_p {top_p}: {tokens} tokens; rival rules off by more than {TOLERANCE}: unpenalised {unpenalized}, completion only {completion_only}; pad id penalised too: at most {with_pad:.2e} off; {boundary} boundary disagreements");
        assert!(unpenalized > tokens / 10 && completion_only > tokens / 20, "the penalty rules differ too rarely on {tokens} tokens: the check cannot tell");
        assert!(boundary <= tokens / 20, "{boundary} boundary disagreements in {tokens} tokens");
    }
}

/// The log-probability of `token` after HF's temperature, top-k and top-p on `penalized`
/// (float64), or of the log-softmax alone at temperature 0 (greedy: the sampler records the
/// penalised distribution). With the sampler's kept set, the set it records is used where HF's
/// warpers differ only within float32 rounding of the boundary (counted in `boundary`).
fn processed_logprob(penalized: &[f64], token: u32, temperature: f64, top_k: i64, top_p: f64, kept: Option<&[i64]>, boundary: &mut usize) -> f64 {
    let scores = Tensor::from_slice(penalized);
    if temperature == 0.0 {
        return scores.log_softmax(-1, Kind::Double).double_value(&[token as i64]);
    }
    let scores = scores / temperature;
    let (expected, margin) = hf_warpers_kept(&scores, top_k, top_p);
    let mut ours = expected.clone();
    if let Some(kept) = kept {
        ours.iter_mut().for_each(|k| *k = false);
        kept.iter().for_each(|&v| ours[v as usize] = true);
        for v in 0..ours.len() {
            if ours[v] != expected[v] {
                assert!(margin[v] < 1e-4, "token {v} kept {} by the sampler, {} by HF's warpers (margin {})", ours[v], expected[v], margin[v]);
                *boundary += 1;
            }
        }
    }
    let dropped = Tensor::from_slice(&ours).logical_not();
    scores.masked_fill(&dropped, f64::NEG_INFINITY).log_softmax(-1, Kind::Double).double_value(&[token as i64])
}
