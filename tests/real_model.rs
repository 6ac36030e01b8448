//! The real SmolLM2-135M-Instruct (built by `scripts/real-model.sh` into
//! `.fixtures/smollm2-135m-instruct/`, with config.json and generation_config.json as the Hub
//! publishes them) against transformers (`scripts/reference/hf_real_model.py`): the published
//! config loads, byte-level BPE ids, decoded text and log-probabilities match (float64
//! reference, 1e-4), greedy decoding matches `generate` token for token on both CPU engines,
//! the stop token is read from generation_config.json (several stop ids stop as `generate`
//! stops), the bfloat16 sampler stays within bfloat16's precision, chat templates render as
//! `apply_chat_template`, and an exported directory keeps weights, stop token and template.

mod common;

use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

use common::{max_abs_diff, one_thread, python, repo_root, smallrl_ok};
use serde_json::{Value, json};
use smallrl::model::chat::{ChatTemplate, Message};
use smallrl::model::batch::CompletionRow;
use smallrl::model::decode::DecodeModel;
use smallrl::model::folded::SamplerDtype;
use smallrl::model::generate::{Decoder, Generation, SamplingParams, generate_with};
use smallrl::model::{self, LoadedModel, native};
use tch::{Device, Kind, Tensor};

const TOLERANCE: f64 = 1e-4;
/// bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%): at logits of magnitude
/// ~20 a log-prob moves by a few hundredths per layer's rounding; these bounds hold transformers'
/// own bfloat16 forward too (printed by the test).
const MAX_NEW_TOKENS: usize = 12;
/// `<|im_end|>`, SmolLM2's end of turn.
const IM_END: u32 = 2;

const SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

fn chatml(question: &str) -> String {
    format!("{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

fn score_texts() -> Vec<String> {
    vec![
        "Once upon a time, there was a little robot who loved to paint.".into(),
        // Byte-level BPE beyond ASCII: accents, an emoji, digits, runs of spaces, a newline.
        "Café déjà vu: naïve 🤖 robots count 12345  spaces\tand\nlines.".into(),
        format!("{}The capital of France is Paris.<|im_end|>", chatml("What is the capital of France?")),
    ]
}

/// Greedy prompts: the first ends its turn (`<|im_end|>`) within MAX_NEW_TOKENS, the second not.
fn greedy_prompts() -> Vec<String> {
    vec![chatml("What is the capital of France?"), chatml("Say yes.")]
}

/// Conversations for the chat template: one user message (the template adds its default system
/// prompt), a system prompt of our own, and several turns (one with a `<think>` reply).
fn conversations() -> Value {
    json!([
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "  Capital of Italy?  "}],
        [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a story about a café. 🤖"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>easy</think>4"}, {"role": "user", "content": "And 3+3?"}],
    ])
}

/// Templates of other families, in the HF dialect (whitespace control, `.strip()`, loop
/// variables, `{% continue %}`, `raise_exception`, `strftime_now` (the year, so only a run across
/// New Year's midnight could see two), the tokenizer's `bos_token`), rendered with
/// this tokenizer's special tokens.
const LLAMA3_STYLE: &str = r#"{{- bos_token }}
{%- if strftime_now is defined %}
    {%- set year = strftime_now("%Y") %}
{%- else %}
    {%- set year = "no strftime_now" %}
{%- endif %}
{{- 'Year: ' + year + '\n' }}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;
const QWEN_STYLE: &str = r#"{%- for message in messages %}
    {%- if loop.first and message.role != 'system' %}
        {{- '<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {%- if message.role == 'assistant' and message.content.startswith('<think>') %}
        {%- continue %}
    {%- endif %}
    {%- if message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>assistant\n' + message.content + '<|im_end|>' + ('\n' if not loop.last else '') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Zephyr's layout, written without `-` whitespace control: it renders right only with
/// transformers' `trim_blocks` and `lstrip_blocks`.
const ZEPHYR_STYLE: &str = r#"{% for message in messages %}
    {% if message['role'] == 'user' %}
<|user|>
{{ message['content'] }}{{ eos_token }}
    {% elif message['role'] == 'system' %}
<|system|>
{{ message['content'] }}{{ eos_token }}
    {% else %}
<|assistant|>
{{ message['content'] }}{{ eos_token }}
    {% endif %}
    {% if loop.last and add_generation_prompt %}
<|assistant|>
    {% endif %}
{% endfor %}"#;

/// transformers' `tojson` (Python's `json.dumps`, non-ASCII kept, HTML characters not escaped)
/// and `tools` being none, as tool-calling templates use them.
const TOJSON_STYLE: &str = r#"{%- if tools is none %}{{ 'no tools\n' }}{% endif %}
{%- for message in messages %}
    {{- message | tojson }}{{ '\n' }}
    {{- message | tojson(indent=2) }}{{ '\n' }}
{%- endfor %}
{{- {'b': [1, 2.5, none, true, []], 'a': 'é<&>"\'', 'c': {}} | tojson(sort_keys=true) }}
{{- messages | tojson(indent=4) }}"#;

/// transformers' outputs for all tests of this binary, computed once.
fn reference() -> &'static Value {
    static REFERENCE: OnceLock<Value> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let templates: Vec<Value> = [LLAMA3_STYLE, QWEN_STYLE, ZEPHYR_STYLE, TOJSON_STYLE]
            .iter()
            .flat_map(|template| conversations().as_array().unwrap().clone().into_iter().map(move |m| json!({"template": template, "messages": m})))
            .collect();
        let body = json!({
            "score": score_texts(), "score_bf16": score_texts(), "greedy": greedy_prompts(), "max_new_tokens": MAX_NEW_TOKENS,
            "chat": conversations(), "templates": templates,
        });
        common::hf_real_model(&body)
    })
}

/// One test at a time: each holds a 540 MB model (and the native sampler's copy), and the
/// machine's cores are better spent on one forward pass than shared between several.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn load(dir: &Path) -> LoadedModel {
    one_thread();
    model::load(dir.to_str().unwrap(), "main", Device::Cpu, Kind::Float).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()))
}

#[test]
fn the_published_config_loads_and_log_probs_match_transformers() {
    let _serial = serial();
    let dir = common::real_model_dir();
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    for key in ["is_llama_config", "rope_interleaved", "rope_scaling", "transformers.js_config", "torch_dtype", "transformers_version"] {
        assert!(config.get(key).is_some(), "the fixture's config.json lacks the published key {key}");
    }
    let loaded = load(&dir);
    assert_eq!(loaded.model.config.eos_token_id, IM_END);
    let reference = reference();
    for (text, expected) in score_texts().iter().zip(reference["score"].as_array().unwrap()) {
        let ids = loaded.tokenizer.encode(text).unwrap();
        assert_eq!(ids, self::ids(&expected["ids"]), "token ids of {text:?}");
        assert_eq!(loaded.tokenizer.decode(&ids).unwrap(), expected["decoded"].as_str().unwrap(), "decoding {text:?}");
        let input = Tensor::from_slice(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>()).unsqueeze(0);
        let logprobs = tch::no_grad(|| {
            let logp = loaded.model.logits(&loaded.model.forward(&input, &input.ones_like(), &[])).log_softmax(-1, Kind::Double);
            let n = ids.len() as i64 - 1;
            logp.squeeze_dim(0).narrow(0, 0, n).gather(1, &input.squeeze_dim(0).narrow(0, 1, n).unsqueeze(1), false).squeeze_dim(1)
        });
        let expected: Vec<f64> = expected["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let diff = max_abs_diff(&logprobs, &Tensor::from_slice(&expected));
        println!("{text:?}: {} tokens, max |log p - transformers (float64)| = {diff:.2e}", ids.len());
        assert!(diff <= TOLERANCE, "{text:?}: log-probs differ from transformers by {diff}");
    }
}

/// bfloat16 (`dtype: bfloat16`, the dtype for 135M-class models on CUDA) on CUDA when one is
/// present, else on the CPU through the same code: log-probs within bfloat16's precision of the
/// float64 reference, as transformers' own bfloat16 forward is (its errors printed beside
/// ours), and measurably not float32 (a dtype silently ignored would be within 1e-4).
#[test]
fn bfloat16_log_probs_are_within_bfloat16_precision_of_the_float64_reference() {
    let _serial = serial();
    let device = if tch::Cuda::is_available() { Device::Cuda(0) } else { Device::Cpu };
    one_thread();
    let loaded = model::load(common::real_model_dir().to_str().unwrap(), "main", device, Kind::BFloat16).unwrap();
    let reference = reference();
    let mut worst: f64 = 0.0;
    for ((text, float64), theirs) in score_texts().iter().zip(reference["score"].as_array().unwrap()).zip(reference["score_bf16"].as_array().unwrap()) {
        let ids = loaded.tokenizer.encode(text).unwrap();
        let input = Tensor::from_slice(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>()).unsqueeze(0).to(device);
        let ours = tch::no_grad(|| {
            let logp = loaded.model.logits(&loaded.model.forward(&input, &input.ones_like(), &[])).to_kind(Kind::Float).log_softmax(-1, Kind::Double);
            let n = ids.len() as i64 - 1;
            logp.squeeze_dim(0).narrow(0, 0, n).gather(1, &input.squeeze_dim(0).narrow(0, 1, n).unsqueeze(1), false).squeeze_dim(1).to(Device::Cpu)
        });
        worst = worst.max(bf16_error(&format!("{text:?} on {device:?}, ours"), &ours, float64, theirs));
    }
    assert!(worst > 1e-3, "bfloat16 log-probs within {worst} of float64: the dtype was not applied");
}

/// `ours`' largest |log p - float64| (the reference's `float64` entry), in max and mean within
/// three times transformers' own bfloat16 forward's distance to float64 on the same text
/// (`theirs`, computed on this machine): bfloat16's rounding is the reference's error too, and
/// both vary with the order of a product's sums. Measured on 2026-11-28 (AMD EPYC): ours
/// 0.5 to 1.6 times transformers' for the libtorch forward, 0.1 to 0.4 for the bfloat16 sampler
/// (float32 sums); a dtype not applied is caught by the callers' lower bound, a wrong weight by
/// whole nats.
fn bf16_error(what: &str, ours: &Tensor, float64: &Value, theirs: &Value) -> f64 {
    let values = |v: &Value| Tensor::from_slice(&v["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>());
    let (exact, transformers) = (values(float64), values(theirs));
    let (ours_error, their_error) = (max_abs_diff(ours, &exact), max_abs_diff(&transformers, &exact));
    let mean = |t: &Tensor| (t - &exact).abs().mean(Kind::Double).double_value(&[]);
    let (mean_error, their_mean) = (mean(ours), mean(&transformers));
    println!("{what}: |log p - float64| max / mean {ours_error:.3e} / {mean_error:.3e}, transformers' bfloat16 {their_error:.3e} / {their_mean:.3e}");
    assert!(
        ours_error <= 3.0 * their_error && mean_error <= 3.0 * their_mean,
        "{what}: bfloat16 log-probs off the float64 reference by {ours_error} (mean {mean_error}), more than three times transformers' bfloat16 ({their_error}, mean {their_mean}){}",
        common::machine_note()
    );
    ours_error
}

/// The bfloat16 sampler (`sampler_dtype: bfloat16`: the native sampler's matrices in
/// bfloat16, float32 sums): its log-probabilities of the score texts within bfloat16's precision
/// of the float64 reference (transformers' own bfloat16 forward beside them), measurably not
/// float32's, and the log-probabilities it reports while sampling are those of its weights.
#[test]
fn the_bfloat16_sampler_is_within_bfloat16_precision_of_the_float64_reference() {
    let _serial = serial();
    let loaded = load(&common::real_model_dir());
    let decoder = DecodeModel::sampling_in(&loaded.model, &[], SamplerDtype::Bfloat16);
    let native = decoder.native().expect("the native sampler serves float32 models on the CPU");
    let reference = reference();
    let mut worst: f64 = 0.0;
    for ((text, float64), theirs) in score_texts().iter().zip(reference["score"].as_array().unwrap()).zip(reference["score_bf16"].as_array().unwrap()) {
        let ids = loaded.tokenizer.encode(text).unwrap();
        let ours = native::frozen_logprobs(native, &generation(&ids[..1], &ids[1..]), 1.0, 2).unwrap().squeeze_dim(0).to_kind(Kind::Double);
        worst = worst.max(bf16_error(&format!("{text:?}, bfloat16 sampler"), &ours, float64, theirs));
    }
    assert!(worst > 1e-3, "bfloat16 sampler log-probs within {worst} of float64: the weights were not rounded");
    // What it reports while drawing is what its weights give the drawn tokens.
    let prompts: Vec<Vec<u32>> = greedy_prompts().iter().map(|p| loaded.tokenizer.encode(p).unwrap()).collect();
    let params = SamplingParams { max_new_tokens: MAX_NEW_TOKENS, temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let sampled = generate_with(Decoder::Native { threads: 2 }, &decoder, &prompts, &params, 7).unwrap();
    let one_thread = generate_with(Decoder::Native { threads: 1 }, &decoder, &prompts, &params, 7).unwrap();
    assert!(sampled.completion_ids.equal(&one_thread.completion_ids) && sampled.sampling_logprobs.equal(&one_thread.sampling_logprobs), "1 and 2 threads differ");
    for (row, prompt) in prompts.iter().enumerate() {
        let completion = &sampled.rows[row].ids;
        let scored = native::frozen_logprobs(native, &generation(prompt, completion), 1.0, 1).unwrap().squeeze_dim(0);
        let reported = sampled.sampling_logprobs.get(row as i64).narrow(0, 0, completion.len() as i64);
        let diff = max_abs_diff(&reported, &scored);
        assert!(diff <= TOLERANCE, "row {row}: the sampler's log-probs differ from its weights' by {diff}");
    }
}

/// One row: `prompt` then `completion` (as a sampler's output, for scoring).
fn generation(prompt: &[u32], completion: &[u32]) -> Generation {
    let row = |ids: &[u32]| Tensor::from_slice(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>()).unsqueeze(0);
    let (p, c) = (prompt.len() as i64, completion.len() as i64);
    Generation {
        prompt_ids: row(prompt),
        prompt_mask: Tensor::ones([1, p], (Kind::Int64, Device::Cpu)),
        completion_ids: row(completion),
        completion_mask: Tensor::ones([1, c], (Kind::Int64, Device::Cpu)),
        sampling_logprobs: Tensor::zeros([1, c], (Kind::Float, Device::Cpu)),
        kept: None,
        model_mask: None,
        rows: vec![CompletionRow { ids: completion.to_vec(), ended_with_eos: false }],
    }
}

#[test]
fn greedy_decoding_matches_generate_token_for_token() {
    let _serial = serial();
    let loaded = load(&common::real_model_dir());
    let reference = reference();
    let prompts: Vec<Vec<u32>> = greedy_prompts().iter().map(|p| loaded.tokenizer.encode(p).unwrap()).collect();
    let expected: Vec<&Value> = reference["greedy"].as_array().unwrap().iter().collect();
    for (prompt, row) in prompts.iter().zip(&expected) {
        assert_eq!(prompt, &ids(&row["prompt_ids"]));
    }
    // transformers stops at generation_config's eos (2) and keeps it; it must stop on the first
    // prompt and not on the second, so both ends are exercised.
    let stops: Vec<bool> = expected.iter().map(|row| ids(&row["completion_ids"]).last() == Some(&IM_END)).collect();
    assert_eq!(stops, [true, false], "the reference completions: {expected:?}");
    let params = SamplingParams { max_new_tokens: MAX_NEW_TOKENS, temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    for engine in [Decoder::Native { threads: 2 }, Decoder::Libtorch] {
        let generation = generate_with(engine, &decoder, &prompts, &params, 0).unwrap();
        for (i, (row, reference)) in generation.rows.iter().zip(&expected).enumerate() {
            let mut got = row.ids.clone();
            if row.ended_with_eos {
                got.push(IM_END);
            }
            assert_eq!(got, ids(&reference["completion_ids"]), "{engine:?}, prompt {i}: {:?}", loaded.tokenizer.decode(&row.ids));
            assert_eq!(loaded.tokenizer.decode(&row.ids).unwrap(), reference["completion_text"].as_str().unwrap(), "{engine:?}, prompt {i}");
        }
    }
}

/// A copy of the fixture (weights and tokenizer linked) with `config.json`'s eos_token_id set to
/// 0 (`<|endoftext|>`) and generation_config.json as given (`None`: absent).
fn variant(generation_config: Option<Value>) -> tempfile::TempDir {
    let source = common::real_model_dir();
    let dir = tempfile::tempdir().unwrap();
    for name in ["model.safetensors", "tokenizer.json"] {
        std::os::unix::fs::symlink(source.join(name), dir.path().join(name)).unwrap();
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    config["eos_token_id"] = json!(0);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    if let Some(generation_config) = generation_config {
        std::fs::write(dir.path().join("generation_config.json"), generation_config.to_string()).unwrap();
    }
    dir
}

#[test]
fn the_stop_token_is_read_from_generation_config() {
    let _serial = serial();
    let prompt = chatml("What is the capital of France?");
    let params = SamplingParams { max_new_tokens: MAX_NEW_TOKENS, temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let greedy = |loaded: &LoadedModel| {
        let prompts = vec![loaded.tokenizer.encode(&prompt).unwrap()];
        let decoder = DecodeModel::new(&loaded.model, &[]);
        generate_with(Decoder::Native { threads: 2 }, &decoder, &prompts, &params, 0).unwrap().rows.remove(0)
    };
    for generation_config in [json!({"eos_token_id": 2, "bos_token_id": 1}), json!({"eos_token_id": [2]})] {
        let dir = variant(Some(generation_config.clone()));
        let loaded = load(dir.path());
        assert_eq!(loaded.model.config.eos_token_id, IM_END, "{generation_config}");
        let row = greedy(&loaded);
        assert!(row.ended_with_eos && row.ids.len() < MAX_NEW_TOKENS, "{generation_config}: {:?}", row.ids);
        assert!(!row.ids.contains(&IM_END));
    }
    // Without generation_config.json, config.json's id (here 0) is the stop token: the end of
    // turn is then an ordinary token and decoding runs on past it.
    let dir = variant(None);
    let loaded = load(dir.path());
    assert_eq!(loaded.model.config.eos_token_id, 0);
    let row = greedy(&loaded);
    assert!(row.ids.contains(&IM_END), "{:?}", row.ids);
    // A stop id out of the vocabulary is refused by file and key.
    let dir = variant(Some(json!({"eos_token_id": [2, 49152]})));
    let error = format!("{:#}", model::load(dir.path().to_str().unwrap(), "main", Device::Cpu, Kind::Float).err().expect("refused"));
    assert!(error.contains("generation_config.json") && error.contains("eos_token_id") && error.contains("49152"), "{error}");
}

/// Several stop ids (Llama-3 and Qwen list several): generation_config.json's
/// `eos_token_id: [<|im_end|>, X]`, X a token greedy decoding reaches before the end of turn, so
/// the second id is the one that stops. Both CPU engines give transformers' `generate` tokens on
/// that directory, the stop token included; an exported directory keeps both ids.
#[test]
fn several_stop_ids_stop_greedy_decoding_as_generate() {
    let _serial = serial();
    let full = ids(&reference()["greedy"][0]["completion_ids"]);
    let x = full[3];
    assert!(!full[..3].contains(&x) && x != IM_END, "{full:?}");
    let dir = variant(Some(json!({"eos_token_id": [IM_END, x]})));
    std::os::unix::fs::symlink(common::real_model_dir().join("tokenizer_config.json"), dir.path().join("tokenizer_config.json")).unwrap();
    let request = dir.path().join("request.json");
    let out = dir.path().join("out.json");
    std::fs::write(&request, json!({"greedy": [greedy_prompts()[0]], "max_new_tokens": MAX_NEW_TOKENS}).to_string()).unwrap();
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts/reference/hf_real_model.py"))
        .args([dir.path().as_os_str(), request.as_os_str(), out.as_os_str()])
        .status()
        .unwrap();
    assert!(status.success(), "hf_real_model.py failed");
    let theirs: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(theirs["eos_token_id"], json!([IM_END, x]));
    let mut expected = ids(&theirs["greedy"][0]["completion_ids"]);
    assert_eq!(expected.pop(), Some(x), "transformers stops on the second id: {expected:?}");
    let loaded = load(dir.path());
    assert_eq!((loaded.model.config.eos_token_id, loaded.model.config.extra_stop_ids.clone()), (IM_END, vec![x]));
    let prompts = vec![ids(&theirs["greedy"][0]["prompt_ids"])];
    let params = SamplingParams { max_new_tokens: MAX_NEW_TOKENS, temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, kept_sets: false };
    let decoder = DecodeModel::new(&loaded.model, &[]);
    for engine in [Decoder::Native { threads: 2 }, Decoder::Libtorch] {
        let generation = generate_with(engine, &decoder, &prompts, &params, 0).unwrap();
        let row = &generation.rows[0];
        assert_eq!((&row.ids, row.ended_with_eos), (&expected, true), "{engine:?}");
        // The completion mask runs through the stop token and no further.
        let mask = Vec::<i64>::try_from(generation.completion_mask.get(0)).unwrap();
        assert_eq!(mask.iter().sum::<i64>() as usize, expected.len() + 1, "{engine:?}: {mask:?}");
    }
    let exported = tempfile::tempdir().unwrap();
    let out_dir = exported.path().join("exported");
    smallrl::model::export::save_hf_dir(&loaded.model, &[], &loaded.files.tokenizer, &out_dir).unwrap();
    assert_eq!(load(&out_dir).model.config, loaded.model.config);
}

#[test]
fn logprobs_cli_reads_the_published_directory() {
    let _serial = serial();
    let dir = common::real_model_dir();
    let text = &score_texts()[0];
    let out = smallrl_ok(&["logprobs", "--model", dir.to_str().unwrap(), "--threads", "1", "--prompt", text, "--json"]);
    let printed: Value = serde_json::from_str(&out).unwrap();
    let expected = &reference()["score"][0];
    assert_eq!(ids(&printed["ids"]), ids(&expected["ids"]));
    let got: Vec<f64> = printed["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let want: Vec<f64> = expected["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(got.len() == want.len() && diff <= TOLERANCE, "CLI log-probs differ from transformers by {diff}");
    // --chat scores the prompt as one user message, after --system or the template's default.
    let chat = &reference()["chat"];
    for (extra, prompt, expected) in [
        (vec![], "What is the capital of France?", &chat[0]),
        (vec!["--system", "You answer in one word."], "  Capital of Italy?  ", &chat[1]),
    ] {
        let mut args = vec!["logprobs", "--model", dir.to_str().unwrap(), "--threads", "1", "--chat", "--prompt", prompt, "--json"];
        args.extend(extra);
        let printed: Value = serde_json::from_str(&smallrl_ok(&args)).unwrap();
        assert_eq!(ids(&printed["ids"]), ids(&expected["ids"]), "{args:?}");
    }
}

fn messages(conversation: &Value) -> Vec<Message> {
    conversation
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let _serial = serial();
    let dir = common::real_model_dir();
    let files = model::hub::from_dir(&dir).unwrap();
    let tokenizer = model::Tokenizer::from_file(&files.tokenizer).unwrap();
    let template = ChatTemplate::for_model(&files).unwrap();
    let reference = reference();
    let conversations = conversations();
    for (conversation, expected) in conversations.as_array().unwrap().iter().zip(reference["chat"].as_array().unwrap()) {
        let text = template.render(&messages(conversation), true).unwrap();
        assert_eq!(text, expected["text"].as_str().unwrap(), "SmolLM2's template on {conversation}");
        assert_eq!(tokenizer.encode(&text).unwrap(), ids(&expected["ids"]), "token ids of {conversation}");
    }
    // The one-user-message form of `--chat` is the first conversation, and the greedy prompt.
    assert_eq!(template.user_prompt(None, "What is the capital of France?").unwrap(), greedy_prompts()[0]);
    // Other families' templates, with SmolLM2's special tokens in the context.
    let config: serde_json::Map<String, Value> = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    let special: serde_json::Map<String, Value> = config.into_iter().filter(|(k, v)| k.ends_with("_token") && v.is_string()).collect();
    let mut expected = reference["templates"].as_array().unwrap().iter();
    for source in [LLAMA3_STYLE, QWEN_STYLE, ZEPHYR_STYLE, TOJSON_STYLE] {
        let template = ChatTemplate::from_source(source, special.clone()).unwrap();
        for conversation in conversations.as_array().unwrap() {
            let text = template.render(&messages(conversation), true).unwrap();
            assert_eq!(text, expected.next().unwrap().as_str().unwrap(), "{source} on {conversation}");
        }
    }
    // raise_exception stops rendering with the template's own message.
    let error = format!("{:#}", ChatTemplate::from_source(LLAMA3_STYLE, special).unwrap().render(&[Message::new("tool", "x")], true).unwrap_err());
    assert!(error.contains("Unknown role: tool"), "{error}");
}

#[test]
fn sample_cli_with_chat_decodes_greedily_as_generate() {
    let _serial = serial();
    let dir = common::real_model_dir();
    let out = smallrl_ok(&[
        "sample", "--model", dir.to_str().unwrap(), "--threads", "2", "--chat", "--prompt", "What is the capital of France?",
        "--temperature", "0", "--max-new-tokens", &MAX_NEW_TOKENS.to_string(), "--json",
    ]);
    let printed: Value = serde_json::from_str(out.trim()).unwrap();
    let mut expected = ids(&reference()["greedy"][0]["completion_ids"]);
    assert_eq!(expected.pop(), Some(IM_END));
    assert_eq!(ids(&printed["completion_ids"]), expected, "{out}");
    assert_eq!(printed["ended_with_eos"], json!(true));
    assert_eq!(printed["completion"], json!("The capital of France is Paris."));
}

#[test]
fn export_round_trip_keeps_the_weights_the_stop_token_and_the_chat_template() {
    let _serial = serial();
    let loaded = load(&common::real_model_dir());
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("exported");
    smallrl::model::export::save_hf_dir(&loaded.model, &[], &loaded.files.tokenizer, &out).unwrap();
    for name in ["chat_template.jinja", "tokenizer_config.json"] {
        assert!(out.join(name).is_file(), "export left out {name}");
    }
    let exported = load(&out);
    assert_eq!(exported.model.config, loaded.model.config);
    assert_eq!(exported.model.config.eos_token_id, IM_END);
    let question = "What is the capital of France?";
    let original_prompt = ChatTemplate::for_model(&loaded.files).unwrap().user_prompt(None, question).unwrap();
    assert_eq!(ChatTemplate::for_model(&exported.files).unwrap().user_prompt(None, question).unwrap(), original_prompt);
    // The same weights: identical logits in smallrl, and transformers reads the directory.
    let ids = loaded.tokenizer.encode(&original_prompt).unwrap();
    let input = Tensor::from_slice(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>()).unsqueeze(0);
    let logits = |m: &smallrl::model::Llama| tch::no_grad(|| m.logits(&m.forward(&input, &input.ones_like(), &[])).squeeze_dim(0));
    let ours = logits(&loaded.model);
    assert_eq!(max_abs_diff(&logits(&exported.model), &ours), 0.0);
    let ids_path = work.path().join("ids.json");
    std::fs::write(&ids_path, serde_json::to_string(&ids).unwrap()).unwrap();
    let reference = work.path().join("logits.safetensors");
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts/reference/hf_logits.py"))
        .args([out.as_os_str(), ids_path.as_os_str(), reference.as_os_str()])
        .status()
        .unwrap();
    assert!(status.success(), "hf_logits.py failed");
    let theirs = model::weights::read_safetensors(&reference).unwrap().remove("logits").unwrap();
    let diff = max_abs_diff(&ours, &theirs);
    println!("exported directory in transformers: max |logits - smallrl| = {diff:.2e}");
    assert!(diff <= TOLERANCE, "transformers' logits of the exported directory differ by {diff}");
}
