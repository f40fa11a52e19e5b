"""``python -m mxbench.cli``: the same command line as ``mxbench``."""

from . import main

main()
