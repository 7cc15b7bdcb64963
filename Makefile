# make lab      create .venv, install, open JupyterLab on notebooks/
# make test     create .venv, install, run pytest and nbval on every notebook
# make student  write student/: the notebooks with exercise solutions removed
# make grade DIR=student  run every exercise checker on a folder of notebooks and print a score sheet
#               make grade DIR="class/*" CSV=1: one CSV row per student folder (a learning-management system's import)
# make dist-student [FORCE=1]  dist/minillm-student.zip: student notebooks (no solutions, no answers), wheel, README
# make test-dist  build the wheel and the student zip, install them in a fresh venv elsewhere, run notebook 00 there
# make test-clients  install lm-evaluation-harness (the clients extra) and run it against the server
# make test-browser  every notebook Run All in JupyterLab in headless Chromium: no error, every widget responds
#                   (installs playwright from PyPI and, as root, Debian's chromium; screenshots in results/browser)
# make test-slow  the long runs kept out of make test (the 10,000-schedule fuzzer: MINILLM_FUZZ_EXAMPLES)
# make test-notebooks-busy  nbval on every notebook with two busy loops running beside it (a busy laptop)
# make gpu-check  on a CUDA machine (its python, installs nothing): gpu tests, kernels vs torch, racecheck, decode
#
# torch is installed first, pinned here (never in pyproject.toml, which takes a range): 2.13.0 is the
# CPU build this project is tested with; with it in place pip keeps it instead of fetching another.
# Choose another build with e.g. `make test TORCH_SPEC="torch==2.11.0"`; on Linux without a GPU, pass
# PyTorch's CPU wheel index through TORCH_PIP_ARGS (e.g. --index-url <that index>) to skip the CUDA wheels.
PYTHON         ?= python3
VENV           ?= .venv
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.installed
ROOT_FLAG  := $(if $(filter 0,$(shell id -u)),--allow-root,)
NBVAL      := --nbval --nbval-current-env --nbval-cell-timeout=120 --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: install lab test test-unit test-notebooks test-notebooks-busy test-slow test-clients test-browser test-dist dist-student lint student grade clean gpu-check

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" numpy 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import torch" || { echo "torch did not install"; exit 1; }
	$(BIN)/python -m pip install -q -e ".[dev,cuda]" 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import minillm, nbval, matplotlib, numba.cuda" || { echo "install failed"; exit 1; }
	touch $(STAMP)

install: $(STAMP)

lab: install
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: lint test-unit test-notebooks

lint: install
	$(BIN)/ruff check .

# Two invocations: numba chooses the CUDA simulator or a GPU once per process, at its first import.
test-unit: install
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q --durations=25 tests
	MINILLM_PROGRESS=0 NUMBA_ENABLE_CUDASIM=1 $(BIN)/python -m pytest -q tests/cudasim

test-clients: install
	$(BIN)/python -m pip install -q -e ".[clients]" 2>&1 | grep -v "is ignored" || true
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q -m clients tests

# playwright drives the system's chromium: `playwright install` (a CDN download) is never run.
test-browser: install
	$(BIN)/python -m pip install -q -e ".[browser]" 2>&1 | grep -v "is ignored" || true
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && { apt-get install -y -q chromium >/dev/null \
		|| { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } \
		|| { echo "test-browser needs chromium: apt-get install chromium"; exit 1; }
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q -m browser -p no:cacheprovider tests
	MINILLM_PROGRESS=0 $(BIN)/python tests/browser_notebooks.py --out results/browser

dist-student: install
	rm -rf build/wheel
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation . -w build/wheel 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -m minillm.labs.dist --wheel build/wheel/minillm-*.whl --out dist/minillm-student.zip \
		$(if $(FORCE),--force,)

# The fresh venv takes the same torch as this one (TORCH_SPEC, TORCH_PIP_ARGS), from the same registries.
test-dist: install
	TORCH_SPEC="$(TORCH_SPEC)" TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" MINILLM_PROGRESS=0 \
		$(BIN)/python -m pytest -q -m dist tests

test-slow: install
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q -m slow tests

test-notebooks: install
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q $(NBVAL) notebooks

# The lessons must hold on a classroom laptop that is doing other work: two CPU hogs for the whole run.
test-notebooks-busy: install
	$(BIN)/python -c "while True: pass" & h1=$$!; $(BIN)/python -c "while True: pass" & h2=$$!; \
	MINILLM_PROGRESS=0 $(BIN)/python -m pytest -q --durations=15 $(NBVAL) notebooks; rc=$$?; \
	kill $$h1 $$h2; exit $$rc

# No install step: a lent GPU machine has no network. PYTHONPATH keeps what was there (e.g. carried wheels).
gpu-check:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) tests/gpu_check.py $(GPU_CHECK_ARGS)

student: install
	$(BIN)/python -m minillm student notebooks student

DIR ?= student
grade: install
	MINILLM_PROGRESS=0 $(BIN)/python -m minillm grade $(DIR) $(if $(CSV),--csv,)

clean:
	rm -rf $(VENV) student build *.egg-info
