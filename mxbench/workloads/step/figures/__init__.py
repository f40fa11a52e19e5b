"""The step's panels, one module per family: ``step`` (against M), ``roofline``, ``power`` (per power limit),
``projection`` (onto another card); ``..plots`` turns them into figures and files."""
