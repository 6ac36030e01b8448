//! Multi-turn episodes (issue 48): the guess_number environment through the host, hostile
//! episode environments bounded and named with their file, episodes sampled on the tiny-stories
//! fixture (their layout and ends held to a hand replay of the game), and the loss of an episode
//! batch, which counts the model's tokens only, held to a float64 reference.
//! Needs `make plugins` (plugins/guess_number.wasm, target/test-plugins/hostile_episode.wasm).

mod common;

use std::sync::Arc;

use common::{fixture, one_thread, standard_plugin, test_plugin};
use smallrl::episode::{EpisodePrompt, Observations, render_observation, run_episodes};
use smallrl::model::batch::Generation;
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{SamplingParams, default_decoder};
use smallrl::plugins::{Batch, EnvPrompt, EnvSplit, EpisodeBounds, Plugin, PluginLimits, PromptMetadata, Sample, TurnResult};
use smallrl::reward::Prompt;
use tch::{Device, Kind, Tensor};

fn metadata(prompt: &EnvPrompt) -> Arc<PromptMetadata> {
    Arc::new(PromptMetadata { json: serde_json::Value::Object(prompt.metadata.clone()).to_string(), hackable: Some(false), detectable: Some(false) })
}

fn text_of(prompt: &EnvPrompt) -> String {
    match &prompt.content {
        smallrl::plugins::EnvPromptContent::Text(text) => text.clone(),
        other => panic!("guess_number writes text prompts, got {other:?}"),
    }
}

fn turn(prompt: &EnvPrompt, completion: &str) -> Sample {
    Sample {
        prompt: text_of(prompt),
        completion: completion.into(),
        completion_tokens: vec![completion.into()],
        completion_ids: vec![0],
        ended_with_eos: true,
        metadata: Some(metadata(prompt)),
    }
}

fn secret(prompt: &EnvPrompt) -> i64 {
    prompt.metadata["secret"].as_i64().expect("an integer secret")
}

/// Halving 1..=16 through the wasm host finds every secret in at most 5 turns (ceil(log2 16) + 1),
/// each answer "higher" or "lower" as the secret says; the end is solved 1, closeness 1, the turns
/// counted. The single-turn calls are refused for an episode environment.
#[test]
fn guess_number_plays_through_the_host() {
    let path = standard_plugin("guess_number");
    let mut env = Plugin::load(&path, "{}", PluginLimits::default()).unwrap();
    assert!(env.is_episodic());
    let prompts = env.generate(EnvSplit::Train, 6, 5, 0.0).unwrap();
    let starts: Vec<(u64, &EnvPrompt)> = prompts.iter().enumerate().map(|(i, p)| (i as u64, p)).collect();
    env.start_episodes(&starts).unwrap();
    let bounds = EpisodeBounds { max_turns: 5, ..EpisodeBounds::default() };
    for (id, prompt) in prompts.iter().enumerate() {
        let (mut low, mut high, mut turns) = (1i64, 16i64, 0);
        loop {
            let guess = (low + high) / 2;
            turns += 1;
            let last = turns == bounds.max_turns;
            let answer = env.step_episodes(&[(id as u64, last)], &Batch::new(&[turn(prompt, &format!("my guess is {guess}"))]), &bounds).unwrap();
            match &answer[0] {
                TurnResult::Observation(messages) => {
                    let want = if guess < secret(prompt) { "higher" } else { "lower" };
                    assert_eq!(messages, &[("user".to_string(), want.to_string())]);
                    if guess < secret(prompt) { low = guess + 1 } else { high = guess - 1 }
                }
                TurnResult::End(end) => {
                    assert_eq!((end.components.as_slice(), end.metrics.as_slice()), ([1.0, 1.0].as_slice(), [turns as f64, 0.0].as_slice()));
                    assert_eq!(guess, secret(prompt));
                    break;
                }
            }
        }
    }
    let error = format!("{:#}", env.score_environment(&Batch::new(&[turn(&prompts[0], "3")])).unwrap_err());
    assert!(error.contains(&path.display().to_string()) && error.contains("has no environment `score`"), "{error}");
}

/// `plugin score`'s loading (single completions) refuses an episode environment by name, at
/// load, before any scoring (its `score` would only fail at the first batch); `smallrl train`
/// and `smallrl eval` load it to play its episodes.
#[test]
fn runs_refuse_an_episode_environment_by_name() {
    let knobs = smallrl::reward::ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };
    let path = standard_plugin("guess_number");
    let error = smallrl::reward::RewardModel::load_environment(path.to_str().unwrap(), None, knobs, &common::plugin_dir(), PluginLimits::default()).err().expect("refused");
    let error = format!("{error:#}");
    assert!(error.contains(&path.display().to_string()) && error.contains("is a multi-turn episode environment") && error.contains("scores single completions, not episodes"), "{error}");
}

/// Each hostile episode environment is stopped with a message naming its file and the rule:
/// one that never ends (an observation on its last turn), a 10 MB observation, an observation in
/// the assistant's role, and state that grows 8 MiB a turn (the plugin memory limit).
#[test]
fn hostile_episodes_are_bounded_and_named() {
    let path = test_plugin("hostile_episode");
    let bounds = EpisodeBounds { max_turns: 20, ..EpisodeBounds::default() };
    let failure = |mode: &str, turns: usize| -> String {
        // Fuel enough to fill 8 MiB a turn: the memory limit (64 MiB) is what stops `grows`.
        let limits = PluginLimits::new(10.0, 64, 1_000_000_000).unwrap();
        let mut env = Plugin::load(&path, &serde_json::json!({ "mode": mode }).to_string(), limits).unwrap();
        let prompts = env.generate(EnvSplit::Train, 1, 1, 0.0).unwrap();
        env.start_episodes(&[(0, &prompts[0])]).unwrap();
        for t in 0..turns {
            let last = t + 1 == turns;
            if let Err(error) = env.step_episodes(&[(0, last)], &Batch::new(&[turn(&prompts[0], "1")]), &bounds) {
                let error = format!("{error:#}");
                assert!(error.contains(&path.display().to_string()), "{mode}: the message names the file: {error}");
                return error;
            }
        }
        panic!("{mode}: {turns} turns without an error")
    };
    assert!(failure("never_ends", 3).contains("episode 0: answered its last turn"), "never_ends");
    let huge = failure("huge_observation", 2);
    assert!(huge.contains("an observation of 10485764 bytes, over episode_max_observation_bytes (4096)"), "{huge}");
    assert!(failure("wrong_role", 2).contains("role \"assistant\": it must be \"tool\" or \"user\""));
    let grows = failure("grows", 20);
    assert!(grows.contains("step failed") && grows.contains("memory"), "{grows}");
    let mut ok = Plugin::load(&path, r#"{"mode": "ok"}"#, PluginLimits::default()).unwrap();
    let prompts = ok.generate(EnvSplit::Train, 1, 1, 0.0).unwrap();
    ok.start_episodes(&[(3, &prompts[0])]).unwrap();
    assert!(matches!(&ok.step_episodes(&[(3, true)], &Batch::new(&[turn(&prompts[0], "1")]), &bounds).unwrap()[0], TurnResult::End(_)));
}

struct Sampled {
    prompts: Vec<EnvPrompt>,
    batch: smallrl::episode::EpisodeBatch,
    tokenizer: smallrl::model::tokenizer::Tokenizer,
}

/// Six guess_number episodes (1..=16, at most 3 turns, 40 tokens, observations of at most 16)
/// sampled on tiny-stories.
fn sample_episodes(seed: u64) -> Sampled {
    one_thread();
    let loaded = smallrl::model::load(fixture("tiny-stories").to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let mut env = Plugin::load(&standard_plugin("guess_number"), "{}", PluginLimits::default()).unwrap();
    let prompts = env.generate(EnvSplit::Train, 6, 11, 0.0).unwrap();
    let held: Vec<Prompt> = prompts.iter().map(|p| Prompt { text: text_of(p), metadata: Some(metadata(p)) }).collect();
    let episodes: Vec<EpisodePrompt> =
        prompts.iter().zip(&held).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let params = SamplingParams { max_new_tokens: 8, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let bounds = EpisodeBounds { max_turns: 3, max_observation_bytes: 4096, max_observation_tokens: 16, max_episode_tokens: 40 };
    let batch = run_episodes(default_decoder(&decoder), &decoder, &loaded.tokenizer, &mut env, &episodes, Observations::PlainText, &params, seed, &bounds, 0).unwrap();
    Sampled { prompts, batch, tokenizer: loaded.tokenizer }
}

/// The first integer of `text` as the environment reads it: a run of digits, negative after a
/// `-`, saturating.
fn first_integer(text: &str) -> Option<i64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits: String = text[start..].chars().take_while(char::is_ascii_digit).collect();
    let value = digits.bytes().fold(0i64, |v, d| v.saturating_mul(10).saturating_add(i64::from(d - b'0')));
    Some(if text[..start].ends_with('-') { -value } else { value })
}

/// The maximal runs of equal `mask` values of a row: (is model, ids, log-probs).
fn runs(ids: &[i64], mask: &[i64], model: &[i64], logprobs: &[f32]) -> Vec<(bool, Vec<u32>, Vec<f32>)> {
    let mut out: Vec<(bool, Vec<u32>, Vec<f32>)> = Vec::new();
    for t in (0..ids.len()).filter(|&t| mask[t] == 1) {
        let is_model = model[t] == 1;
        match out.last_mut() {
            Some((m, run, lp)) if *m == is_model => {
                run.push(ids[t] as u32);
                lp.push(logprobs[t]);
            }
            _ => out.push((is_model, vec![ids[t] as u32], vec![logprobs[t]])),
        }
    }
    out
}

/// Sampled episodes replayed by hand: the transcript alternates model turns and observations;
/// each observation is the rendering of "higher", "lower" or the malformed-turn message that
/// the model's guess (its turn's first integer) and the secret call for; the end's solved,
/// closeness, turns and malformed are the game's rules on the model's turns; observation tokens
/// carry no sampling log-prob and no loss; the same seed samples the same episodes.
#[test]
fn sampled_episodes_follow_the_game_and_mask_observations() {
    let Sampled { prompts, batch, tokenizer } = sample_episodes(7);
    let g = &batch.generation;
    let ids = Vec::<Vec<i64>>::try_from(&g.completion_ids).unwrap();
    let mask = Vec::<Vec<i64>>::try_from(&g.completion_mask).unwrap();
    let model = Vec::<Vec<i64>>::try_from(g.model_mask.as_ref().unwrap()).unwrap();
    let logprobs = Vec::<Vec<f32>>::try_from(&g.sampling_logprobs).unwrap();
    let rendered = |text: &str| tokenizer.encode(&render_observation(&[("user".into(), text.into())])).unwrap();
    let eos = 1u32; // tiny-stories' [EOS] id (config.json)
    let mut observed = 0;
    for (row, prompt) in prompts.iter().enumerate() {
        let runs = runs(&ids[row], &mask[row], &model[row], &logprobs[row]);
        let model_turns: Vec<&Vec<u32>> = runs.iter().filter(|r| r.0).map(|r| &r.1).collect();
        assert_eq!(model_turns.len(), batch.turns[row], "row {row}: one model run per turn");
        assert!(runs.iter().step_by(2).all(|r| r.0) && runs.iter().skip(1).step_by(2).all(|r| !r.0), "row {row}: turns and observations alternate");
        let (mut solved, mut last_guess, mut malformed) = (false, None, 0);
        for (k, run) in runs.iter().enumerate() {
            let (is_model, tokens, lps) = run;
            if !is_model {
                assert!(lps.iter().all(|&lp| lp == 0.0), "row {row}: observation tokens have no sampling log-prob");
                observed += tokens.len();
                continue;
            }
            assert!(lps.iter().all(|&lp| lp <= 0.0 && lp.is_finite()));
            let text_ids: Vec<u32> = tokens.iter().copied().filter(|&t| t != eos).collect();
            let text = tokenizer.decode(&text_ids).unwrap();
            let guess = first_integer(&text);
            let want = match guess {
                None => {
                    malformed += 1;
                    "Answer with one number from 1 to 16.".to_string()
                }
                Some(g) => {
                    last_guess = Some(g);
                    solved |= g == secret(prompt);
                    (if g < secret(prompt) { "higher" } else { "lower" }).to_string()
                }
            };
            if let Some((false, observation, _)) = runs.get(k + 1) {
                assert_eq!(observation, &rendered(&want), "row {row}: the observation after turn {k}");
            }
        }
        let closeness = last_guess.map_or(0.0, |g| (1.0 - (g - secret(prompt)).unsigned_abs() as f64 / 15.0).clamp(0.0, 1.0));
        let end = &batch.ends[row];
        assert_eq!(end.components, vec![f64::from(u8::from(solved)), closeness], "row {row}");
        assert_eq!(end.metrics, vec![batch.turns[row] as f64, malformed as f64], "row {row}");
        assert!(batch.turns[row] <= 3 && mask[row].iter().sum::<i64>() <= 40);
    }
    assert_eq!(observed, batch.observation_tokens.iter().sum::<usize>());
    assert!(observed > 0, "some episode went past its first turn (seed 7)");
    let loss = smallrl::grpo::loss_mask(g, false);
    assert!(loss.equal(&(&g.completion_mask * g.model_mask.as_ref().unwrap())), "the loss mask is the model's tokens");
    let again = sample_episodes(7).batch.generation;
    assert!(again.completion_ids.equal(&g.completion_ids) && again.model_mask.unwrap().equal(g.model_mask.as_ref().unwrap()));
}

/// The loss and KL of an episode batch equal those of a hand-built batch whose observation
/// tokens are masked out of the completion mask (and no model mask), and both equal the float64
/// formula written out here: TRL's default grpo loss with the k3 KL at beta 0.02 and no old
/// log-probs (ratio 1), `mean_rows(Σ_t m (-A + beta kl) / Σ_t m)` over model tokens `m` only.
#[test]
fn the_loss_of_episodes_counts_model_tokens_only() {
    let g = sample_episodes(7).batch.generation;
    let hand = Generation {
        prompt_ids: g.prompt_ids.shallow_clone(),
        prompt_mask: g.prompt_mask.shallow_clone(),
        completion_ids: g.completion_ids.shallow_clone(),
        completion_mask: &g.completion_mask * g.model_mask.as_ref().unwrap(),
        sampling_logprobs: g.sampling_logprobs.shallow_clone(),
        kept: None,
        model_mask: None,
        rows: g.rows.iter().map(|r| smallrl::model::batch::CompletionRow { ids: r.ids.clone(), ended_with_eos: r.ended_with_eos }).collect(),
    };
    let (rows, width) = g.completion_ids.size2().unwrap();
    tch::manual_seed(3);
    let current = -Tensor::rand([rows, width], (Kind::Double, Device::Cpu)) * 4.0;
    let reference = -Tensor::rand([rows, width], (Kind::Double, Device::Cpu)) * 4.0;
    let advantages = Tensor::randn([rows], (Kind::Double, Device::Cpu));
    let objective = smallrl::train::TrainConfig::default().objective().unwrap();
    let loss_of = |generation: &Generation| {
        let mask = smallrl::grpo::loss_mask(generation, false);
        let terms = smallrl::grpo::grpo_loss(&current, None, Some(&reference), &advantages, (&mask).into(), &[Tensor::ones([rows], (Kind::Float, Device::Cpu))], &objective);
        (terms.loss.double_value(&[]), terms.per_token_kl.unwrap() * mask.to_kind(Kind::Double))
    };
    let (episode_loss, episode_kl) = loss_of(&g);
    let (hand_loss, hand_kl) = loss_of(&hand);
    assert_eq!(episode_loss, hand_loss);
    assert!(episode_kl.equal(&hand_kl));
    // The float64 formula, token by token.
    let (cur, refl) = (Vec::<Vec<f64>>::try_from(&current).unwrap(), Vec::<Vec<f64>>::try_from(&reference).unwrap());
    let adv = Vec::<f64>::try_from(&advantages).unwrap();
    let m = Vec::<Vec<i64>>::try_from(&hand.completion_mask).unwrap();
    let beta = 0.02;
    let mut total = 0.0;
    for r in 0..rows as usize {
        let (mut sum, mut count) = (0.0, 0.0);
        for t in (0..width as usize).filter(|&t| m[r][t] == 1) {
            let d = refl[r][t] - cur[r][t];
            sum += -adv[r] + beta * (d.exp() - d - 1.0);
            count += 1.0;
        }
        total += sum / count;
    }
    let want = total / rows as f64;
    assert!((episode_loss - want).abs() <= 1e-6 * want.abs().max(1.0), "episode loss {episode_loss} vs float64 {want}");
}

/// plugins/testing/legacy_v0_5, built against the frozen wit/0.5.0 (episodes without tools):
/// it loads, declares no tools, and plays as its documentation says ("No. Say apple." until a
/// turn says apple: `said` 1 and the turns; the last turn ends it with `said` 0); a turn with
/// parsed calls is refused, since a 0.5 episode declared no tools.
#[test]
fn an_episode_environment_built_against_contract_0_5_plays_as_before() {
    let mut env = Plugin::load(&test_plugin("legacy_v0_5"), "{}", PluginLimits::default()).unwrap();
    assert_eq!(env.contract_version(), "0.5.0");
    assert!(env.is_episodic());
    let prompts = env.generate(EnvSplit::Train, 2, 1, 0.0).unwrap();
    assert_eq!(text_of(&prompts[0]), "Say the word: apple.");
    assert_eq!(env.start_episodes(&[(0, &prompts[0]), (1, &prompts[1])]).unwrap(), vec![Vec::new(), Vec::new()]);
    let bounds = EpisodeBounds::default();
    let end = |said: f64, turns: f64| TurnResult::End(smallrl::plugins::EpisodeEnd { components: vec![said], metrics: vec![turns], monitor: false, ground_truth: false });
    let first = env.step_episodes(&[(0, false), (1, false)], &Batch::new(&[turn(&prompts[0], "a pear"), turn(&prompts[1], "an apple")]), &bounds).unwrap();
    assert_eq!(first, vec![TurnResult::Observation(vec![("user".into(), "No. Say apple.".into())]), end(1.0, 1.0)]);
    assert_eq!(env.step_episodes(&[(0, true)], &Batch::new(&[turn(&prompts[0], "pear")]), &bounds).unwrap(), vec![end(0.0, 2.0)]);
    env.start_episodes(&[(2, &prompts[0])]).unwrap();
    let error = format!("{:#}", env.step_episodes_with_calls(&[(2, false, Some(Vec::new()))], &Batch::new(&[turn(&prompts[0], "x")]), &bounds).unwrap_err());
    assert!(error.contains("a 0.5 episode environment declares no tools"), "{error}");
}
