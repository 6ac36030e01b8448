//! The phrases to repeat: lowercase English phrases of 2 to 12 words without final punctuation,
//! written by a small grammar (the original draws sentences from the Pile; this replacement is
//! self-contained and gives thousands of distinct phrases of every length). A phrase of n words
//! is a subject, a verb and tails (prepositional phrases, adverbs) that fill it to exactly n.

use smallrl_plugin_sdk::environment::SplitMix64;

const NOUNS: &[&str] = &[
    "river", "garden", "window", "teacher", "farmer", "kitten", "lantern", "bridge", "market", "sailor", "forest", "village",
    "doctor", "baker", "painter", "mountain", "library", "station", "meadow", "harbor", "candle", "letter", "basket", "orchard",
    "kitchen", "castle", "valley", "island", "engine", "blanket", "pianist", "soldier", "neighbor", "gardener", "rabbit", "pilot",
    "cottage", "fountain", "journal", "ladder", "mirror", "pebble", "rocket", "shepherd", "violin", "wagon", "whistle", "tailor",
    "lighthouse", "carpenter", "stranger", "student", "puppy", "barn", "tower", "canyon", "desert", "pond", "cabin", "clock",
];
const ADJECTIVES: &[&str] = &[
    "quiet", "old", "young", "small", "bright", "tired", "happy", "brave", "gentle", "curious", "busy", "lonely", "careful",
    "clever", "sleepy", "friendly", "distant", "narrow", "golden", "silver", "wooden", "ancient", "quick", "patient", "noisy",
    "proud", "humble", "shy", "cheerful", "serious", "polite", "sturdy", "dusty", "muddy", "warm", "cold", "hidden", "empty",
    "crowded", "peaceful",
];
const VERBS: &[&str] = &[
    "waited", "walked", "sang", "rested", "listened", "worked", "laughed", "wandered", "slept", "stayed", "danced", "paused",
    "smiled", "watched", "played", "whispered", "returned", "climbed", "drifted", "shivered", "glowed", "hummed", "waved",
    "knocked", "settled", "lingered", "trembled", "shouted", "sighed", "travelled", "appeared", "vanished", "arrived",
    "listened closely", "looked around",
];
const PREPOSITIONS: &[&str] = &["near", "by", "under", "behind", "beside", "across", "inside", "beyond", "above", "around", "past", "toward"];
const ADVERBS: &[&str] = &[
    "slowly", "quietly", "again", "today", "gladly", "softly", "early", "later", "alone", "together", "outside", "nearby",
    "forever", "briefly", "calmly", "happily", "silently", "suddenly", "yesterday", "tonight",
];
/// The shortest and longest phrase, in words.
pub const MIN_WORDS: u64 = 2;
pub const MAX_WORDS: u64 = 12;

fn pick<'a>(rng: &mut SplitMix64, words: &[&'a str]) -> &'a str {
    words[rng.range(0, words.len() as u64 - 1) as usize]
}

/// A phrase of exactly `n` words (2..=12).
pub fn phrase(rng: &mut SplitMix64, n: u64) -> String {
    assert!((MIN_WORDS..=MAX_WORDS).contains(&n), "phrases have 2 to 12 words, asked {n}");
    let mut words: Vec<String> = Vec::new();
    if n == 2 {
        return format!("{} {}", pick(rng, ADJECTIVES), pick(rng, NOUNS));
    }
    // Subject: "the noun" or "the adjective noun" (3 words, when it leaves room for the verb).
    let adjective = (n >= 4 && rng.range(0, 1) == 1).then(|| pick(rng, ADJECTIVES));
    let noun = pick(rng, NOUNS);
    let next = adjective.unwrap_or(noun);
    let article = match rng.range(0, 3) {
        0 if next.starts_with(['a', 'e', 'i', 'o', 'u']) => "an",
        0 => "a",
        _ => "the",
    };
    words.push(article.into());
    words.extend(adjective.map(str::to_string));
    words.push(noun.into());
    // The verb: one word, or two when the two-word forms fit.
    let verb = loop {
        let verb = pick(rng, VERBS);
        if words.len() + verb.split(' ').count() <= n as usize {
            break verb;
        }
    };
    words.extend(verb.split(' ').map(str::to_string));
    // Tails until exactly n words: a prepositional phrase (3), an adverb (1).
    while words.len() < n as usize {
        let left = n as usize - words.len();
        match left {
            1 | 2 => words.push(pick(rng, ADVERBS).into()),
            _ if rng.range(0, 2) > 0 => {
                words.push(pick(rng, PREPOSITIONS).into());
                words.push("the".into());
                words.push(pick(rng, NOUNS).into());
            }
            _ => words.push(pick(rng, ADVERBS).into()),
        }
    }
    words.join(" ")
}
