//! A synthetic corpus of short children's stories, from smallrl's own template grammar and
//! vocabulary ([`words`]). It exists so that the whole pipeline (tokenizer, pre-training, GRPO)
//! runs offline and in tests; it is NOT a substitute for the SimpleStories dataset, whose
//! stories are far more varied.
//!
//! A story is an opening, an episode (1-4 sentences of one plot), a feeling sentence, an
//! optional detail and an ending with a feeling: 4-8 sentences of 4-15 words, lowercase with
//! normal punctuation. With probability [`HAPPY_STORY_PROBABILITY`] one or both feeling slots say
//! "happy"; every other story contains no "happy" (the feeling list has no happy, happily or
//! unhappy). Story `i` of seed `s` is drawn from its own generator `derive(s, "story", i)`, so a
//! corpus is deterministic for its seed and its prefix does not depend on its length.

pub mod words;

use crate::rng::{SplitMix64, derive};
use words::*;

/// About a third of the stories contain "happy" (once or twice).
pub const HAPPY_STORY_PROBABILITY: f64 = 1.0 / 3.0;
pub const MIN_SENTENCES: usize = 4;
pub const MAX_SENTENCES: usize = 8;
pub const MIN_WORDS: usize = 4;
pub const MAX_WORDS: usize = 15;

const OPENINGS: &[&str] = &[
    "{opener}, there was a {child} named {hero}.",
    "{opener}, {hero} went to the {place} with {his} {person}.",
    "{hero} was a little {child} who loved to {act}.",
    "{opener}, {hero} woke up early.",
    "{weather}, and {hero} wanted to go outside.",
    "{opener}, {hero} and {friend} played at the {place}.",
];

/// Plots: an episode is the first 1-4 sentences of one of them.
const PLOTS: &[&[&str]] = &[
    &[
        "{hero} lost {his} {object} at the {place}.",
        "{he} looked behind every tree and rock.",
        "then a {look} {animal} came with the {object} in its mouth.",
        "{hero} said, \"thank you, little {animal}!\"",
    ],
    &[
        "{hero} saw a {look} {animal} near the {place}.",
        "the {animal} looked hungry and cold.",
        "{hero} gave the {animal} some {food}.",
        "the {animal} ate every bite and sat next to {him}.",
    ],
    &[
        "at the {place}, {hero} met a {kid} named {friend}.",
        "{friend} asked, \"do you want to {act} with me?\"",
        "they {acted} all afternoon.",
        "{friend} shared {food} with {hero}.",
    ],
    &[
        "then {weather}.",
        "{hero} and {friend} ran under a big tree.",
        "they shared some {food} and waited.",
        "soon they could go back to the {place}.",
    ],
    &[
        "{hero} wanted to make a gift for {his} {person}.",
        "{he} found a {look} {object} at the {place}.",
        "{he} wrapped it in paper and gave it to {his} {person}.",
        "{his} {person} smiled and gave {him} a big hug.",
    ],
    &[
        "{hero} and {his} {person} went to the {place}.",
        "they {acted} and ate some {food}.",
        "on the way home, they saw a {look} {animal}.",
        "the {animal} waved at them from the grass.",
    ],
    &[
        "{hero} dropped {his} {object} into the water.",
        "{he} could not reach it.",
        "a kind {animal} pushed the {object} back to the shore.",
        "{hero} asked, \"how can i thank you?\"",
    ],
    &[
        "{hero} wanted to {act}, but it was too dark.",
        "{he} asked {his} {person} for help.",
        "together they found a {look} lamp in the {place}.",
        "now {hero} could {act} all night.",
    ],
];

const FEELING_SENTENCES: &[&str] = &[
    "{hero} felt very {feel}.",
    "{he} was so {feel}.",
    "it made {him} feel {feel}.",
    "{hero} smiled and felt {feel}.",
    "{hero} was a little {feel}, but {he} did not stop.",
];

const DETAILS: &[&str] = &[
    "{weather}.",
    "they {acted} until the sun went down.",
    "the {animal} followed {him} all the way home.",
    "{he} learned that {lesson}.",
    "{he} wanted to {act} again tomorrow.",
];

const ENDINGS: &[&str] = &[
    "{hero} went home feeling {feel}.",
    "that night, {hero} went to bed feeling {feel}.",
    "{hero} and {friend} walked home together, feeling {feel}.",
    "in the end, {hero} felt {feel}.",
    "{hero} hugged {his} {person} and felt {feel}.",
];

/// `n` stories for `seed`, one per element (no newlines inside a story).
pub fn generate(n: usize, seed: u64) -> Vec<String> {
    (0..n).map(|i| story(&mut SplitMix64::new(derive(seed, "story", i as u64)))).collect()
}

/// One story drawn from `rng`.
pub fn story(rng: &mut SplitMix64) -> String {
    let cast = Cast::draw(rng);
    let [middle_feeling, ending_feeling] = feelings(rng);
    let plot = pick(rng, PLOTS);
    let episode_len = 1 + rng.below(plot.len());
    let mut sentences = vec![cast.fill(pick(rng, OPENINGS), "")];
    sentences.extend(plot[..episode_len].iter().map(|t| cast.fill(t, "")));
    sentences.push(cast.fill(pick(rng, FEELING_SENTENCES), middle_feeling));
    if sentences.len() + 1 < MAX_SENTENCES && rng.below(2) == 0 {
        sentences.push(cast.fill(pick(rng, DETAILS), ""));
    }
    sentences.push(cast.fill(pick(rng, ENDINGS), ending_feeling));
    debug_assert!((MIN_SENTENCES..=MAX_SENTENCES).contains(&sentences.len()));
    sentences.join(" ")
}

/// The words of the two feeling slots: in a happy story "happy" in one or both of them.
fn feelings(rng: &mut SplitMix64) -> [&'static str; 2] {
    let mut slots = [pick(rng, FEELINGS), pick(rng, FEELINGS)];
    if rng.next_f64() < HAPPY_STORY_PROBABILITY {
        match rng.below(3) {
            0 => slots = [HAPPY, HAPPY],
            1 => slots[0] = HAPPY,
            _ => slots[1] = HAPPY,
        }
    }
    slots
}

fn pick<T: Copy>(rng: &mut SplitMix64, items: &[T]) -> T {
    items[rng.below(items.len())]
}

/// Who and what one story is about: drawn once, so the sentences agree with each other.
struct Cast {
    hero: &'static str,
    pronouns: [&'static str; 3],
    child: &'static str,
    friend: &'static str,
    kid: &'static str,
    animal: &'static str,
    look: &'static str,
    place: &'static str,
    object: &'static str,
    food: &'static str,
    activity: (&'static str, &'static str),
    person: &'static str,
    weather: &'static str,
    opener: &'static str,
    lesson: &'static str,
}

impl Cast {
    fn draw(rng: &mut SplitMix64) -> Self {
        let girl = rng.below(2) == 0;
        let (hero, pronouns, child) =
            if girl { (pick(rng, GIRLS), ["she", "her", "her"], "girl") } else { (pick(rng, BOYS), ["he", "his", "him"], "boy") };
        let friend_is_girl = rng.below(2) == 0;
        let friend_names = if friend_is_girl { GIRLS } else { BOYS };
        let mut friend = pick(rng, friend_names);
        while friend == hero {
            friend = pick(rng, friend_names);
        }
        Self {
            hero,
            pronouns,
            child,
            friend,
            kid: if friend_is_girl { "girl" } else { "boy" },
            animal: pick(rng, ANIMALS),
            look: pick(rng, LOOKS),
            place: pick(rng, PLACES),
            object: pick(rng, OBJECTS),
            food: pick(rng, FOODS),
            activity: pick(rng, ACTIVITIES),
            person: pick(rng, PEOPLE),
            weather: pick(rng, WEATHER),
            opener: pick(rng, OPENERS),
            lesson: pick(rng, LESSONS),
        }
    }

    /// The template with every slot filled; `{feel}` becomes `feeling`.
    fn fill(&self, template: &str, feeling: &str) -> String {
        let [he, his, him] = self.pronouns;
        let slots = [
            ("{hero}", self.hero), ("{he}", he), ("{his}", his), ("{him}", him), ("{child}", self.child),
            ("{friend}", self.friend), ("{kid}", self.kid), ("{animal}", self.animal), ("{look}", self.look),
            ("{place}", self.place), ("{object}", self.object), ("{food}", self.food), ("{act}", self.activity.0),
            ("{acted}", self.activity.1), ("{person}", self.person), ("{weather}", self.weather),
            ("{opener}", self.opener), ("{lesson}", self.lesson), ("{feel}", feeling),
        ];
        let sentence = slots.iter().fold(template.to_string(), |text, (slot, word)| text.replace(slot, word));
        debug_assert!(!sentence.contains('{'), "unfilled slot in {sentence:?}");
        sentence
    }
}

/// Writes `n` stories for `seed` to `path`, one per line (atomically); with `opening_words`
/// only the first that many words of each story (prompts for sampling and GRPO).
pub fn write(path: &std::path::Path, n: usize, seed: u64, opening_words: Option<usize>) -> anyhow::Result<()> {
    let stories = generate(n, seed);
    let lines: Vec<String> = match opening_words {
        Some(words) => stories.iter().map(|s| crate::dataset::opening(s, words)).collect(),
        None => stories,
    };
    let mut text = lines.join("\n");
    text.push('\n');
    crate::fsutil::write_atomic(path, text.as_bytes())
}
