//! Episodes continue their KV cache across turns (issue 48): a turn appends only the
//! observation's tokens to what earlier turns cached. Held to a float64 forward of each whole
//! sequence (the model loaded in float64), for the native sampler and the libtorch decoder;
//! greedy guess_number episodes draw the tokens that re-prefilling each turn's history draws,
//! wherever the float64 logits have no near-tie.
//! Needs `make plugins` (plugins/guess_number.wasm).

mod common;

use std::sync::Arc;

use common::{fixture, one_thread, standard_plugin};
use smallrl::episode::{EpisodePrompt, Observations, run_episodes};
use smallrl::model::LoadedModel;
use smallrl::model::batch::masked_rows;
use smallrl::model::continuation::{Continuation, Drawn};
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Decoder, SamplingParams, generate_with};
use smallrl::plugins::{EnvPrompt, EnvPromptContent, EnvSplit, EpisodeBounds, Plugin, PluginLimits, PromptMetadata};
use smallrl::reward::Prompt;
use tch::{Device, Kind, Tensor};

/// A sampler's log-probability of a token against the float64 forward of its whole sequence.
/// float32: the repo's logits bound (`tests/model.rs`, 1e-4 absolute for logits of order 1 to
/// 10: about a hundred times float32's relative rounding 6e-8 carried through the layers'
/// sums), doubled because a log-softmax moves by at most twice its largest logit error.
/// A wrong position, mask or cache slot moves log-probabilities by 0.1 or more.
const FLOAT32_BOUND: f64 = 2e-4;
/// The libtorch decoder on the model in float64: the cache and the forward are float64 (they
/// differ in summation order only, ~1e-15), but the sampler draws from the logits cast to
/// float32 and records float32 log-probabilities (`model::sampler`), so the bound is float32's
/// rounding of logits up to 20 in magnitude (1.2e-6) carried through the log-softmax's float32
/// sums over the vocabulary: 1e-5.
const FLOAT64_BOUND: f64 = 1e-5;

fn load(kind: Kind) -> LoadedModel {
    smallrl::model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, kind).unwrap()
}

fn sampling(max_new_tokens: usize, temperature: f64) -> SamplingParams {
    SamplingParams { max_new_tokens, temperature, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false }
}

/// Log-probabilities `[len, vocab]` of the next token after each token of `ids`, from a float64
/// forward of the whole sequence.
fn float64_logprobs(model: &smallrl::model::Llama, ids: &[u32]) -> Tensor {
    let _guard = tch::no_grad_guard();
    let input = Tensor::from_slice(&ids.iter().map(|&t| i64::from(t)).collect::<Vec<_>>()).unsqueeze(0);
    model.logits(&model.forward(&input, &input.ones_like(), &[])).squeeze_dim(0).to_kind(Kind::Double).log_softmax(-1, Kind::Double)
}

/// guess_number's prompts as the trainer holds them (text and metadata), which episodes start from.
fn held_prompts(env_prompts: &[EnvPrompt]) -> Vec<Prompt> {
    env_prompts
        .iter()
        .map(|p| {
            let EnvPromptContent::Text(text) = &p.content else { panic!("guess_number writes text prompts") };
            let metadata = PromptMetadata { json: serde_json::Value::Object(p.metadata.clone()).to_string(), hackable: Some(false), detectable: Some(false) };
            Prompt { text: text.clone(), metadata: Some(Arc::new(metadata)) }
        })
        .collect()
}

/// Three rows over three turns: every row starts from a prompt, row 1 leaves after the first
/// turn, rows 0 and 2 append observations of different lengths and continue twice. Each drawn
/// token's sampling log-probability (temperature 1, no truncation: the plain log-softmax)
/// equals the float64 forward's over the row's whole sequence, prompt, turns and observations.
/// The check can tell: the float64 next-token distributions of the last turn, the row's first
/// turn left out, differ by more than fifty times the float32 bound.
#[test]
fn continued_rows_match_a_float64_forward_of_the_whole_sequence() {
    one_thread();
    let (loaded, loaded64) = (load(Kind::Float), load(Kind::Double));
    let text = std::fs::read_to_string(fixture("tiny-stories").join("prompts.txt")).unwrap();
    let prompts: Vec<Vec<u32>> = text.lines().take(3).map(|l| loaded.tokenizer.encode(l).unwrap()).collect();
    let observations = ["\nlower\n", "\nAnswer with one number from 1 to 16.\n"].map(|o| loaded.tokenizer.encode(o).unwrap());
    let cases = [
        (DecodeModel::new(&loaded.model, &[]), Decoder::Native { threads: 2 }, FLOAT32_BOUND),
        (DecodeModel::new(&loaded.model, &[]), Decoder::Libtorch, FLOAT32_BOUND),
        (DecodeModel::new(&loaded64.model, &[]), Decoder::Libtorch, FLOAT64_BOUND),
    ];
    for (decoder, engine, bound) in &cases {
        let mut rows = Continuation::new(*engine, decoder, &[200, 200, 200]).unwrap();
        let mut sequences = prompts.clone();
        let mut drawn: Vec<Vec<(usize, Drawn)>> = vec![Vec::new(); 3];
        let mut record = |sequences: &mut Vec<Vec<u32>>, rows: &[usize], turn: Vec<Drawn>| {
            for (&row, d) in rows.iter().zip(turn) {
                drawn[row].push((sequences[row].len(), d.clone()));
                sequences[row].extend(&d.0);
            }
        };
        let first = rows.continue_rows(decoder, &[0, 1, 2], &prompts, &[7, 5, 9], &sampling(9, 1.0), 11).unwrap();
        record(&mut sequences, &[0, 1, 2], first);
        rows.release(1);
        for (turn, seed) in [(0, 12), (1, 13)] {
            let pending = vec![observations[turn].clone(), observations[1 - turn].clone()];
            sequences[0].extend(&pending[0]);
            sequences[2].extend(&pending[1]);
            let next = rows.continue_rows(decoder, &[0, 2], &pending, &[6, 8], &sampling(8, 1.0), seed).unwrap();
            record(&mut sequences, &[0, 2], next);
        }
        let (mut worst, mut checked) = (0.0f64, 0);
        for (row, turns) in drawn.iter().enumerate() {
            let reference = float64_logprobs(&loaded64.model, &sequences[row]);
            for (start, (tokens, logprobs)) in turns {
                assert!(!tokens.is_empty(), "{engine:?} row {row}: a turn drew nothing");
                for (j, (&token, &logprob)) in tokens.iter().zip(logprobs).enumerate() {
                    let want = reference.double_value(&[(start + j - 1) as i64, i64::from(token)]);
                    let gap = (f64::from(logprob) - want).abs();
                    assert!(gap <= *bound, "{engine:?} row {row} position {}: sampler {logprob}, float64 {want}", start + j);
                    worst = worst.max(gap);
                    checked += 1;
                }
            }
            if row != 1 {
                // The last turn's tokens scored as if the first turn had never been cached.
                let (start, (tokens, _)) = turns.last().unwrap();
                let at = |logprobs: &Tensor, position: usize| logprobs.get(position as i64 - 1);
                let first_turn = turns[0].1.0.len();
                let cut: Vec<u32> = sequences[row][..prompts[row].len()].iter().chain(&sequences[row][prompts[row].len() + first_turn..]).copied().collect();
                let without = float64_logprobs(&loaded64.model, &cut);
                let moved = (0..tokens.len())
                    .map(|j| (at(&without, start - first_turn + j) - at(&reference, start + j)).abs().max().double_value(&[]))
                    .fold(0.0, f64::max);
                assert!(moved > 50.0 * FLOAT32_BOUND, "{engine:?} row {row}: dropping the first turn moves the log-probs by only {moved}");
            }
        }
        assert_eq!(checked, drawn.iter().flatten().map(|(_, d)| d.0.len()).sum::<usize>());
        eprintln!("{engine:?} ({:?}): {checked} tokens, largest gap to float64 {worst:.3e}", decoder.kind);
    }
}

/// Greedy guess_number episodes on tiny-stories (6 episodes, 3 turns of at most 8 tokens, 60
/// tokens each), by the native sampler and the libtorch decoder: each turn's tokens are those a
/// fresh greedy `generate` over the prompt plus the transcript before that turn draws (the
/// re-prefill path), except where the float64 forward of that history says the first differing
/// step was a near-tie (its two best logits within 1e-4): then the difference is named.
#[test]
fn greedy_episodes_draw_what_re_prefilling_each_turn_draws() {
    one_thread();
    let (loaded, loaded64) = (load(Kind::Float), load(Kind::Double));
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let mut env = Plugin::load(&standard_plugin("guess_number"), "{}", PluginLimits::default()).unwrap();
    let env_prompts = env.generate(EnvSplit::Train, 6, 5, 0.0).unwrap();
    let held = held_prompts(&env_prompts);
    let episodes: Vec<EpisodePrompt> = env_prompts.iter().zip(&held).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let params = sampling(8, 0.0);
    let bounds = EpisodeBounds { max_turns: 3, max_observation_bytes: 4096, max_observation_tokens: 16, max_episode_tokens: 60 };
    let (mut turns_checked, mut near_ties) = (0, 0);
    for engine in [Decoder::Native { threads: 2 }, Decoder::Libtorch] {
        let batch = run_episodes(engine, &decoder, &loaded.tokenizer, &mut env, &episodes, Observations::PlainText, &params, 3, &bounds, 0).unwrap();
        let g = &batch.generation;
        let ids = Vec::<Vec<i64>>::try_from(&g.completion_ids).unwrap();
        let mask = Vec::<Vec<i64>>::try_from(&g.completion_mask).unwrap();
        let model = Vec::<Vec<i64>>::try_from(g.model_mask.as_ref().unwrap()).unwrap();
        for (row, episode) in episodes.iter().enumerate() {
            let mut history = episode.ids.clone();
            let mut t = 0;
            while t < ids[row].len() && mask[row][t] == 1 {
                if model[row][t] == 0 {
                    history.push(ids[row][t] as u32);
                    t += 1;
                    continue;
                }
                let turn: Vec<u32> = (t..ids[row].len()).take_while(|&k| mask[row][k] == 1 && model[row][k] == 1).map(|k| ids[row][k] as u32).collect();
                let again = generate_with(engine, &decoder, std::slice::from_ref(&history), &sampling(turn.len(), 0.0), 0).unwrap();
                let redrawn = masked_rows(&again.completion_ids, &again.completion_mask).unwrap().remove(0);
                if let Some(j) = (0..turn.len()).find(|&j| redrawn.get(j) != Some(&turn[j])) {
                    let prefix: Vec<u32> = history.iter().chain(&turn[..j]).copied().collect();
                    let logits = loaded64.model.logits(&loaded64.model.forward(&Tensor::from_slice(&prefix.iter().map(|&x| i64::from(x)).collect::<Vec<_>>()).unsqueeze(0), &Tensor::ones([1, prefix.len() as i64], (Kind::Int64, Device::Cpu)), &[]));
                    let (top, _) = logits.get(0).get(prefix.len() as i64 - 1).to_kind(Kind::Double).topk(2, -1, true, true);
                    let gap = top.double_value(&[0]) - top.double_value(&[1]);
                    assert!(gap < 1e-4, "{engine:?} episode {row}: the cached turn drew {turn:?}, re-prefilling drew {redrawn:?}, and float64's two best logits at step {j} are {gap} apart");
                    near_ties += 1;
                }
                history.extend(&turn);
                t += turn.len();
                turns_checked += 1;
            }
        }
    }
    eprintln!("{turns_checked} turns checked, {near_ties} near-ties");
    assert!(turns_checked > 2 * 6 * 2, "some episodes went past their first turn ({turns_checked} turns)");
}

/// Not a check: times `SMALLRL_EPISODE_BENCH` (`cached`: `run_episodes`; `reprefill`: the loop
/// before the cache continued, a fresh `generate` over prompt plus transcript each turn) on
/// guess_number episodes (8 turns of at most 16 tokens, 256 tokens each, temperature 1, one
/// thread): 32 on tiny-stories, or `SMALLRL_EPISODE_BENCH_MODEL` (a model directory) with
/// `SMALLRL_EPISODE_BENCH_ROWS` episodes. Run under `/usr/bin/time -v` with `--ignored --nocapture`.
#[test]
#[ignore]
fn bench_guess_number_episodes() {
    use smallrl::episode::render_observation;
    use smallrl::plugins::{Batch, TurnResult};
    one_thread();
    let path = std::env::var("SMALLRL_EPISODE_BENCH").expect("SMALLRL_EPISODE_BENCH=cached or reprefill");
    let loaded = match std::env::var("SMALLRL_EPISODE_BENCH_MODEL") {
        Ok(dir) => smallrl::model::load(&dir, "main", Device::Cpu, Kind::Float).unwrap(),
        Err(_) => load(Kind::Float),
    };
    let rows = std::env::var("SMALLRL_EPISODE_BENCH_ROWS").map_or(32, |r| r.parse().unwrap());
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let mut env = Plugin::load(&standard_plugin("guess_number"), "{}", PluginLimits::default()).unwrap();
    let env_prompts = env.generate(EnvSplit::Train, rows, 5, 0.0).unwrap();
    let held = held_prompts(&env_prompts);
    let episodes: Vec<EpisodePrompt> = env_prompts.iter().zip(&held).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let params = sampling(16, 1.0);
    let bounds = EpisodeBounds { max_turns: 8, max_observation_bytes: 4096, max_observation_tokens: 16, max_episode_tokens: 256 };
    let started = std::time::Instant::now();
    let tokens: usize = if path == "cached" {
        let batch = run_episodes(Decoder::Native { threads: 1 }, &decoder, &loaded.tokenizer, &mut env, &episodes, Observations::PlainText, &params, 9, &bounds, 0).unwrap();
        batch.generation.completion_mask.sum(Kind::Int64).int64_value(&[]) as usize
    } else {
        let ids: Vec<(u64, &EnvPrompt)> = env_prompts.iter().enumerate().map(|(i, p)| (i as u64, p)).collect();
        env.start_episodes(&ids).unwrap();
        let mut transcripts: Vec<Vec<u32>> = vec![Vec::new(); episodes.len()];
        let mut ended = vec![false; episodes.len()];
        for turn in 0..bounds.max_turns {
            let active: Vec<usize> = (0..episodes.len()).filter(|&i| !ended[i]).collect();
            if active.is_empty() {
                break;
            }
            let budget = |row: usize, t: &[Vec<u32>]| bounds.max_episode_tokens - t[row].len();
            let histories: Vec<Vec<u32>> = active.iter().map(|&r| episodes[r].ids.iter().chain(&transcripts[r]).copied().collect()).collect();
            let most = active.iter().map(|&r| budget(r, &transcripts)).max().unwrap();
            let g = generate_with(Decoder::Native { threads: 1 }, &decoder, &histories, &sampling(16.min(most), 1.0), smallrl::rng::derive(9, "episode-turn", turn as u64)).unwrap();
            let drawn = masked_rows(&g.completion_ids, &g.completion_mask).unwrap();
            let (mut samples, mut requests) = (Vec::new(), Vec::new());
            for (&row, tokens) in active.iter().zip(drawn) {
                let tokens: Vec<u32> = tokens.into_iter().take(budget(row, &transcripts)).collect();
                let stop = tokens.last().is_some_and(|t| decoder.config().stop_ids().contains(t));
                let text = tokens[..tokens.len() - usize::from(stop)].to_vec();
                transcripts[row].extend(&tokens);
                let last = turn + 1 == bounds.max_turns || transcripts[row].len() + bounds.max_observation_tokens + 1 > bounds.max_episode_tokens;
                samples.push(smallrl::reward::sample_from_ids(&held[row], text, stop, &loaded.tokenizer).unwrap());
                requests.push((row as u64, last));
            }
            for (&row, result) in active.iter().zip(env.step_episodes(&requests, &Batch::new(&samples), &bounds).unwrap()) {
                match result {
                    TurnResult::End(_) => ended[row] = true,
                    TurnResult::Observation(messages) => transcripts[row].extend(loaded.tokenizer.encode(&render_observation(&messages)).unwrap()),
                }
            }
        }
        transcripts.iter().map(Vec::len).sum()
    };
    eprintln!("{path}: {tokens} transcript tokens, sampling {:.2} s wall", started.elapsed().as_secs_f64());
}
