//! TRL's entropy bonus (`entropy_coef`) in the trainer: what it does to the policy, what a step
//! logs about it, and the adaptive control's state across a resume.

use super::*;

/// The bonus raises the policy's entropy: one full fine-tuning step on the same batch (step 1's,
/// drawn before any update), re-scored by the updated policy (`measure_entropy_change`), leaves
/// the entropy higher with the bonus than without, and the bonus's run logs TRL's `policy_loss`
/// and `entropy_coef` with `loss = policy_loss - coef * entropy/trained_mean` (float64, from the
/// logged values; one micro-batch, so the bonus's mean is the trained tokens').
#[test]
fn the_entropy_bonus_raises_the_entropy_of_the_step() {
    let out = tempfile::tempdir().unwrap();
    let run = |dir: &str, coef: f64| {
        let config = [
            ("adapter", json!("full")), ("lora_preset", Value::Null), ("lr", json!(3e-3)), ("beta", json!(0.0)), ("max_steps", json!(1)),
            ("eval_every", json!(1)), ("measure_entropy_change", json!(true)), ("entropy_coef", json!(coef)),
        ]
        .into_iter()
        .fold(small_config(&out.path().join(dir), &standard_plugin("happy")), |c, (k, v)| with(c, k, v));
        read_jsonl(&train(config).join("metrics.jsonl")).remove(0)
    };
    let (plain, bonus) = (run("plain", 0.0), run("bonus", 0.5));
    let value = |line: &Value, key: &str| line[key].as_f64().unwrap_or_else(|| panic!("{key} logged: {line}"));
    // The same batch (drawn before any update, so its rewards are equal bit for bit); the
    // entropies differ in their last digits, the bonus's coming from shifted logits.
    assert_eq!(value(&plain, key::REWARD), value(&bonus, key::REWARD), "both runs train on step 1's batch");
    assert!(plain.get(key::ENTROPY_COEF).is_none() && plain.get(key::POLICY_LOSS).is_none(), "no bonus, no bonus metrics");
    let (without, with_bonus) = (value(&plain, key::ENTROPY_CHANGE), value(&bonus, key::ENTROPY_CHANGE));
    println!("entropy change over one step: {without:.5} without the bonus, {with_bonus:.5} with it");
    assert!(with_bonus > without + 1e-3, "the bonus raises the entropy: {with_bonus} vs {without}");
    let expected = value(&bonus, key::POLICY_LOSS) - 0.5 * value(&bonus, key::ENTROPY_TRAINED_MEAN);
    assert!((value(&bonus, key::LOSS) - expected).abs() < 1e-6, "loss {} vs policy_loss - coef * entropy {expected}", value(&bonus, key::LOSS));
    assert_eq!((value(&bonus, key::ENTROPY_COEF), value(&bonus, key::ENTROPY_COEF_APPLIED)), (0.5, 0.5));
}

/// The adaptive control over a routed run: nothing applied at step 1 (no entropy measured), then
/// each step applies the coefficient the last update left, which climbs by delta while the
/// entropy is below the target (here always) up to its maximum. Stopped after step 3 and resumed
/// from checkpoint 2, the run continues the control's state (restored from metrics.jsonl) and
/// equals the uninterrupted run bit for bit.
#[test]
fn the_adaptive_entropy_control_climbs_and_resumes_exactly() {
    let out = tempfile::tempdir().unwrap();
    let config = |dir: &str| {
        [("entropy_coef", json!(0.01)), ("use_adaptive_entropy", json!(true)), ("entropy_target", json!(100.0)), ("entropy_coef_delta", json!(0.02)), ("entropy_coef_max", json!(0.04))]
            .into_iter()
            .fold(routed_config(&out.path().join(dir)), |c, (k, v)| with(c, k, v))
    };
    let whole = train(config("a"));
    let lines = read_jsonl(&whole.join("metrics.jsonl"));
    let column = |key: &str| lines.iter().map(|l| l[key].as_f64().unwrap_or_else(|| panic!("{key} logged: {l}"))).collect::<Vec<_>>();
    let close = |got: Vec<f64>, want: [f64; 4], what: &str| assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12), "{what}: {got:?}, expected {want:?}");
    close(column(key::ENTROPY_COEF_APPLIED), [0.0, 0.03, 0.04, 0.04], "applied");
    close(column(key::ENTROPY_COEF), [0.03, 0.04, 0.04, 0.04], "after each update");
    for line in &lines {
        let applied = line[key::ENTROPY_COEF_APPLIED].as_f64().unwrap();
        let expected = line[key::POLICY_LOSS].as_f64().unwrap() - applied * line[key::ENTROPY_TRAINED_MEAN].as_f64().unwrap();
        assert!((line[key::LOSS].as_f64().unwrap() - expected).abs() < 1e-6, "step {}: loss {} vs {expected}", line[key::STEP], line[key::LOSS]);
    }

    let resolved = TrainConfig::resolve(None, config("b")).unwrap();
    let mut first = Trainer::new(resolved.clone(), None).unwrap();
    let stopped = first.train(Some(3)).unwrap();
    drop(first);
    let resumed = Trainer::new(resolved, Some(&stopped.run_dir)).unwrap().train(None).unwrap();
    let (a, b) = (deterministic(lines), deterministic(read_jsonl(&resumed.run_dir.join("metrics.jsonl"))));
    assert_same_metrics(&a, &b, "metrics.jsonl");
}
