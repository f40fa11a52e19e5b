"""The project's input-error type, in a module that imports nothing (the harness's option checks use it without
loading torch or a kernel)."""


class InputError(ValueError):
    """Bad input to a kernel wrapper or a harness function, found before any work: the message names the argument
    (or option, or file) and what is wrong. The CLI turns this type, and only this type, into exit code 2."""
