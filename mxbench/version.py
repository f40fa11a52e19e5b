"""mxbench's version, apart from the package's face so that the run metadata can record it without importing the
face (which loads the frames and the registry on first use)."""

__version__ = "0.1.0"
