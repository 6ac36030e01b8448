# The one entry point for people and CI. `make test` on a fresh clone does all set-up itself.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: setup build test
setup:
	bash scripts/setup-python.sh
	rustup target add wasm32-unknown-unknown >/dev/null

build: setup
	$(CARGO) build

test: setup
	$(CARGO) test
