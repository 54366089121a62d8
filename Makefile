# suffice: `make demo` runs the main job, `make test` runs the test suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first, pinned: on the CPU machines this project runs on, `pip install torch==2.13.0`
# takes the CPU build from local disk; on a GPU machine PyPI serves the CUDA build. For a CPU
# build elsewhere: make TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= train,serve,dev
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
MLFLOW_DB ?= sqlite:///$(CURDIR)/mlruns/mlflow.db
# one UI worker: a 2-core machine also trains and serves
MLFLOW_WORKERS ?= 1
# the UI's port: make mlflow-ui MLFLOW_PORT=5001 when 5000 is taken
MLFLOW_PORT ?= 5000
# EXTRAS=...,spark (pyspark for mlflow.pyfunc.spark_udf) needs a Java 17+ runtime: Debian's, installed when missing
JAVA_PKG ?= openjdk-17-jre-headless

.PHONY: install demo test test-slow bench mlflow-ui clean-venv

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): $(VENV)/bin/python pyproject.toml configs/constraints.txt
	$(PIP) install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PIP) install --quiet -c configs/constraints.txt -e ".[$(EXTRAS)]"
	$(if $(findstring spark,$(EXTRAS)),command -v java >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $(JAVA_PKG); } \
		|| { echo "the spark extra needs a Java 17+ runtime: install $(JAVA_PKG) (or set JAVA_HOME)" >&2; exit 1; })
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/suffice demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/run.py

mlflow-ui: $(STAMP)
	@mkdir -p mlruns/artifacts
	$(VENV)/bin/mlflow ui --backend-store-uri $(MLFLOW_DB) --default-artifact-root $(CURDIR)/mlruns/artifacts --host 127.0.0.1 --port $(MLFLOW_PORT) --workers $(MLFLOW_WORKERS)

clean-venv:
	rm -rf $(VENV)
