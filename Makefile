# Everything a fresh Linux machine with Python >= 3.10 needs: `make demo`, `make test`.
PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
PY            := $(VENV)/bin/python
PIP           := $(PY) -m pip
DEMO_OUT      ?= demo-out

.PHONY: demo test setup clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade --quiet pip

# Torch first, and only if missing: users bring their own CUDA build; pip must not pick one for us.
$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) tools/demo.py --out $(DEMO_OUT)

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache

# make bench / make bench-quick: our numbers against the peers, in a separate environment
include tools/bench.mk
