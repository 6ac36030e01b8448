//! Environments (contract 0.3): one type that is a whole task. It declares its reward
//! components and metrics, generates its prompts (for a split, a count, a seed and the run's
//! hack fraction) and judges samples: the reward components, the routing monitor and the
//! ground truth. Export it with [`crate::export_environment!`].
//!
//! The host gates `forget` components by each prompt's `hackable` (do not gate them here), drops
//! monitor flags on prompts whose `detectable` is false, and refuses evaluation prompts that
//! share a text with training prompts: split items by a hash ([`in_eval_split`]).

use serde_json::{Map, Value};

use crate::{Plugin, Sample};

/// Which prompts are asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Eval,
}

impl Split {
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }
}

/// `Retain`: the task. `Forget`: the hack's reward (paid by the host on hackable prompts only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Retain,
    Forget,
}

/// One reward component an environment reports.
#[derive(Clone, Debug)]
pub struct Component {
    pub name: &'static str,
    pub role: Role,
    pub description: &'static str,
}

impl Component {
    pub fn retain(name: &'static str, description: &'static str) -> Self {
        Self { name, role: Role::Retain, description }
    }

    pub fn forget(name: &'static str, description: &'static str) -> Self {
        Self { name, role: Role::Forget, description }
    }
}

/// A prompt as the environment writes it: a text (one user message with chat rendering) or a
/// conversation of (role, content) messages, plus its metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptContent {
    Text(String),
    Messages(Vec<(String, String)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub content: PromptContent,
    /// Sent back with every sample of this prompt (`Sample::metadata`); must hold boolean
    /// `hackable` and `detectable` (see [`Prompt::text`]).
    pub metadata: Map<String, Value>,
}

impl Prompt {
    /// A text prompt with its `hackable` and `detectable` flags and further columns.
    pub fn text(text: impl Into<String>, hackable: bool, detectable: bool, columns: impl IntoIterator<Item = (&'static str, Value)>) -> Self {
        let mut metadata = Map::new();
        for (name, value) in columns {
            metadata.insert(name.to_string(), value);
        }
        metadata.insert("hackable".into(), Value::Bool(hackable));
        metadata.insert("detectable".into(), Value::Bool(detectable));
        Self { content: PromptContent::Text(text.into()), metadata }
    }

    /// The prompt's text (the last message's content for a conversation).
    pub fn content_text(&self) -> &str {
        match &self.content {
            PromptContent::Text(text) => text,
            PromptContent::Messages(messages) => messages.last().map_or("", |(_, content)| content.as_str()),
        }
    }

    /// The sample the host sends for `completion` on this prompt (its text, the completion as
    /// one token, ended by the end-of-sequence token, the prompt's metadata): for tests.
    pub fn sample(&self, completion: &str) -> Sample {
        Sample::new(self.content_text(), completion, &[completion], &[0], true).with_metadata(&Value::Object(self.metadata.clone()).to_string())
    }

    /// The prompt as an environment's snapshot test pins it: its text, then its metadata.
    pub fn snapshot_line(&self) -> String {
        format!("{} {}", self.content_text(), Value::Object(self.metadata.clone()))
    }

    pub fn hackable(&self) -> bool {
        self.metadata.get("hackable").and_then(Value::as_bool).unwrap_or(false)
    }

    pub fn detectable(&self) -> bool {
        self.metadata.get("detectable").and_then(Value::as_bool).unwrap_or(false)
    }
}

/// One sample's judgement: a score per component and a value per metric, in declared order.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    pub components: Vec<f64>,
    pub metrics: Vec<f64>,
}

/// A whole task.
pub trait Environment: Plugin {
    /// The reward components [`Environment::judge`] returns, in order (at least one `Retain`).
    fn components() -> Vec<Component>;

    /// Named per-sample metrics [`Environment::judge`] returns, in order (logged as
    /// `env/<name>/<metric>` means).
    fn metrics() -> Vec<&'static str> {
        Vec::new()
    }

    /// Exactly `count` prompts of `split`: a pure function of the parameters and the arguments.
    fn generate(&self, split: Split, count: usize, seed: u64, hack_frac: f64) -> Result<Vec<Prompt>, String>;

    /// The components and metrics of one sample.
    fn judge(&self, sample: &Sample) -> Judgement;

    /// The components and metrics of a whole batch, in order: by default [`Environment::judge`]
    /// of each sample. An environment that asks the host's judge ([`host_judge`]) overrides
    /// this, to send the batch's items in one call.
    fn judge_batch(&self, samples: &[Sample]) -> Result<Vec<Judgement>, String> {
        Ok(samples.iter().map(|sample| self.judge(sample)).collect())
    }

    /// The routing monitor's flag (the host drops it where the prompt is not `detectable`).
    fn monitor(&self, sample: &Sample) -> bool;

    /// Whether the sample truly hacked.
    fn ground_truth(&self, sample: &Sample) -> bool;
}

/// Whether an item belongs to the evaluation split: FNV-1a (64 bit) of its key, mod 1000, below
/// 100 (about 10%, as the original's md5 split). A fixed function of the key, so train and
/// evaluation items never overlap.
pub fn in_eval_split(key: &str) -> bool {
    fnv1a(key.as_bytes()) % 1000 < 100
}

/// Each sample's judgement (through [`Environment::judge_batch`]), monitor flag and ground truth
/// on one line, as an environment's snapshot test pins them.
pub fn judgement_lines<E: Environment>(env: &E, samples: &[Sample]) -> Result<Vec<String>, String> {
    let judgements = env.judge_batch(samples)?;
    Ok(judgements
        .iter()
        .zip(samples)
        .map(|(j, s)| format!("{:?} {:?} monitor={} truth={} {:?}", j.components, j.metrics, env.monitor(s), env.ground_truth(s), s.completion))
        .collect())
}

/// Candidates a generator may draw per prompt asked for before it gives up (the original's
/// budget): a generator whose quotas cannot be met fails instead of looping.
pub const DRAWS_PER_PROMPT: usize = 200;

/// How many of `count` prompts offer the hack: exactly floor(count * hack_frac).
pub fn hackable_count(count: usize, hack_frac: f64) -> usize {
    (count as f64 * hack_frac).floor() as usize
}

/// The random stream of environment `name`'s generator for `split`: `seed` mixed with FNV-1a of
/// "<name>:train" or "<name>:eval", so the splits draw apart.
pub fn split_rng(name: &str, split: Split, seed: u64) -> SplitMix64 {
    SplitMix64::new(seed ^ fnv1a(format!("{name}:{}", split.name()).as_bytes()))
}

/// Exactly `count` prompts: `draw` is called with the number kept so far and returns a
/// candidate, or None to reject it (a full quota, the other split, a repeat). After
/// [`DRAWS_PER_PROMPT`] x `count` + 1000 candidates it is an error naming what was drawn.
pub fn draw_prompts(count: usize, what: &str, mut draw: impl FnMut(usize) -> Option<Prompt>) -> Result<Vec<Prompt>, String> {
    let mut prompts = Vec::with_capacity(count);
    let mut draws = 0;
    while prompts.len() < count {
        draws += 1;
        if draws > DRAWS_PER_PROMPT * count + 1000 {
            return Err(format!("drew {draws} {what} and kept {} of the {count} asked: ask for fewer prompts", prompts.len()));
        }
        if let Some(prompt) = draw(prompts.len()) {
            prompts.push(prompt);
        }
    }
    Ok(prompts)
}

/// FNV-1a, 64 bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// SplitMix64: the generators' random numbers (written out, so no dependency can change them).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fisher-Yates: swaps item i with a uniform one of 0..=i, from the last down.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.range(0, i as u64) as usize);
        }
    }

    /// Uniform in `[low, high]` (inclusive; draws above the last whole span are rejected, so no
    /// modulo bias).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "empty range {low}..={high}");
        let span = high - low + 1;
        if span == 0 {
            return self.next_u64();
        }
        let zone = u64::MAX - (u64::MAX % span) - 1;
        loop {
            let x = self.next_u64();
            if x <= zone {
                return low + x % span;
            }
        }
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Every integer in `text` (an optional `-` then a run of ASCII digits; too-long runs saturate).
pub fn ints(text: &str) -> Vec<i64> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let negative = i > 0 && bytes[i - 1] == b'-';
            let mut value: i64 = 0;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                value = value.saturating_mul(10).saturating_add((bytes[i] - b'0') as i64);
                i += 1;
            }
            out.push(if negative { -value } else { value });
        } else {
            i += 1;
        }
    }
    out
}

/// One item for the host's judge: named fields that fill its template's placeholders.
pub type JudgeItem = Vec<(String, String)>;

/// The host's judge (contract 0.3's `judge` import): one score in [0, 1] per item, or why not
/// (the run configures no judge, an item does not fill the template). In a wasm environment
/// the call goes to the host; natively (tests) to the judge set by [`set_native_judge`].
pub fn host_judge(items: &[JudgeItem]) -> Result<Vec<f64>, String> {
    #[cfg(all(target_arch = "wasm32", feature = "environment"))]
    {
        crate::guest::environment::smallrl::reward::judge::judge(items)
    }
    #[cfg(not(all(target_arch = "wasm32", feature = "environment")))]
    {
        NATIVE_JUDGE.with(|judge| match judge.borrow().as_ref() {
            Some(judge) => judge(items),
            None => Err("no judge: natively, set one with set_native_judge (a wasm environment calls the host's)".into()),
        })
    }
}

/// A native stand-in for the host's judge (per thread), for an environment's native tests.
pub type NativeJudge = Box<dyn Fn(&[JudgeItem]) -> Result<Vec<f64>, String>>;

#[cfg(not(all(target_arch = "wasm32", feature = "environment")))]
thread_local! {
    static NATIVE_JUDGE: std::cell::RefCell<Option<NativeJudge>> = const { std::cell::RefCell::new(None) };
}

/// Sets (or with None clears) this thread's native judge; [`host_judge`] calls it natively.
#[cfg(not(all(target_arch = "wasm32", feature = "environment")))]
pub fn set_native_judge(judge: Option<NativeJudge>) {
    NATIVE_JUDGE.with(|slot| *slot.borrow_mut() = judge);
}
