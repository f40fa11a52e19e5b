"""The card named when none is: the spec the analytic model prices without a GPU, and the card a projection goes to
by default. Apart from ``hardware`` (which reads the spec table and loads the kernels' errors) so that the command
line can name it in its help without importing either."""

DEFAULT_CARD = "b200"
