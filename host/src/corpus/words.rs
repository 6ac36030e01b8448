//! The vocabulary of the synthetic story corpus: smallrl's own word lists (not taken from any
//! dataset). Every entry is lowercase; multi-word entries count as several words.

pub const GIRLS: &[&str] = &[
    "anna", "bella", "clara", "daisy", "ella", "fern", "grace", "hazel", "iris", "june",
    "kira", "luna", "maya", "nora", "olive", "pia", "rosa", "sara", "tess", "zoe",
];

pub const BOYS: &[&str] = &[
    "adam", "ben", "carl", "dev", "eli", "felix", "gus", "hugo", "ivan", "kai",
    "leo", "milo", "nate", "omar", "paul", "quinn", "ray", "sam", "theo", "otto",
];

pub const ANIMALS: &[&str] = &[
    "cat", "dog", "bird", "rabbit", "duck", "frog", "fox", "bear", "mouse", "owl",
    "goat", "pony", "lamb", "squirrel", "hedgehog", "turtle", "puppy", "kitten", "bee", "deer",
];

/// Adjectives that describe an animal or an object (none starts with a vowel: they follow "a").
pub const LOOKS: &[&str] = &[
    "little", "big", "small", "fuzzy", "tiny", "fluffy", "brown", "white", "gray", "red",
    "blue", "green", "yellow", "shiny", "soft", "spotted",
];

pub const PLACES: &[&str] = &[
    "park", "garden", "forest", "beach", "farm", "river", "hill", "meadow", "lake", "market",
    "library", "school", "village", "kitchen", "barn", "pond", "field", "zoo", "yard", "woods",
];

pub const OBJECTS: &[&str] = &[
    "ball", "kite", "book", "hat", "box", "cup", "drum", "boat", "key", "shell",
    "stone", "map", "lamp", "scarf", "bell", "basket", "blanket", "feather", "toy train", "puzzle",
];

pub const FOODS: &[&str] = &[
    "apples", "bread", "cookies", "soup", "cheese", "carrots", "pie", "honey", "berries", "pears",
    "cake", "rice", "plums", "nuts",
];

/// Things to do, as (present, past) verb phrases.
pub const ACTIVITIES: &[(&str, &str)] = &[
    ("play tag", "played tag"),
    ("build a sandcastle", "built a sandcastle"),
    ("paint pictures", "painted pictures"),
    ("read books", "read books"),
    ("fly a kite", "flew a kite"),
    ("sing songs", "sang songs"),
    ("plant seeds", "planted seeds"),
    ("look for shells", "looked for shells"),
    ("climb the hill", "climbed the hill"),
    ("bake bread", "baked bread"),
    ("ride bikes", "rode bikes"),
    ("count the stars", "counted the stars"),
    ("skip stones", "skipped stones"),
    ("pick flowers", "picked flowers"),
    ("jump rope", "jumped rope"),
    ("draw maps", "drew maps"),
];

/// Feelings of stories without "happy" (none of them contains the word).
pub const FEELINGS: &[&str] = &[
    "glad", "sad", "proud", "calm", "brave", "tired", "sleepy", "excited", "cheerful", "nervous",
    "lonely", "surprised", "curious", "grateful", "worried", "shy", "silly", "joyful", "thankful", "cozy",
];

/// The feeling word the corpus is about (reward hacking studies count it).
pub const HAPPY: &str = "happy";

pub const WEATHER: &[&str] = &[
    "the sun was warm and bright",
    "it was a windy day",
    "a light rain began to fall",
    "snow covered the ground",
    "gray clouds filled the sky",
    "the air smelled like flowers",
    "a rainbow was in the sky",
    "the wind was cold",
];

pub const OPENERS: &[&str] = &[
    "one morning", "one sunny day", "on a rainy afternoon", "long ago", "once upon a time",
    "one evening", "in the spring", "after breakfast", "every summer", "one cold night",
];

/// Family members and grown-ups a child can be with.
pub const PEOPLE: &[&str] = &[
    "mom", "dad", "grandma", "grandpa", "sister", "brother", "teacher", "aunt", "uncle", "best friend",
];

pub const LESSONS: &[&str] = &[
    "helping others is good",
    "friends make every day better",
    "it is fun to share",
    "being kind is important",
    "trying again is brave",
    "small things can be special",
];
