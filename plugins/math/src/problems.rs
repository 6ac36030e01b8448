//! GSM8K-style word problems: templates whose numbers are drawn from a seeded generator and
//! whose answer is computed from them (two to three arithmetic steps, a non-negative integer).

use smallrl_plugin_sdk::environment::SplitMix64;

/// Names and their subject pronouns.
const PEOPLE: [(&str, &str); 16] = [
    ("Maria", "she"),
    ("James", "he"),
    ("Aisha", "she"),
    ("Tom", "he"),
    ("Lena", "she"),
    ("Ravi", "he"),
    ("Sofia", "she"),
    ("Omar", "he"),
    ("Emma", "she"),
    ("Lucas", "he"),
    ("Mei", "she"),
    ("Diego", "he"),
    ("Hannah", "she"),
    ("Kofi", "he"),
    ("Nina", "she"),
    ("Sam", "he"),
];

/// The templates, by name (one is drawn uniformly per problem).
pub const TEMPLATES: [&str; 12] = [
    "apples", "muffins", "wages", "classes", "pages", "legs", "change", "train", "marbles", "boxes", "savings", "packs",
];

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// One problem (text, answer) of template `index`.
pub fn of_template(index: usize, rng: &mut SplitMix64) -> (String, u64) {
    let (name, pronoun) = PEOPLE[rng.range(0, PEOPLE.len() as u64 - 1) as usize];
    let he = capitalised(pronoun);
    let mut n = |low: u64, high: u64| rng.range(low, high);
    match TEMPLATES[index] {
        "apples" => {
            let (a, b, c) = (n(2, 40), n(2, 9), n(3, 12));
            (format!("{name} has {a} apples. {he} buys {b} bags with {c} apples in each bag. How many apples does {name} have now?"), a + b * c)
        }
        "muffins" => {
            let (a, d) = (n(12, 60), n(2, 7));
            let sold = n(1, a * d - 1);
            (format!("A bakery makes {a} muffins every day for {d} days and sells {sold} of them. How many muffins are left?"), a * d - sold)
        }
        "wages" => {
            let (w, h, k) = (n(8, 30), n(5, 40), n(2, 6));
            (format!("{name} earns ${w} an hour and works {h} hours each week. How many dollars does {name} earn in {k} weeks?"), w * h * k)
        }
        "classes" => {
            let (c, s) = (n(3, 12), n(15, 32));
            let absent = n(1, c * s / 4);
            (format!("A school has {c} classes with {s} students in each class. {absent} students are absent today. How many students are at school today?"), c * s - absent)
        }
        "pages" => {
            let (p, d) = (n(5, 40), n(3, 20));
            (format!("{name} reads {p} pages every day. {he} finishes a book of {} pages. How many days does it take?", p * d), d)
        }
        "legs" => {
            let (cows, hens) = (n(2, 30), n(2, 50));
            (format!("A farmer has {cows} cows and {hens} chickens. How many legs do the animals have altogether?"), 4 * cows + 2 * hens)
        }
        "change" => {
            let (count, price, pen) = (n(2, 8), n(2, 9), n(1, 6));
            let total = count * price + pen;
            let bill = [20, 50, 100].into_iter().find(|&bill| bill >= total).expect("at most 8 * 9 + 6 = 78 dollars");
            (
                format!("{name} buys {count} notebooks that cost ${price} each and a pen that costs ${pen}. {he} pays with a ${bill} bill. How many dollars of change does {name} get?"),
                bill - total,
            )
        }
        "train" => {
            let (v, h, u, k) = (n(30, 90), n(2, 6), n(20, 80), n(2, 5));
            (
                format!("A train travels at {v} miles per hour for {h} hours and then at {u} miles per hour for {k} hours. How many miles does it travel in total?"),
                v * h + u * k,
            )
        }
        "marbles" => {
            let (friends, each) = (n(2, 8), n(2, 12));
            let left = n(0, 30);
            let start = friends * each + left;
            (format!("{name} has {start} marbles. {he} gives {each} marbles to each of {friends} friends. How many marbles does {name} have left?"), left)
        }
        "boxes" => {
            let (b, r, g) = (n(2, 15), n(2, 20), n(2, 20));
            (format!("There are {b} boxes. Each box holds {r} red balls and {g} green balls. How many balls are in all the boxes?"), b * (r + g))
        }
        "savings" => {
            let (s, w) = (n(5, 50), n(2, 30));
            (format!("{name} saves ${s} every week. How many weeks does it take {name} to save ${}?", s * w), w)
        }
        "packs" => {
            let (per, students, pack) = (n(2, 6), n(10, 35), n(6, 12));
            let needed = per * students;
            (
                format!("Pencils come in packs of {pack}. {name} needs {per} pencils for each of {students} students. How many packs must {name} buy?"),
                needed.div_ceil(pack),
            )
        }
        other => unreachable!("template {other} has no text"),
    }
}

/// A problem of a uniformly drawn template.
pub fn draw(rng: &mut SplitMix64) -> (String, u64) {
    let index = rng.range(0, TEMPLATES.len() as u64 - 1) as usize;
    of_template(index, rng)
}
