# make demo   create the environment if missing, run the main job on embedded defaults
# make test   create the environment if missing, run every test tier (the cluster tiers beside the others)
# make test-quick  the inner loop: unit tests and the core Spark ETL tests, leaving out those marked slow (< 5 min)
# make lint   ruff (lint + import order) and mypy on hvdtrain, etl, yarn (config in pyproject.toml)
# make bench  benchmarks (ratios against in-run baselines)
# make bench-gpu  GPU benchmarks (NCCL, mixed precision, scaling); stops with one line without a GPU
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hvdtrain-env
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-m 'not e2e'"
PYTEST_ARGS ?=

.PHONY: env demo lint test test-quick bench bench-gpu clean check-build
env: $(STAMP)

$(STAMP): setup.py native/setup.py native/hvdtrain_native.c scripts/bootstrap.sh scripts/build_horovod.sh scripts/patches/*.patch
	@bash scripts/bootstrap.sh "$(PYTHON)" "$(VENV)"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hvdtrain demo configs/demo.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: $(STAMP)
	$(PY) scripts/test_suite.py $(PYTEST_ARGS)

test-quick: $(STAMP)
	$(PY) -m pytest tests/unit tests/spark/test_etl_spark.py -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks.run

bench-gpu: $(STAMP)
	$(PY) -m benchmarks.gpu

check-build: $(STAMP)
	$(VENV)/bin/horovodrun --check-build

clean:
	rm -rf work .pytest_cache .mypy_cache .ruff_cache
