# Two commands set up a fresh machine (see README.md):
#   make demo   install, then recommend a strategy for a 7B model at 32k context (shipped gh200 profile)
#   make test   install the test extras (CPU torch pinned, DeepSpeed), then run the tests
PYTHON ?= python
PIP = $(PYTHON) -m pip

.PHONY: demo test test-deps bench

# `python -m advisor.cli` is the `advisor` command of the Python that installed it (PATH may hold another).
demo:
	$(PIP) install -e .
	$(PYTHON) -m advisor.cli recommend --model 7B --seq 32k

# torch first, so DeepSpeed (an sdist) builds against it; DS_BUILD_OPS=0 gives the pure-Python
# wheel whose ops compile at first use. Each step is a no-op when already satisfied.
test-deps:
	$(PIP) install 'torch==2.13.0' setuptools wheel
	DS_BUILD_OPS=0 $(PIP) install --no-build-isolation 'deepspeed==0.19.8'
	$(PIP) install -e '.[test]'

test: test-deps
	$(PYTHON) -m pytest

bench:
	$(PYTHON) benchmarks/bench_advisor.py
