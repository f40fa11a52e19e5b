# Everyday commands. `make test` is what CI runs (see .ci/run).
PYTHON ?= python
# The command the measuring targets run (a test puts a stand-in here to see the exit code make passes on).
MXBENCH ?= mxbench
# The card's folder name under results/ (e.g. nvidia-h200), from the CUDA device name; worked out on first use only
# (importing torch takes seconds) and then kept.
CARD ?= $(eval CARD := $(shell $(PYTHON) -c "import torch; from mxbench.instruments.hardware import card_slug; print(card_slug(torch.cuda.get_device_name()) if torch.cuda.is_available() else 'no-gpu')" 2>/dev/null))$(CARD)

.PHONY: install test test-gpu roofline baseline regress

install:
	$(PYTHON) -m pip install -e ./kernels -e ".[test]"

# The CPU suite on any machine: GPUs hidden, so the Triton kernels run under the interpreter as in CI. worksteal:
# the default (load) hands each worker a fixed first quarter of the tests, so the slowest, sorted first (conftest),
# all land on one worker, which no other can relieve; an idle worker steals half of a busy one's queue.
test:
	CUDA_VISIBLE_DEVICES= $(PYTHON) -m pytest -q -n 2 --dist worksteal --durations=25

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

roofline:
	$(MXBENCH) roofline --K 7168 --N 2048

# A baseline and its check measure the card they track: without a GPU they refuse (exit 2) rather than store the
# analytic model as a baseline or look for results/baselines/no-gpu.json.
define require_gpu
	@if [ -z "$(CARD)" ] || [ "$(CARD)" = no-gpu ]; then \
		echo "make $@: no CUDA GPU found: $@ measures the card it tracks; run it on the GPU machine" >&2; exit 2; fi
endef

# The points `make regress` re-measures: DeepSeek-V3 shapes at two token counts, every stage plus end to end.
baseline:
	$(require_gpu)
	$(MXBENCH) roofline --K 7168 --N 2048 --M 16384,32768 --out results/baselines/$(CARD).json

# REGRESS_FLAGS: more options of `mxbench regress`, e.g. "--format markdown --out regress/run.json" in CI.
regress:
	$(require_gpu)
	$(MXBENCH) regress --baseline results/baselines/$(CARD).json $(REGRESS_FLAGS)
