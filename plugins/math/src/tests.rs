//! Native tests of the math environment: tinker's grading on hand-written answers (each
//! expectation read off tinker-cookbook's `math_grading.py` and checked against that file, at
//! commit 9dfcc3a2, with sympy 1.14 and pylatexenc: all agree but `\textbf{42}`), the reward
//! and metrics on hand-written completions, the generator's properties (every answer recomputed
//! from the numbers in its text, disjoint seeded splits) and insta snapshots (`snapshots/`).

use std::collections::HashSet;

use smallrl_plugin_sdk::environment::{in_eval_split, ints};
use smallrl_plugin_sdk::{Environment, Prompt, PromptContent, Sample, Split, configure};

use super::grading::{extract_boxed, grade_answer};
use super::{FEWSHOT_ANSWER, FEWSHOT_QUESTION, Math, QUESTION_SUFFIX, grade};

fn math() -> Math {
    configure::<Math>("{}").unwrap()
}

/// The problem's text (the last user message, without the suffix).
fn problem(prompt: &Prompt) -> &str {
    prompt.metadata["problem"].as_str().unwrap()
}

#[test]
fn extract_boxed_takes_the_last_balanced_box() {
    let cases: [(&str, Option<&str>); 10] = [
        ("The answer is \\boxed{42}.", Some("42")),
        ("\\boxed{1} then \\boxed{2}", Some("2")),
        // Nested braces: the outer box closes last.
        ("\\boxed{\\frac{1}{2}}", Some("\\frac{1}{2}")),
        ("\\boxed{}", Some("")),
        // Without braces: `\boxed 7`.
        ("so \\boxed 7 it is", Some("7")),
        ("no box here: 42", None),
        // An unmatched `}` anywhere: tinker raises, no answer.
        ("} \\boxed{42}", None),
        ("\\boxed{42", None),
        ("\\boxed{4}2}", None),
        ("{\\boxed{42}", Some("42")),
    ];
    for (text, expected) in cases {
        assert_eq!(extract_boxed(text).as_deref(), expected, "{text}");
    }
}

#[test]
fn grade_answer_follows_tinkers_rules_for_integer_answers() {
    let cases: [(&str, &str, bool); 35] = [
        ("42", "42", true),
        (" 42 ", "42", true),
        ("42.0", "42", true),
        ("42.5", "42", false),
        ("\\$42", "42", true),
        ("$42", "42", true),
        ("42\\%", "42", true),
        ("1,000", "1000", true),
        ("1,000,000", "1000000", true),
        ("1,00", "100", false),
        ("x = 42", "42", true),
        ("\\text{42}", "42", true),
        ("42 \\text{ apples}", "42", true),
        ("42 miles", "42", true),
        ("42 hours", "42", true),
        ("42 apples", "42", false),
        ("(42)", "42", true),
        ("(4,2)", "42", false),
        // MATH's normalisation drops spaces before anything else is tried.
        ("4 2", "42", true),
        ("4 2 3", "423", true),
        ("-42", "42", false),
        ("043", "43", true),
        ("4.2e1", "42", true),
        ("forty-two", "42", false),
        ("", "42", false),
        ("7.0", "7", true),
        ("[42]", "42", true),
        ("42 days", "42", true),
        ("42 dollars", "42", false),
        ("-0", "0", true),
        ("1e20", "100000000000000000000", true),
        ("42.00000001", "42", true),
        ("k=42", "42", true),
        ("{42}", "42", true),
        ("42^\\circ", "42", true),
    ];
    for (given, truth, expected) in cases {
        assert_eq!(grade_answer(given, truth), expected, "{given:?} against {truth}");
    }
    // The one documented difference: tinker turns remaining LaTeX into text with pylatexenc
    // (so `\textbf{42}` is right there); here it stays wrong.
    assert!(!grade_answer("\\textbf{42}", "42"));
}

/// (completion, ended with EOS, correct, format): reward = correct + 0.1 (format - 1).
#[test]
fn rewards_and_metrics_on_hand_written_completions() {
    let env = math();
    let prompt = env.prompt("Tom has 3 apples and buys 4 more. How many apples does Tom have?", "7");
    let cases: [(&str, bool, f64, f64); 8] = [
        ("3 + 4 = 7, so \\boxed{7}", true, 1.0, 1.0),
        // Cut at the length limit: right, but the format needs the stop.
        ("3 + 4 = 7, so \\boxed{7}", false, 1.0, 0.0),
        ("\\boxed{8}", true, 0.0, 1.0),
        ("The answer is 7.", true, 0.0, 0.0),
        ("\\boxed{6} no wait \\boxed{7}", true, 1.0, 1.0),
        ("\\boxed{7} no wait \\boxed{6}", true, 0.0, 1.0),
        ("} \\boxed{7}", true, 0.0, 0.0),
        ("", true, 0.0, 0.0),
    ];
    for (completion, eos, correct, format) in cases {
        let sample = Sample::new("", completion, &[completion], &[0], eos).with_metadata(&serde_json::Value::Object(prompt.metadata.clone()).to_string());
        let judgement = env.judge(&sample);
        assert_eq!(judgement.components, vec![correct, 0.1 * (format - 1.0)], "{completion} (eos {eos})");
        assert_eq!(judgement.metrics, vec![correct, format], "{completion}");
        assert_eq!(grade(completion, eos, "7"), (correct == 1.0, format == 1.0));
        assert!(!env.monitor(&sample) && !env.ground_truth(&sample), "no hack");
    }
}

#[test]
fn prompts_are_tinkers_one_shot_chat_or_a_text() {
    let env = math();
    let prompt = env.prompt("Tom has 3 apples and buys 4 more. How many apples does Tom have?", "7");
    let question = "Tom has 3 apples and buys 4 more. How many apples does Tom have? Write your answer in \\boxed{} format.";
    match &prompt.content {
        PromptContent::Messages(messages) => assert_eq!(
            messages,
            &[("user".to_string(), FEWSHOT_QUESTION.to_string()), ("assistant".to_string(), FEWSHOT_ANSWER.to_string()), ("user".to_string(), question.to_string())]
        ),
        PromptContent::Text(_) => panic!("fewshot is on by default"),
    }
    assert_eq!(FEWSHOT_QUESTION, format!("How many r's are in strawberry?{QUESTION_SUFFIX}"));
    assert_eq!(prompt.metadata["answer"], "7");
    assert!(!prompt.hackable() && !prompt.detectable());
    let plain = configure::<Math>(r#"{"fewshot": false}"#).unwrap().prompt("What is 2 + 2?", "4");
    assert_eq!(plain.content, PromptContent::Text("What is 2 + 2? Write your answer in \\boxed{} format.".into()));
}

/// Every generated answer recomputed from the numbers of its text, by template.
#[test]
fn every_answer_is_the_arithmetic_of_its_text() {
    let prompts = math().generate(Split::Train, 2000, 1, 0.5).unwrap();
    let mut templates_seen = HashSet::new();
    for prompt in &prompts {
        let text = problem(prompt);
        let x: Vec<u64> = ints(text).into_iter().map(|v| u64::try_from(v).unwrap()).collect();
        let (template, expected) = if text.contains("apples") {
            ("apples", x[0] + x[1] * x[2])
        } else if text.contains("muffins") {
            ("muffins", x[0] * x[1] - x[2])
        } else if text.contains("an hour") {
            ("wages", x[0] * x[1] * x[2])
        } else if text.contains("absent") {
            ("classes", x[0] * x[1] - x[2])
        } else if text.contains("pages") {
            ("pages", x[1] / x[0])
        } else if text.contains("legs") {
            ("legs", 4 * x[0] + 2 * x[1])
        } else if text.contains("change") {
            ("change", x[3] - x[0] * x[1] - x[2])
        } else if text.contains("train") {
            ("train", x[0] * x[1] + x[2] * x[3])
        } else if text.contains("marbles") {
            ("marbles", x[0] - x[1] * x[2])
        } else if text.contains("boxes") {
            ("boxes", x[0] * (x[1] + x[2]))
        } else if text.contains("saves") {
            ("savings", x[1] / x[0])
        } else if text.contains("packs") {
            ("packs", (x[1] * x[2]).div_ceil(x[0]))
        } else {
            panic!("no template matches {text:?}")
        };
        templates_seen.insert(template);
        assert_eq!(prompt.metadata["answer"], expected.to_string(), "{text}");
        if template == "change" {
            // The smallest bill of 20, 50 and 100 that pays.
            let total = x[0] * x[1] + x[2];
            assert!(x[3] >= total && [20, 50, 100].iter().filter(|&&bill| bill >= total).min() == Some(&x[3]), "{text}");
        }
        if template == "pages" || template == "savings" {
            assert_eq!(x[1] % x[0], 0, "a whole number of days or weeks: {text}");
        }
    }
    assert_eq!(templates_seen.len(), 12, "every template is drawn");
}

#[test]
fn splits_are_disjoint_by_hash_deduplicated_and_seeded() {
    let env = math();
    let train = env.generate(Split::Train, 3000, 7, 0.5).unwrap();
    let eval = env.generate(Split::Eval, 256, 99, 0.5).unwrap();
    assert!(train.iter().all(|p| !in_eval_split(problem(p))));
    assert!(eval.iter().all(|p| in_eval_split(problem(p))));
    let train_set: HashSet<&str> = train.iter().map(problem).collect();
    assert_eq!(train_set.len(), train.len(), "no problem twice");
    assert!(eval.iter().all(|p| !train_set.contains(problem(p))));
    assert!(train.iter().chain(&eval).all(|p| !p.hackable() && !p.detectable()), "no hack, whatever hack_frac says");
    assert_eq!(env.generate(Split::Eval, 256, 99, 0.5).unwrap(), eval, "a pure function of the seed");
    assert_ne!(env.generate(Split::Eval, 256, 100, 0.5).unwrap(), eval);
}

#[test]
fn snapshot_of_prompts_and_judgements() {
    let env = math();
    let prompts: Vec<String> = env.generate(Split::Train, 12, 1, 0.5).unwrap().iter().map(|p| format!("{} => {}", problem(p), p.metadata["answer"])).collect();
    let prompt = env.prompt("Tom has 3 apples and buys 4 more. How many apples does Tom have?", "7");
    let completions = ["\\boxed{7}", "7", "\\boxed{7.0}", "\\boxed{\\$7}", "\\boxed{8}", "}{\\boxed{7}", ""];
    let judgements: Vec<String> = completions
        .iter()
        .map(|completion| {
            let sample = prompt.sample(completion);
            let judgement = env.judge(&sample);
            format!("{:?} {:?} {completion:?}", judgement.components, judgement.metrics)
        })
        .collect();
    insta::with_settings!({ snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"), prepend_module_to_snapshot => false }, {
        insta::assert_yaml_snapshot!("train_prompts_seed_1", prompts);
        insta::assert_yaml_snapshot!("judgements", judgements);
    });
}


/// GSM8K rows as the host passes them for `dataset` (an hf-dataset parameter).
fn gsm8k_params(train: usize, test: usize) -> String {
    let row = |split: &str, i: usize| serde_json::json!({"question": format!("{split} problem {i}?"), "answer": format!("Work {i}.\n#### {},{:03}", i + 1, i)});
    let rows = |split: &str, n: usize| (0..n).map(|i| row(split, i)).collect::<Vec<_>>();
    serde_json::json!({"fewshot": false, "dataset": {"repo": "openai/gsm8k", "config": "main", "splits": {"train": rows("train", train), "test": rows("test", test)}}}).to_string()
}

/// With a dataset, prompts are its problems: train prompts from `train`, evaluation prompts from
/// `test`, the final answer after `####` without its thousands comma, `count` of them in a
/// seeded order (a permutation: no repeats), and more than a split holds is an error.
#[test]
fn gsm8k_problems_come_from_the_dataset_splits() {
    let env = configure::<Math>(&gsm8k_params(30, 10)).unwrap();
    let train = env.generate(Split::Train, 30, 5, 0.5).unwrap();
    let questions: std::collections::BTreeSet<String> = train.iter().map(|p| p.content_text().to_string()).collect();
    let all_train: std::collections::BTreeSet<String> = (0..30).map(|i| format!("train problem {i}?{QUESTION_SUFFIX}")).collect();
    assert_eq!(questions, all_train, "all 30 train problems once each");
    for prompt in &train {
        let i: usize = prompt.content_text().trim_start_matches("train problem ").split('?').next().unwrap().parse().unwrap();
        assert_eq!(prompt.metadata["answer"], serde_json::json!(format!("{}{:03}", i + 1, i)), "{i}: `#### 1,000` is 1000");
        assert!(!prompt.hackable() && !prompt.detectable());
    }
    let again = env.generate(Split::Train, 30, 5, 0.5).unwrap();
    assert_eq!(train.iter().map(|p| p.content_text()).collect::<Vec<_>>(), again.iter().map(|p| p.content_text()).collect::<Vec<_>>(), "the same seed, the same order");
    let other_seed = env.generate(Split::Train, 30, 6, 0.5).unwrap();
    assert_ne!(train.iter().map(|p| p.content_text()).collect::<Vec<_>>(), other_seed.iter().map(|p| p.content_text()).collect::<Vec<_>>());
    let eval = env.generate(Split::Eval, 4, 99, 0.5).unwrap();
    assert!(eval.iter().all(|p| p.content_text().starts_with("test problem ")), "evaluation prompts from the test split");
    let too_many = env.generate(Split::Eval, 11, 99, 0.5).unwrap_err();
    assert!(too_many.contains("10 problems in its test split, 11 were asked for"), "{too_many}");
}

#[test]
fn a_gsm8k_row_without_its_final_answer_or_a_split_is_refused_at_configure() {
    let mut broken: serde_json::Value = serde_json::from_str(&gsm8k_params(3, 2)).unwrap();
    broken["dataset"]["splits"]["train"][1]["answer"] = "no final answer".into();
    let error = configure::<Math>(&broken.to_string()).err().unwrap();
    assert!(error.contains("train row 1") && error.contains("####"), "{error}");
    let mut no_test: serde_json::Value = serde_json::from_str(&gsm8k_params(3, 2)).unwrap();
    no_test["dataset"]["splits"].as_object_mut().unwrap().remove("test");
    let error = configure::<Math>(&no_test.to_string()).err().unwrap();
    assert!(error.contains("no split `test`"), "{error}");
    let unread = configure::<Math>(r#"{"dataset": "openai/gsm8k:main"}"#).err().unwrap();
    assert!(unread.contains("hf-dataset"), "{unread}");
}
