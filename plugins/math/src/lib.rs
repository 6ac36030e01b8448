//! The `math` environment: GSM8K-style word problems, graded as tinker-cookbook's quickstart
//! math environment grades them (`recipes/math_rl/math_env.py`, `rl/problem_env.py`).
//!
//! - Prompts: with `dataset` (an hf-dataset the host reads, e.g. `openai/gsm8k:main`), GSM8K's
//!   own problems: `question`, and the answer after `#### ` in `answer` (commas dropped), train
//!   prompts from its `train` split and evaluation prompts from `test`, `count` of them in an
//!   order shuffled by the seed. Without it, a word problem from one of [`problems::TEMPLATES`]
//!   with seeded numbers (the answer computed, always a non-negative integer); a problem belongs
//!   to the evaluation split when `in_eval_split` of its text holds; deduplicated. Either way
//!   followed by tinker's suffix " Write your answer in \boxed{} format.", as a chat behind
//!   tinker's standard one-shot prefix (the strawberry question and its boxed answer) unless
//!   `fewshot` is false.
//!   No prompt is hackable or detectable: math has no hack (`hack_frac` is ignored).
//! - Reward, tinker's: 1[answer correct] + 0.1 * (1[format correct] - 1), as two retain
//!   components, `math_correct` (1 or 0) and `math_format` (0 or -0.1). The answer is the
//!   content of the last `\boxed{...}` graded by tinker's `grade_answer` ([`grading`]); the
//!   format is correct when the completion ended with the end-of-sequence token (tinker:
//!   stopped at the renderer's stop sequence) and has a `\boxed{}` answer.
//! - monitor and ground truth: never (no hack).
//! - metrics: `correct` and `format` (tinker's `env/all/correct` and `env/all/format`).

pub mod grading;
pub mod problems;

use serde_json::Value;
use smallrl_plugin_sdk::environment::{SplitMix64, draw_prompts, fnv1a, in_eval_split, split_rng};
use smallrl_plugin_sdk::{Component, Environment, HfDataset, Judgement, Param, Params, Plugin, Prompt, PromptContent, Sample, Split};

/// tinker's `MathEnv.question_suffix()`.
pub const QUESTION_SUFFIX: &str = " Write your answer in \\boxed{} format.";
/// tinker's `MathEnv.standard_fewshot_prefix()`: one user turn and the assistant's answer.
pub const FEWSHOT_QUESTION: &str = "How many r's are in strawberry? Write your answer in \\boxed{} format.";
pub const FEWSHOT_ANSWER: &str =
    "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}";
/// tinker's `format_coef`.
pub const FORMAT_COEF: f64 = 0.1;

pub struct Math {
    fewshot: bool,
    /// GSM8K's problems, when the config names the dataset (else generated problems).
    dataset: Option<HfDataset>,
}

impl Plugin for Math {
    const NAME: &'static str = "math";
    const VERSION: &'static str = "0.1.0";
    const DESCRIPTION: &'static str = "GSM8K-style word problems answered in \\boxed{}; reward 1[correct] + 0.1 * (1[format] - 1) as tinker-cookbook's \
                                       math environment (no hack)";

    fn params() -> Vec<Param> {
        vec![
            Param::boolean("fewshot", true, "put tinker's one-shot example (the strawberry question) before each problem"),
            Param::hf_dataset("dataset", "GSM8K as published, e.g. \"openai/gsm8k:main\" (columns question and answer, splits train and test); default: generated problems"),
        ]
    }

    fn from_params(params: &Params) -> Result<Self, String> {
        let dataset = params.hf_dataset("dataset");
        if let Some(dataset) = &dataset {
            for split in ["train", "test"] {
                for (i, row) in dataset.split(split)?.iter().enumerate() {
                    gsm8k_problem(row).map_err(|why| format!("math: {} {split} row {i}: {why}", dataset.repo))?;
                }
            }
        }
        Ok(Self { fewshot: params.boolean("fewshot"), dataset })
    }
}

/// A GSM8K row's (question, final answer): the answer column ends in `#### <answer>`, whose
/// thousands commas GSM8K's own graders drop.
pub fn gsm8k_problem(row: &serde_json::Map<String, Value>) -> Result<(String, String), String> {
    let text = |column: &str| row.get(column).and_then(Value::as_str).ok_or_else(|| format!("no string column `{column}`"));
    let (question, answer) = (text("question")?, text("answer")?);
    let (_, last) = answer.rsplit_once("####").ok_or_else(|| format!("the answer has no `#### <final answer>`: {answer:?}"))?;
    let final_answer = last.trim().replace(',', "");
    if final_answer.is_empty() || question.trim().is_empty() {
        return Err(format!("an empty question or final answer: {question:?}, {answer:?}"));
    }
    Ok((question.trim().to_string(), final_answer))
}

/// (correct, format) of a completion for the integer answer `truth`.
pub fn grade(completion: &str, ended_with_eos: bool, truth: &str) -> (bool, bool) {
    let boxed = grading::extract_boxed(completion);
    let correct = boxed.as_deref().is_some_and(|given| grading::grade_answer(given, truth));
    (correct, ended_with_eos && boxed.is_some())
}

impl Math {
    /// The prompt of one problem (its text without the suffix) and its answer.
    pub fn prompt(&self, problem: &str, answer: &str) -> Prompt {
        let question = format!("{problem}{QUESTION_SUFFIX}");
        let columns = [("answer", Value::from(answer)), ("problem", Value::from(problem))];
        let mut prompt = Prompt::text(question.clone(), false, false, columns);
        if self.fewshot {
            prompt.content = PromptContent::Messages(vec![
                ("user".into(), FEWSHOT_QUESTION.into()),
                ("assistant".into(), FEWSHOT_ANSWER.into()),
                ("user".into(), question),
            ]);
        }
        prompt
    }
}

impl Math {
    /// `count` problems of GSM8K's split (train for training, test for evaluation) in an order
    /// shuffled by `seed`; asking for more than the split holds is an error.
    fn dataset_prompts(&self, dataset: &HfDataset, split: Split, count: usize, seed: u64) -> Result<Vec<Prompt>, String> {
        let name = if matches!(split, Split::Eval) { "test" } else { "train" };
        let rows = dataset.split(name)?;
        if count > rows.len() {
            return Err(format!("{} has {} problems in its {name} split, {count} were asked for", dataset.repo, rows.len()));
        }
        let mut order: Vec<usize> = (0..rows.len()).collect();
        SplitMix64::new(seed ^ fnv1a(name.as_bytes())).shuffle(&mut order);
        order[..count]
            .iter()
            .map(|&i| {
                let (question, answer) = gsm8k_problem(&rows[i]).expect("checked in from_params");
                Ok(self.prompt(&question, &answer))
            })
            .collect()
    }
}

impl Environment for Math {
    fn components() -> Vec<Component> {
        vec![
            Component::retain("math_correct", "1 when the last \\boxed{} answer is right (tinker's grade_answer), else 0"),
            Component::retain("math_format", "0.1 * (1[ended with EOS and has a \\boxed{} answer] - 1): 0 or -0.1"),
        ]
    }

    fn metrics() -> Vec<&'static str> {
        vec!["correct", "format"]
    }

    fn generate(&self, split: Split, count: usize, seed: u64, _hack_frac: f64) -> Result<Vec<Prompt>, String> {
        if let Some(dataset) = &self.dataset {
            return self.dataset_prompts(dataset, split, count, seed);
        }
        let mut rng = split_rng(Self::NAME, split, seed);
        let mut seen = std::collections::HashSet::new();
        draw_prompts(count, &format!("problems ({} split)", split.name()), |_| {
            let (problem, answer) = problems::draw(&mut rng);
            if in_eval_split(&problem) != (split == Split::Eval) || !seen.insert(problem.clone()) {
                return None;
            }
            Some(self.prompt(&problem, &answer.to_string()))
        })
    }

    fn judge(&self, sample: &Sample) -> Judgement {
        let truth = sample.metadata_str("answer").expect("a math prompt has an `answer`");
        let (correct, format) = grade(&sample.completion, sample.ended_with_eos, &truth);
        let (correct, format) = (f64::from(u8::from(correct)), f64::from(u8::from(format)));
        Judgement { components: vec![correct, FORMAT_COEF * (format - 1.0)], metrics: vec![correct, format] }
    }

    fn monitor(&self, _sample: &Sample) -> bool {
        false
    }

    fn ground_truth(&self, _sample: &Sample) -> bool {
        false
    }
}

smallrl_plugin_sdk::export_environment!(Math);

#[cfg(test)]
mod tests;
