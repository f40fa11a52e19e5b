# Sourced, from the repository root, by every device session script (scripts/*_session.sh, scripts/gpu_*.sh) before
# its first step: what each of them needs, written once.
#
# * Refuses to start (exit 2, one line) when MXBENCH_GIT_COMMIT is unset and the tracked files differ from git's
#   HEAD: the device's copy of the working tree can arrive with a .git older than the tree, and every run would then
#   record that stale commit. MXBENCH_GIT_COMMIT=<the tree's commit> is what provenance records instead
#   (mxbench/instruments/provenance.py); a tree without .git of its own is left to provenance (it records none).
# * OUT: the folder the device tool brings back (set it before sourcing where the script asks for it; default
#   /tmp/out), created; PYTHONUNBUFFERED=1.
# * Installs mxkernels and mxbench editable without the network; the log in INSTALL_LOG (default /tmp/install.log),
#   printed with exit 1 when the install fails.
# * CARD: the card's name as mxbench names its results/<card>/ folder ("unknown" without a GPU).
# * DEADLINE (epoch seconds, optional; 0: none) and `left`: the seconds before it (100000 without one), so a step
#   can be skipped or cut short inside the device's limit; `pack ARCHIVE DIR...`: the DIRs of $OUT packed into
#   $OUT/ARCHIVE (the device tool brings back few files).

if [ -z "${MXBENCH_GIT_COMMIT:-}" ] && [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] &&
  [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "$(basename "$0"): the tracked files differ from git HEAD $(git rev-parse --short HEAD) (this .git is older" \
    "than the tree?): pass MXBENCH_GIT_COMMIT=<the tree's commit> so the runs record it" >&2
  exit 2
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
INSTALL_LOG=${INSTALL_LOG:-/tmp/install.log}
python3 -m pip install -q --no-deps --no-build-isolation -e ./kernels -e . >"$INSTALL_LOG" 2>&1 ||
  { cat "$INSTALL_LOG"; exit 1; }
CARD=$(python3 -c "import torch; from mxbench.instruments.hardware import card_slug; print(card_slug(torch.cuda.get_device_name()))" 2>/dev/null) ||
  CARD=unknown

DEADLINE=${DEADLINE:-0}
left() { if [ "$DEADLINE" -gt 0 ]; then echo $((DEADLINE - $(date +%s))); else echo 100000; fi; }
pack() { local archive=$1; shift; tar czf "$OUT/$archive" -C "$OUT" "$@" 2>/dev/null; }
