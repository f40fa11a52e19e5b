"""``python -m mxbench``: the same command line as ``mxbench`` (what ``torchrun ... -m mxbench ep ...`` starts on
every worker)."""

from .cli import main

main()
