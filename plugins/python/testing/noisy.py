"""A Python reward that calls `random` and `time` (tests/plugins_python.rs): deterministic in
smallrl's sandbox, so two runs of one config, and a resumed run, score alike."""

import random
import time

import smallrl


@smallrl.reward(name="noisy", version="0.1.0", description="0.5 * random.random() plus a clock reading that is fixed in the sandbox")
def score(sample, params):
    started = time.monotonic()
    noise = random.random()
    elapsed = time.monotonic() - started
    wall = time.time()
    return 0.5 * noise + (wall - 1704067200.0) + min(elapsed, 1.0) * 0.0 + 0.1 * ("happy" in sample.completion)
