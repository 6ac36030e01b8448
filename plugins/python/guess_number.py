"""The `guess_number` episode environment in Python: a port of plugins/guess_number (the same
prompts from the same seed, the same observations and ends turn for turn; specified in
docs/src/environments.md, "Multi-turn episodes"), held to it by tests/plugins_python_episodes.rs.
Build: smallrl plugin build plugins/python/guess_number.py

A word is a run of characters that Python's ``str.isalnum`` (``number_word``) or ``str.isalpha``
(``word_length``) accepts, where Rust asks ``char::is_alphanumeric`` / ``is_alphabetic``: the two
agree on letters and digits of every script, and differ only on a few marks (a combining vowel
sign is alphabetic to Rust, not to Python).
"""

import json

import smallrl

# The number words `guess: number_word` reads, "one" (1) to "twenty" (20).
NUMBER_WORDS = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
    "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
]
GUESSES = ("integer", "number_word", "word_length")


def first_number_word(text):
    """The offset and value of the first number word of `text` (a whole word, ASCII case
    ignored), or None."""
    start = None
    for i, c in enumerate(text + " "):
        if c.isalnum() and i < len(text):
            start = i if start is None else start
        elif start is not None:
            word = text[start:i]
            if word.isascii() and word.lower() in NUMBER_WORDS:
                return start, NUMBER_WORDS.index(word.lower()) + 1
            start = None
    return None


def first_integer(text):
    """The offset and value of the first integer of `text` (as :func:`smallrl.ints` reads it)."""
    at = next((i for i, c in enumerate(text) if "0" <= c <= "9"), None)
    return None if at is None else (at, smallrl.ints(text)[0])


class GuessNumber(smallrl.EpisodeEnvironment):
    name = "guess_number"
    version = "0.1.0"
    description = "Multi-turn: guess a secret number from 1 to max_number, told higher or lower after each guess"
    params = [
        smallrl.integer("max_number", 16, "the secret is uniform in 1..=max_number (2 to 1,000,000)", minimum=1),
        smallrl.string(
            "guess",
            "integer",
            "how a turn's guess is read: integer (its first integer), number_word (its first integer or number word one to twenty) or word_length (its first word's letter count)",
        ),
    ]
    components = [
        smallrl.retain("solved", "1 when a guess hit the secret"),
        smallrl.retain("closeness", "1 - |last guess - secret| / (max_number - 1); 0 without a guess"),
    ]
    metrics = ["turns", "malformed"]

    def configure(self, params):
        if not 2 <= params["max_number"] <= 1_000_000:
            raise ValueError(f"max_number must be in 2..=1000000, got {params['max_number']}")
        if params["guess"] not in GUESSES:
            raise ValueError(f"guess must be integer, number_word or word_length, got {json.dumps(params['guess'])}")

    def prompt(self, game, secret):
        text = f"Game {game}. I am thinking of a number from 1 to {self.params['max_number']}. Guess it: answer with one number. I will say higher or lower."
        return smallrl.Prompt.text(text, False, False, secret=secret)

    def guess(self, text):
        """A turn's guess, read as the `guess` parameter says (None: a malformed turn)."""
        how = self.params["guess"]
        if how == "integer":
            found = first_integer(text)
            return None if found is None else found[1]
        if how == "number_word":
            found = [f for f in (first_integer(text), first_number_word(text)) if f is not None]
            return min(found)[1] if found else None
        word = next((w for w in "".join(c if c.isalpha() else " " for c in text).split(" ") if w), None)
        return None if word is None else len(word)

    def generate(self, split, count, seed, hack_frac):
        rng = smallrl.split_rng(self.name, split, seed)
        seen = set()

        def draw(kept):
            game = rng.range(0, 999_999)
            secret = rng.range(1, self.params["max_number"])
            if smallrl.in_eval_split(f"game {game}") != (split == "eval") or game in seen:
                return None
            seen.add(game)
            return self.prompt(game, secret)

        return smallrl.draw_prompts(count, "games", draw)

    def start(self, prompt):
        secret = prompt.metadata.get("secret")
        if isinstance(secret, bool) or not isinstance(secret, int) or secret < 0:
            raise ValueError("the prompt's metadata has no integer `secret`")
        return {"secret": secret, "turns": 0, "malformed": 0, "last_guess": None}

    def end(self, game, solved):
        closeness = 0.0
        if game["last_guess"] is not None:
            distance = float(abs(game["last_guess"] - game["secret"]))
            closeness = min(max(1.0 - distance / float(self.params["max_number"] - 1), 0.0), 1.0)
        return smallrl.EpisodeEnd([1.0 if solved else 0.0, closeness], [float(game["turns"]), float(game["malformed"])])

    def step(self, game, turn, last):
        game["turns"] += 1
        guess = self.guess(turn.completion)
        if guess is None:
            game["malformed"] += 1
            return self.end(game, False) if last else smallrl.Observation.user(f"Answer with one number from 1 to {self.params['max_number']}.")
        game["last_guess"] = guess
        if guess == game["secret"]:
            return self.end(game, True)
        if last:
            return self.end(game, False)
        return smallrl.Observation.user("higher" if guess < game["secret"] else "lower")
