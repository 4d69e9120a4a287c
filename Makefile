# Two commands from a clean clone: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Exact pin: the CPU wheel on these machines. An unpinned torch pulls a multi-GB CUDA build.
TORCH  := torch==2.13.0
# torchao for the CPU tests of model.fp8_linear (its float8 layers run on the CPU too); pinned with torch.
TORCHAO := torchao==0.18.0

.PHONY: demo test venv tools clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH) $(TORCHAO) -e '.[trainer,operator,dev]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" ./scripts/demo.sh

# helm, kubectl, prometheus and promtool (into .cache/tools/bin) and chromium for the chart, monitoring and report tests.
tools:
	$(PYTHON) scripts/fetch_tools.py

# The suite in parallel processes (pytest-xdist), one test file per worker at a time so a file's
# module fixtures are built once; TEST_WORKERS=1 runs it in this process.
TEST_WORKERS ?= 2

# The project's own modules are byte-compiled first: every test launches many processes (torchrun
# ranks, the CLI, the operator), and where PYTHONDONTWRITEBYTECODE is set each would compile them again.
test: $(STAMP) tools
	$(BIN)/python -m compileall -q trainer operator > /dev/null
	$(BIN)/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

clean:
	rm -rf $(VENV) demo-out .pytest_cache .hypothesis .cache/tools
