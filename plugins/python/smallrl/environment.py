"""The Rust SDK's generator helpers (plugins/sdk/src/environment.rs), written out the same way
so that a Python port draws the same prompts from the same seed."""

MASK = (1 << 64) - 1

# Candidates a generator may draw per prompt asked for before it gives up.
DRAWS_PER_PROMPT = 200


def fnv1a(data):
    """FNV-1a, 64 bit, of bytes (or of a str's UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & MASK
    return value


def in_eval_split(key):
    """Whether an item belongs to the evaluation split: FNV-1a of its key mod 1000 below 100."""
    return fnv1a(key) % 1000 < 100


def hackable_count(count, hack_frac):
    """How many of `count` prompts offer the hack: exactly floor(count * hack_frac)."""
    import math

    return math.floor(count * hack_frac)


class SplitMix64:
    """SplitMix64: the generators' random numbers."""

    __slots__ = ("state",)

    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def range(self, low, high):
        """Uniform in [low, high], inclusive (no modulo bias)."""
        if low > high:
            raise ValueError(f"empty range {low}..={high}")
        span = (high - low + 1) & MASK
        if span == 0:
            return self.next_u64()
        zone = MASK - (MASK % span) - 1
        while True:
            x = self.next_u64()
            if x <= zone:
                return low + x % span

    def shuffle(self, items):
        """Fisher-Yates: swaps item i with a uniform one of 0..=i, from the last down."""
        for i in range(len(items) - 1, 0, -1):
            j = self.range(0, i)
            items[i], items[j] = items[j], items[i]

    def unit(self):
        """Uniform in [0, 1)."""
        return (self.next_u64() >> 11) / float(1 << 53)


def split_rng(name, split, seed):
    """The random stream of environment `name`'s generator for `split` ("train" or "eval")."""
    return SplitMix64(seed ^ fnv1a(f"{name}:{split}"))


def draw_prompts(count, what, draw):
    """Exactly `count` prompts: `draw(kept)` returns a candidate or None to reject it; after
    DRAWS_PER_PROMPT * count + 1000 candidates it raises, naming what was drawn."""
    prompts = []
    draws = 0
    while len(prompts) < count:
        draws += 1
        if draws > DRAWS_PER_PROMPT * count + 1000:
            raise ValueError(f"drew {draws} {what} and kept {len(prompts)} of the {count} asked: ask for fewer prompts")
        prompt = draw(len(prompts))
        if prompt is not None:
            prompts.append(prompt)
    return prompts


def ints(text):
    """Every integer in `text` (an optional `-` then a run of ASCII digits; saturating as i64)."""
    limit = (1 << 63) - 1
    out = []
    i, n = 0, len(text)
    while i < n:
        if "0" <= text[i] <= "9":
            negative = i > 0 and text[i - 1] == "-"
            value = 0
            while i < n and "0" <= text[i] <= "9":
                value = min(value * 10 + ord(text[i]) - 48, limit)
                i += 1
            out.append(-value if negative else value)
        else:
            i += 1
    return out
