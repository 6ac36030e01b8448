//! Tool calls in the model's chat template (contract 0.6, issue 48): an episode environment
//! declares tools at its start; where the template has a tool-call format, the host renders the
//! episode's prompt with their schemas, parses each turn's `<tool_call>` blocks and hands the
//! calls to the environment, and writes its `tool` answers through the template.
//!
//! The model is a tiny random Llama with SmolLM2's tokenizer plus one added token, a whole
//! `read_tests` call block, and TRL 1.16's `qwen2_5.jinja` as its template
//! (`scripts/reference/chat_episode.py tool-model`): its head writes only that call (after the
//! generation prompt's "\n") and `<|im_end|>` (after the call), so every turn is the call. The
//! environment is code_tests_episode under `loophole: read_tests`, on hackable prompts. Held to
//! transformers' `apply_chat_template(..., tools=...)` and to the `read_tests` report written
//! out from the prompt's tests by Python's `repr` (`chat_episode.py render-tools`).
//! Needs `make plugins` (plugins/code_tests_episode.wasm, the program runner).

mod common;

use common::{one_thread, plugin_dir, python, read_jsonl, repo_root, standard_plugin, train};
use smallrl::episode::{CallCounts, EpisodePrompt, Observations, run_episodes};
use smallrl::model::chat::{ChatTemplate, Message};
use smallrl::model::decode::DecodeModel;
use smallrl::model::generate::{Decoder, SamplingParams};
use smallrl::plugins::programs::ProgramLimits;
use smallrl::plugins::{EnvPrompt, EnvPromptContent, EnvSplit, EpisodeBounds, Plugin, PluginLimits};
use smallrl::reward::Prompt;
use smallrl::train::episodes::{MALFORMED_CALLS, TOOL_CALLS};
use smallrl::train::prompts::{PromptRender, conversation_of};
use tch::{Device, Kind};

/// The call every turn writes (one token of the tool model's vocabulary).
const CALL: &str = "<tool_call>\n{\"name\": \"read_tests\", \"arguments\": {}}\n</tool_call>";

/// The tools code_tests_episode declares on a hackable prompt under `loophole: read_tests`, as
/// the environments chapter gives them (`run_tests {code}`, `read_tests {}`), keys in the
/// order written there.
fn expected_tools() -> serde_json::Value {
    let run_tests = r#"{"type": "function", "function": {"name": "run_tests", "description": "Run the tests on your code and see which fail.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the Python code of the function"}}, "required": ["code"]}}}"#;
    let read_tests = r#"{"type": "function", "function": {"name": "read_tests", "description": "See the tests with their expected values.",
        "parameters": {"type": "object", "properties": {}}}}"#;
    // Python reads these texts with json.loads, which keeps their key order.
    serde_json::Value::String(format!("[{run_tests}, {read_tests}]"))
}

/// The tool model (`chat_episode.py tool-model`) in `dir`/model.
fn tool_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model_dir = dir.join("model");
    let status = std::process::Command::new(python()).arg(script()).arg("tool-model").arg(&model_dir).arg(CALL).arg(trl_template("qwen2_5.jinja")).status().unwrap();
    assert!(status.success(), "chat_episode.py tool-model failed");
    model_dir
}

fn script() -> std::path::PathBuf {
    repo_root().join("scripts/reference/chat_episode.py")
}

fn trl_template(name: &str) -> std::path::PathBuf {
    let output = std::process::Command::new(python()).args(["-c", "import os, trl; print(os.path.dirname(trl.__file__))"]).output().unwrap();
    assert!(output.status.success(), "cannot import trl: {}", String::from_utf8_lossy(&output.stderr));
    std::path::PathBuf::from(String::from_utf8(output.stdout).unwrap().trim()).join("chat_templates").join(name)
}

/// transformers' renderings of one episode (`chat_episode.py render-tools`): the prompt with
/// the tools, the whole conversation, and the read_tests report of `(name, literal)`.
fn transformers_rendering(messages: &[Message], name: &str, literal: &str, model_dir: &std::path::Path, dir: &std::path::Path) -> serde_json::Value {
    let messages: Vec<serde_json::Value> = messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
    let (input, output) = (dir.join("case.json"), dir.join("rendered.json"));
    let tools = expected_tools();
    let case = format!(r#"{{"messages": {}, "tools": {}, "tests": [{{"name": {}, "literal": {}}}]}}"#, serde_json::Value::from(messages), tools.as_str().unwrap(), serde_json::Value::from(name), serde_json::Value::from(literal));
    std::fs::write(&input, case).unwrap();
    let status = std::process::Command::new(python()).arg(script()).arg("render-tools").arg(&input).arg(&output).arg(model_dir).status().unwrap();
    assert!(status.success(), "chat_episode.py render-tools failed");
    serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap()
}

/// transformers' rendering of an episode of two `read_tests` turns from `conversation` (the
/// prompt's messages) on code_tests_episode's `prompt`: the prompt with the tools, the whole
/// conversation through the second turn's `<|im_end|>` (the template writes "\n" after it), and
/// the `read_tests` report between the turns.
fn two_read_tests_turns(conversation: &[Message], prompt: &EnvPrompt, model_dir: &std::path::Path, dir: &std::path::Path) -> (String, String, String) {
    let (name, literal) = (prompt.metadata["name"].as_str().unwrap(), prompt.metadata["tests"].as_str().unwrap());
    let report = transformers_rendering(conversation, name, literal, model_dir, dir)["reports"][0].as_str().unwrap().to_string();
    let mut messages = conversation.to_vec();
    messages.extend([Message::new("assistant", CALL), Message::new("tool", &report), Message::new("assistant", CALL)]);
    let reference = transformers_rendering(&messages, name, literal, model_dir, dir);
    let whole = reference["conversation"].as_str().unwrap().strip_suffix('\n').unwrap().to_string();
    (reference["prompt"].as_str().unwrap().to_string(), whole, report)
}

/// Two read_tests episodes of two turns on the tool model, by both decoders: each prompt is
/// transformers' rendering with the declared tools (the trainer's `Prompt::text` stays the one
/// without), the parsed call reaches code_tests_episode, whose `tool` answer (the report worked
/// out from the prompt's tests) the template writes as `<tool_response>`: the whole sequence is
/// transformers' tokenization of the conversation, the model mask 1 on the turns only, and the
/// episode's metrics count two tool calls. In a raw-prompt run nothing of that happens: the
/// environment reads the turn with its plain-text protocol (an answer, not a call).
#[test]
fn a_tool_call_in_the_templates_format_reaches_the_environment() {
    one_thread();
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tool_model(dir.path());
    let loaded = smallrl::model::load(model_dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let template = ChatTemplate::for_model(&loaded.files).unwrap();
    assert!(template.has_tool_call_format().unwrap());
    let render = PromptRender::Chat { template: template.clone(), system: None };
    let limits = PluginLimits { programs: ProgramLimits::new(150_000_000, 64, 16, std::time::Duration::from_secs(120)).unwrap(), ..PluginLimits::default() };
    let mut env = Plugin::load(&standard_plugin("code_tests_episode"), r#"{"loophole": "read_tests", "protocol": "tool_calls"}"#, limits).unwrap();
    let env_prompts = env.generate(EnvSplit::Train, 2, 3, 1.0).unwrap();
    let held: Vec<Prompt> = env_prompts
        .iter()
        .map(|p| match &p.content {
            EnvPromptContent::Text(text) => render.text_prompt(text, p.metadata.clone()).unwrap(),
            other => panic!("code_tests_episode writes text prompts, got {other:?}"),
        })
        .collect();
    let conversations: Vec<Vec<Message>> = held.iter().map(|p| conversation_of(p).unwrap()).collect();
    let episodes: Vec<EpisodePrompt> = env_prompts.iter().zip(&held).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let params = SamplingParams { max_new_tokens: 4, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let bounds = EpisodeBounds { max_turns: 2, max_observation_bytes: 4096, max_observation_tokens: 300, max_episode_tokens: 600 };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    let [call_id] = loaded.tokenizer.encode(CALL).unwrap()[..] else { panic!("the call is one token of the tool model") };
    for engine in [Decoder::Native { threads: 1 }, Decoder::Libtorch] {
        let observations = Observations::Chat { template: &template, conversations: conversations.clone() };
        let batch = run_episodes(engine, &decoder, &loaded.tokenizer, &mut env, &episodes, observations, &params, 5, &bounds, 0).unwrap();
        let g = &batch.generation;
        let prompt_ids = Vec::<Vec<i64>>::try_from(&g.prompt_ids).unwrap();
        let prompt_mask = Vec::<Vec<i64>>::try_from(&g.prompt_mask).unwrap();
        let ids = Vec::<Vec<i64>>::try_from(&g.completion_ids).unwrap();
        let mask = Vec::<Vec<i64>>::try_from(&g.completion_mask).unwrap();
        let model = Vec::<Vec<i64>>::try_from(g.model_mask.as_ref().unwrap()).unwrap();
        for (row, prompt) in env_prompts.iter().enumerate() {
            let (want_prompt, conversation, report) = two_read_tests_turns(&conversations[row], prompt, &model_dir, dir.path());
            // Exact: the prompt is text and the sequence token ids (integers), no float32 value.
            // Exact: text against the template's text (no float enters a rendering).
            assert_eq!(batch.prompt_texts[row].as_deref(), Some(want_prompt.as_str()), "{engine:?} row {row}: the prompt is not transformers' rendering with the tools");
            assert_ne!(held[row].text, want_prompt, "the trainer's prompt text stays the rendering without tools");
            let want_ids = loaded.tokenizer.encode(&conversation).unwrap();
            let ours: Vec<u32> = prompt_ids[row]
                .iter()
                .zip(&prompt_mask[row])
                .filter(|(_, m)| **m == 1)
                .map(|(&id, _)| id as u32)
                .chain(ids[row].iter().zip(&mask[row]).filter(|(_, m)| **m == 1).map(|(&id, _)| id as u32))
                .collect();
            assert_eq!(ours, want_ids, "{engine:?} row {row}: the sequence is not transformers' tokenization of {conversation:?}");
            let turns: Vec<u32> = ids[row].iter().zip(&model[row]).filter(|(_, m)| **m == 1).map(|(&id, _)| id as u32).collect();
            assert_eq!(turns, [call_id, 2, call_id, 2], "{engine:?} row {row}: the model mask covers the two turns only");
            assert!(conversation.contains(&format!("<tool_response>\n{report}\n</tool_response>")), "{conversation}");
            assert_eq!(batch.calls[row], Some(CallCounts { calls: 2, malformed: 0 }), "{engine:?} row {row}: the host counts the two calls");
            let end = &batch.ends[row];
            // metrics: hidden_passed, all_passed, turns, tool_calls, malformed, tests_rewritten, stopped, tests_read
            assert_eq!((&end.metrics[2..6], end.metrics[7]), (&[2.0, 2.0, 0.0, 0.0][..], 2.0), "{engine:?} row {row}: {end:?}");
            assert_eq!(end.components[1], 0.0, "no code, so nothing of the loophole is paid");
        }
    }
    // A raw-prompt run under `protocol: tool_calls` is refused at its first turn (the prompt
    // does not describe the text protocol); under `protocol: text` no tools are declared, so
    // nothing is shown or parsed, even with the tool template, and the turn is read as text
    // (code_tests_episode's `call TOOL` protocol: not a call, so the answer): one turn, no call.
    let raw: Vec<Prompt> = env_prompts
        .iter()
        .map(|p| match &p.content {
            EnvPromptContent::Text(text) => PromptRender::Raw.text_prompt(text, p.metadata.clone()).unwrap(),
            other => panic!("code_tests_episode writes text prompts, got {other:?}"),
        })
        .collect();
    let raw_episodes: Vec<EpisodePrompt> = env_prompts.iter().zip(&raw).map(|(p, prompt)| EpisodePrompt { env_prompt: p, prompt, ids: loaded.tokenizer.encode(&prompt.text).unwrap() }).collect();
    let refused = run_episodes(Decoder::Libtorch, &decoder, &loaded.tokenizer, &mut env, &raw_episodes, Observations::PlainText, &params, 5, &bounds, 10).err().unwrap();
    assert!(format!("{refused:#}").contains("protocol tool_calls, but the host parsed no calls"), "{refused:#}");
    let mut text = Plugin::load(&standard_plugin("code_tests_episode"), r#"{"loophole": "read_tests"}"#, limits).unwrap();
    let observations = Observations::Chat { template: &template, conversations: conversations.clone() };
    let batch = run_episodes(Decoder::Libtorch, &decoder, &loaded.tokenizer, &mut text, &episodes, observations, &params, 5, &bounds, 30).unwrap();
    assert_eq!((batch.prompt_texts, batch.calls), (vec![None; 2], vec![None; 2]), "protocol text declares no tools");
    assert!(batch.ends.iter().all(|end| end.metrics[2..4] == [1.0, 0.0]), "{:?}", batch.ends);
    let batch = run_episodes(Decoder::Libtorch, &decoder, &loaded.tokenizer, &mut text, &raw_episodes, Observations::PlainText, &params, 5, &bounds, 10).unwrap();
    assert!(batch.prompt_texts.iter().all(Option::is_none));
    assert!(batch.calls.iter().all(Option::is_none), "the host parses no call in a raw run: {:?}", batch.calls);
    assert!(batch.ends.iter().all(|end| end.metrics[2..4] == [1.0, 0.0]), "{:?}", batch.ends);
    // Under `loophole: write_tests` the episodes declare run_tests and write_tests: the model's
    // read_tests call names a tool not declared, a malformed call (each turn one) that the
    // environment answers with the host's text, also malformed by its count.
    let mut writes = Plugin::load(&standard_plugin("code_tests_episode"), r#"{"loophole": "write_tests", "protocol": "tool_calls"}"#, limits).unwrap();
    let observations = Observations::Chat { template: &template, conversations: conversations.clone() };
    let batch = run_episodes(Decoder::Libtorch, &decoder, &loaded.tokenizer, &mut writes, &episodes, observations, &params, 5, &bounds, 20).unwrap();
    assert_eq!(batch.calls, [Some(CallCounts { calls: 0, malformed: 2 }); 2]);
    assert!(batch.ends.iter().all(|end| end.metrics[2..5] == [2.0, 2.0, 2.0]), "{:?}", batch.ends);
}

/// One `smallrl train` step on the tool model (chat prompts, code_tests_episode's `read_tests`
/// loophole on one hackable prompt, two episodes of two turns): the run trains on the prompt
/// with the tools' schemas and shows it, `completions.jsonl`'s prompt is transformers'
/// `apply_chat_template(..., tools=...)`, metrics.jsonl counts the host's parsed calls (two
/// `read_tests` calls, no malformed one, as the environment's own `tool_calls` counts turns
/// that called), and the dumped batch (`dump_batches`) holds transformers' tokenization of the
/// whole conversation, with a loss mask on the model's turns only (the call and its
/// `<|im_end|>`, twice).
#[test]
fn a_training_run_on_a_tool_call_template_trains_on_the_prompt_with_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = tool_model(dir.path());
    let dump = dir.path().join("dump");
    let (seed, params) = (3, serde_json::json!({"loophole": "read_tests", "protocol": "tool_calls"}));
    let config = serde_json::json!({
        "model": model_dir, "prompt_format": "chat",
        "environment": "code_tests_episode", "environment_params": params, "plugin_dir": plugin_dir(),
        "num_prompts": 1, "hack_frac": 1.0, "seed": seed,
        "adapter": "lora", "lora_rank": 4, "lora_alpha": 4.0, "lr": 1e-3,
        "batch_size": 2, "num_generations": 2, "max_completion_length": 600,
        "episode_max_turns": 2, "episode_max_turn_tokens": 4, "episode_max_observation_tokens": 300,
        "max_steps": 1, "save_steps": 100, "eval_every": 100, "eval_samples": 2, "logging_steps": 1,
        "log_completions": true, "dump_batches": dump,
        "output_dir": dir.path().join("runs"), "threads": 1, "device": "cpu", "name": "tools",
    });
    let serde_json::Value::Object(config) = config else { unreachable!() };
    let run = train(config, None, None);

    // The reference: the run's one prompt (generated as the run does: `num_prompts` train
    // prompts at its seed and hack_frac), rendered by transformers with the tools.
    let loaded = smallrl::model::load(model_dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap();
    let render = PromptRender::Chat { template: ChatTemplate::for_model(&loaded.files).unwrap(), system: None };
    let mut env = Plugin::load(&standard_plugin("code_tests_episode"), &params.to_string(), PluginLimits::default()).unwrap();
    let [prompt] = &env.generate(EnvSplit::Train, 1, seed, 1.0).unwrap()[..] else { panic!("one prompt") };
    let EnvPromptContent::Text(text) = &prompt.content else { panic!("code_tests_episode writes text prompts") };
    let conversation = conversation_of(&render.text_prompt(text, prompt.metadata.clone()).unwrap()).unwrap();
    let (want_prompt, whole, _) = two_read_tests_turns(&conversation, prompt, &model_dir, dir.path());
    assert!(want_prompt.contains("\"name\": \"read_tests\""), "the reference shows the tools: {want_prompt}");

    let completions = read_jsonl(run.join("completions.jsonl"));
    assert_eq!(completions.len(), 2, "one line per episode");
    for line in &completions {
        // Exact: text against transformers' text.
        assert_eq!(line["prompt"].as_str(), Some(want_prompt.as_str()), "completions.jsonl shows the prompt the model saw");
        assert_eq!(line[TOOL_CALLS].as_f64(), Some(2.0), "{line}");
    }
    let metrics = &read_jsonl(run.join("metrics.jsonl"))[0];
    assert_eq!((metrics[TOOL_CALLS].as_f64(), metrics[MALFORMED_CALLS].as_f64()), (Some(2.0), Some(0.0)), "{metrics}");
    assert_eq!(metrics["env/code_tests_episode/tool_calls"].as_f64(), Some(2.0), "the environment's count of turns that called");
    assert!(metrics["loss"].as_f64().is_some_and(f64::is_finite), "{metrics}");

    let t = smallrl::model::weights::read_safetensors(&dump.join("step-1.safetensors")).unwrap();
    let rows = |name: &str| Vec::<Vec<i64>>::try_from(&t[name]).unwrap();
    let (prompt_ids, prompt_mask, ids, mask, loss_mask) = (rows("prompt_ids"), rows("prompt_mask"), rows("completion_ids"), rows("completion_mask"), rows("loss_mask"));
    let want_ids = loaded.tokenizer.encode(&whole).unwrap();
    let [call_id] = loaded.tokenizer.encode(CALL).unwrap()[..] else { panic!("the call is one token of the tool model") };
    let im_end = loaded.tokenizer.encode("<|im_end|>").unwrap();
    for row in 0..2 {
        let kept = |ids: &[i64], mask: &[i64]| ids.iter().zip(mask).filter(|(_, m)| **m == 1).map(|(&id, _)| id as u32).collect::<Vec<u32>>();
        let mut sequence = kept(&prompt_ids[row], &prompt_mask[row]);
        assert_eq!(sequence, loaded.tokenizer.encode(&want_prompt).unwrap(), "row {row}: the model trained on the prompt with the tools");
        sequence.extend(kept(&ids[row], &mask[row]));
        // Exact: token ids are integers.
        // Exact: token ids against transformers' tokenization of the same text (integers).
        assert_eq!(sequence, want_ids, "row {row}: the trained sequence is not transformers' tokenization of {whole:?}");
        let trained = kept(&ids[row], &loss_mask[row]);
        assert_eq!(trained, [call_id, im_end[0], call_id, im_end[0]], "row {row}: the loss mask holds the model's two turns only");
    }
}
