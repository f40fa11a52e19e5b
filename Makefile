# Everyday commands. `make test` is what CI runs (see .ci/run).
PYTHON ?= python
CARD ?= $(shell $(PYTHON) -c "from mxbench.hardware import detect; s = detect(); print(s.key if s else 'none')" 2>/dev/null)

.PHONY: install test test-gpu roofline regress duplicates

install:
	$(PYTHON) -m pip install -e ".[test]"

test:
	$(PYTHON) -m pytest -q -n 2

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

roofline:
	mxbench roofline --K 7168 --N 2048

regress:
	mxbench regress --baseline results/baselines/$(CARD).json
