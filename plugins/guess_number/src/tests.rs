//! Native tests of guess_number: episodes played by hand, with hand-computed ends.

use smallrl_plugin_sdk::{EpisodeEnd, Episodes, Judgement, Sample, Split, Step, Turn, configure};

use super::GuessNumber;

fn turn(text: &str) -> Turn {
    Turn { sample: Sample::new("", text, &[text], &[0], true), calls: None }
}

fn end(solved: f64, closeness: f64, turns: f64, malformed: f64) -> Step {
    Step::End(EpisodeEnd { judgement: Judgement { components: vec![solved, closeness], metrics: vec![turns, malformed] }, monitor: false, ground_truth: false })
}

#[test]
fn an_episode_by_halving() {
    let env = configure::<GuessNumber>("{}").unwrap();
    let mut episodes = Episodes::default();
    episodes.start(&env, 7, &env.prompt(12, 11)).unwrap();
    assert_eq!(episodes.step(&env, 7, &turn("I guess 8"), false).unwrap(), Step::user("higher"));
    assert_eq!(episodes.step(&env, 7, &turn("maybe"), false).unwrap(), Step::user("Answer with one number from 1 to 16."));
    assert_eq!(episodes.step(&env, 7, &turn("12 or 13"), false).unwrap(), Step::user("lower"));
    assert_eq!(episodes.step(&env, 7, &turn("11"), false).unwrap(), end(1.0, 1.0, 4.0, 1.0));
    assert_eq!(episodes.in_flight(), 0);
    assert!(episodes.step(&env, 7, &turn("11"), false).unwrap_err().contains("never started"));
}

#[test]
fn the_last_turn_ends_the_episode() {
    let env = configure::<GuessNumber>(r#"{"max_number": 11}"#).unwrap();
    let mut episodes = Episodes::default();
    episodes.start(&env, 1, &env.prompt(3, 2)).unwrap();
    assert!(episodes.start(&env, 1, &env.prompt(3, 2)).unwrap_err().contains("already in flight"));
    // |7 - 2| / (11 - 1) = 0.5 from the end.
    assert_eq!(episodes.step(&env, 1, &turn("7"), true).unwrap(), end(0.0, 0.5, 1.0, 0.0));
    episodes.start(&env, 2, &env.prompt(3, 2)).unwrap();
    assert_eq!(episodes.step(&env, 2, &turn("no idea"), true).unwrap(), end(0.0, 0.0, 1.0, 1.0));
}

#[test]
fn prompts_are_deterministic_and_the_splits_apart() {
    let env = configure::<GuessNumber>("{}").unwrap();
    let train = smallrl_plugin_sdk::EpisodeEnvironment::generate(&env, Split::Train, 50, 3, 0.0).unwrap();
    assert_eq!(train, smallrl_plugin_sdk::EpisodeEnvironment::generate(&env, Split::Train, 50, 3, 0.0).unwrap());
    let eval = smallrl_plugin_sdk::EpisodeEnvironment::generate(&env, Split::Eval, 50, 3, 0.0).unwrap();
    let texts: std::collections::BTreeSet<&str> = train.iter().map(|p| p.content_text()).collect();
    assert_eq!(texts.len(), 50);
    assert!(eval.iter().all(|p| !texts.contains(p.content_text())));
    assert!(train.iter().all(|p| (1..=16).contains(&p.metadata["secret"].as_u64().unwrap()) && !p.hackable() && !p.detectable()));
    assert!(configure::<GuessNumber>(r#"{"max_number": 1}"#).is_err());
}

/// With `guess: number_word`, the first integer or number word of a turn is its guess ("One"
/// is 1, "twenty" 20, "someone" no word); with `word_length` the first word's letter count;
/// by default number words are not guesses.
#[test]
fn guesses_are_read_as_asked() {
    let words = configure::<GuessNumber>(r#"{"guess": "number_word"}"#).unwrap();
    assert_eq!(words.guess("One day, 3 cats"), Some(1));
    assert_eq!(words.guess("I see 3, then two"), Some(3));
    assert_eq!(words.guess("twenty"), Some(20));
    assert_eq!(words.guess("someone stone"), None);
    assert_eq!(words.guess("and -5 or four"), Some(-5));
    let plain = configure::<GuessNumber>("{}").unwrap();
    assert_eq!(plain.guess("One day"), None);
    let mut episodes = Episodes::default();
    episodes.start(&words, 3, &words.prompt(1, 2)).unwrap();
    assert_eq!(episodes.step(&words, 3, &turn("one day"), false).unwrap(), Step::user("higher"));
    assert_eq!(episodes.step(&words, 3, &turn("the two"), false).unwrap(), end(1.0, 1.0, 2.0, 0.0));
    let lengths = configure::<GuessNumber>(r#"{"guess": "word_length", "max_number": 4}"#).unwrap();
    assert_eq!(lengths.guess(", rosa felt 12"), Some(4));
    assert_eq!(lengths.guess("7 ..."), None);
    episodes.start(&lengths, 4, &lengths.prompt(1, 3)).unwrap();
    assert_eq!(episodes.step(&lengths, 4, &turn("rosa"), false).unwrap(), Step::user("lower"));
    // |2 - 3| / (4 - 1) from the end.
    assert_eq!(episodes.step(&lengths, 4, &turn("he ran"), true).unwrap(), end(0.0, 1.0 - 1.0 / 3.0, 2.0, 0.0));
    assert!(configure::<GuessNumber>(r#"{"guess": "vibes"}"#).err().expect("refused").contains("integer, number_word or word_length"));
}
