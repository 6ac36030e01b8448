//! Episodes in the model's chat template (issue 48): with chat prompts, each observation is the
//! text the template writes after the assistant turn, so an episode's whole sequence (prompt and
//! transcript) is transformers' `apply_chat_template` of its conversation, tokenized, and the
//! model mask is 1 exactly on the assistant messages' tokens (a sampled stop token included; the
//! end-of-turn token the template writes after a turn cut by its limit excluded).
//!
//! The model is a tiny random Llama with SmolLM2's tokenizer and template
//! (`scripts/reference/chat_episode.py model`), whose head writes only a few words and
//! `<|im_end|>`: its turns are the tokenization of their text, so the sequence can be compared
//! with a tokenization of the rendered conversation (`chat_episode.py render`).
//! Needs `make plugins` (plugins/guess_number.wasm).

mod common;

use common::{one_thread, plugin_dir, python, read_jsonl, repo_root, standard_plugin, train};
use smallrl::episode::{EpisodePrompt, Observations, run_episodes};
use smallrl::model::chat::{ChatTemplate, Message};
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Decoder, SamplingParams};
use smallrl::plugins::{EnvPromptContent, EnvSplit, EpisodeBounds, Plugin, PluginLimits};
use smallrl::reward::Prompt;
use smallrl::train::prompts::{PromptRender, conversation_of};
use tch::{Device, Kind};

/// guess_number's answer to a turn without an integer (the tiny model writes none), at its
/// default `max_number` 16 (the environments chapter, "Its plain-text protocol").
const NO_NUMBER: &str = "Answer with one number from 1 to 16.";
const IM_END: u32 = 2;

fn script() -> std::path::PathBuf {
    repo_root().join("scripts/reference/chat_episode.py")
}

/// The tiny chat model (`chat_episode.py model`) in `dir`/model.
fn tiny_chat_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model_dir = dir.join("model");
    let status = std::process::Command::new(python()).arg(script()).arg("model").arg(&model_dir).status().unwrap();
    assert!(status.success(), "chat_episode.py model failed");
    model_dir
}

/// transformers' ids and assistant masks of `conversations` (`chat_episode.py render`).
fn transformers_sequences(conversations: &[(Vec<Message>, Vec<bool>)], dir: &std::path::Path) -> (Vec<Vec<u32>>, Vec<Vec<i64>>) {
    let episodes: Vec<serde_json::Value> = conversations
        .iter()
        .map(|(messages, ended)| {
            let messages: Vec<serde_json::Value> = messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
            serde_json::json!({"messages": messages, "ended": ended})
        })
        .collect();
    let (input, output) = (dir.join("episodes.json"), dir.join("rendered.json"));
    std::fs::write(&input, serde_json::json!({ "episodes": episodes }).to_string()).unwrap();
    let status = std::process::Command::new(python()).arg(script()).arg("render").arg(&input).arg(&output).status().unwrap();
    assert!(status.success(), "chat_episode.py render failed");
    let rendered: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    (serde_json::from_value(rendered["ids"].clone()).unwrap(), serde_json::from_value(rendered["mask"].clone()).unwrap())
}

/// Six guess_number episodes (3 turns of at most 4 tokens) on the tiny chat model, by both
/// decoders: each row's prompt and transcript equal transformers' tokenization of the
/// conversation (the prompt's messages, each turn's text, the environment's `user` answers), the
/// model mask its assistant mask; turns ended by `<|im_end|>` and turns cut by their limit are
/// both followed by observations. A prompt that is not its conversation's rendering is refused.
#[test]
fn chat_episodes_are_the_templates_rendering_of_their_conversation() {
    one_thread();
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tiny_chat_model(dir.path());
    let loaded = smallrl::model::load(model_dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let template = ChatTemplate::for_model(&loaded.files).unwrap();
    let render = PromptRender::Chat { template: template.clone(), system: None };
    let mut env = Plugin::load(&standard_plugin("guess_number"), "{}", PluginLimits::default()).unwrap();
    let env_prompts = env.generate(EnvSplit::Train, 6, 11, 0.0).unwrap();
    let held: Vec<Prompt> = env_prompts
        .iter()
        .map(|p| match &p.content {
            EnvPromptContent::Text(text) => render.text_prompt(text, p.metadata.clone()).unwrap(),
            other => panic!("guess_number writes text prompts, got {other:?}"),
        })
        .collect();
    let conversations: Vec<Vec<Message>> = held.iter().map(|p| conversation_of(p).unwrap()).collect();
    let episodes: Vec<EpisodePrompt> = env_prompts.iter().zip(&held).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let params = SamplingParams { max_new_tokens: 4, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let bounds = EpisodeBounds { max_turns: 3, max_observation_bytes: 4096, max_observation_tokens: 32, max_episode_tokens: 120 };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let (mut after_stop, mut after_cut) = (0, 0);
    for engine in [Decoder::Native { threads: 1 }, Decoder::Libtorch] {
        let observations = Observations::Chat { template: &template, conversations: conversations.clone() };
        let batch = run_episodes(engine, &decoder, &loaded.tokenizer, &mut env, &episodes, observations, &params, 5, &bounds, 0).unwrap();
        let g = &batch.generation;
        let ids = Vec::<Vec<i64>>::try_from(&g.completion_ids).unwrap();
        let mask = Vec::<Vec<i64>>::try_from(&g.completion_mask).unwrap();
        let model = Vec::<Vec<i64>>::try_from(g.model_mask.as_ref().unwrap()).unwrap();
        let mut ours = Vec::new();
        let mut replayed = Vec::new();
        for (row, episode) in episodes.iter().enumerate() {
            assert_eq!(batch.turns[row], 3, "{engine:?} row {row}: no turn has a number, so every episode runs to the turn bound");
            let length = mask[row].iter().filter(|&&m| m == 1).count();
            let transcript: Vec<u32> = ids[row][..length].iter().map(|&id| id as u32).collect();
            let model_mask = &model[row][..length];
            // The conversation replayed by hand: each model run of the transcript is a turn (its
            // text decoded, whether it ended with <|im_end|>), each turn but the last answered.
            let mut messages = conversations[row].clone();
            let mut ended = Vec::new();
            let mut t = 0;
            while t < length {
                let run = model_mask[t..].iter().take_while(|&&m| m == model_mask[t]).count();
                if model_mask[t] == 1 {
                    let turn = &transcript[t..t + run];
                    let stopped = turn.last() == Some(&IM_END);
                    let text = loaded.tokenizer.decode(&turn[..turn.len() - usize::from(stopped)]).unwrap();
                    if messages.last().is_some_and(|m| m.role == "assistant") {
                        messages.push(Message::new("user", NO_NUMBER));
                    }
                    messages.push(Message::new("assistant", &text));
                    ended.push(stopped);
                } else if *ended.last().unwrap() {
                    after_stop += 1;
                } else {
                    assert_eq!(transcript[t], IM_END, "{engine:?} row {row}: an observation after a cut turn opens with the template's <|im_end|>");
                    after_cut += 1;
                }
                t += run;
            }
            assert_eq!(ended.len(), 3, "{engine:?} row {row}: three model runs");
            assert_eq!(batch.observation_tokens[row], model_mask.iter().filter(|&&m| m == 0).count());
            ours.push((episode.ids.iter().chain(&transcript).copied().collect::<Vec<u32>>(), std::iter::repeat_n(0, episode.ids.len()).chain(model_mask.iter().copied()).collect::<Vec<i64>>()));
            replayed.push((messages, ended));
        }
        let (expected_ids, expected_mask) = transformers_sequences(&replayed, dir.path());
        for (row, ((ids, mask), (want_ids, want_mask))) in ours.iter().zip(expected_ids.iter().zip(&expected_mask)).enumerate() {
            // Exact: token ids and masks are integers (the sampled text's tokenization against
            // transformers' of the same conversation), no float32 value is compared.
            assert_eq!(ids, want_ids, "{engine:?} row {row}: the sequence is not transformers' tokenization of the conversation {:?}", replayed[row].0);
            assert_eq!(mask, want_mask, "{engine:?} row {row}: the model mask is not the assistant mask");
        }
    }
    eprintln!("observations after a stopped turn: {after_stop}, after a cut turn: {after_cut}");
    assert!(after_stop > 0 && after_cut > 0, "the seed must give observations after stopped ({after_stop}) and cut ({after_cut}) turns");
    // A prompt that is not its conversation as the template renders it is refused.
    let mut wrong = conversations.clone();
    wrong[1][0].content.push('!');
    let error = format!("{:#}", run_episodes(Decoder::Libtorch, &decoder, &loaded.tokenizer, &mut env, &episodes, Observations::Chat { template: &template, conversations: wrong }, &params, 5, &bounds, 0).err().unwrap());
    assert!(error.contains("episode prompt 1 is not its conversation as the chat template renders it"), "{error}");
}

/// A training run with chat prompts writes its episodes' observations through the template: one
/// step of guess_number on the tiny chat model, whose turns never hold a number, so every episode
/// has three turns and two observations of the malformed-turn answer, each the template's user
/// turn and generation prompt (plus the `<|im_end|>` closing a cut turn): between 2 and 2 + 2
/// tokens more than twice that turn's tokens per episode, where the plain text would be far
/// fewer.
#[test]
fn a_chat_run_writes_its_episodes_observations_through_the_template() {
    let out = tempfile::tempdir().unwrap();
    let model_dir = tiny_chat_model(out.path());
    let config = serde_json::json!({
        "model": model_dir, "prompt_format": "chat",
        "environment": "guess_number", "plugin_dir": plugin_dir(),
        "adapter": "lora", "lora_rank": 4, "lora_alpha": 4.0, "lr": 1e-3,
        "batch_size": 8, "num_generations": 4, "max_completion_length": 120,
        "episode_max_turns": 3, "episode_max_turn_tokens": 4, "episode_max_observation_tokens": 32,
        "max_steps": 1, "save_steps": 100, "eval_every": 100, "eval_samples": 4, "logging_steps": 1,
        "output_dir": out.path().join("runs"), "threads": 1, "device": "cpu", "name": "chat",
    });
    let serde_json::Value::Object(config) = config else { unreachable!() };
    let run = train(config, None, None);
    let line = &read_jsonl(run.join("metrics.jsonl"))[0];
    let tokenizer = smallrl::model::Tokenizer::from_file(&model_dir.join("tokenizer.json")).unwrap();
    let chat = tokenizer.encode(&format!("\n<|im_start|>user\n{NO_NUMBER}<|im_end|>\n<|im_start|>assistant\n")).unwrap().len() as f64;
    let plain = tokenizer.encode(&format!("\n{NO_NUMBER}\n")).unwrap().len() as f64;
    let observed = line["episodes/observation_tokens"].as_f64().unwrap();
    assert_eq!(line["episodes/turns"].as_f64(), Some(3.0), "{line}");
    assert!((2.0 * chat..=2.0 * chat + 2.0).contains(&observed), "observation tokens per episode {observed}: the template's turn is {chat} tokens (the plain text {plain})");
}
