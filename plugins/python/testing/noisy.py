"""A Python reward that calls `random` and `time` (tests/plugins_python.rs): deterministic in
smallrl's sandbox, so two runs of one config, and a resumed run, score alike."""

import random
import time

import smallrl


@smallrl.reward(name="noisy", version="0.1.0", description="0.5 * random.random() plus a clock reading that is fixed in the sandbox")
def score(sample, params):
    # In the sandbox time.time() is fixed at 1704067200.0, so the clock term is 0; on a real
    # clock it would be years of seconds and the tests' bound on the scores would fail.
    return 0.5 * random.random() + (time.time() - 1704067200.0) + 0.1 * ("happy" in sample.completion)
