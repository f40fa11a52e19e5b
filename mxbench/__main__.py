"""``python -m mxbench``: the same command line as ``mxbench``."""

from .cli import main

main()
