"""``python -m mxbench``: the command line, as torchrun starts it (``torchrun ... -m mxbench ep ...``)."""

from .cli import main

main()
