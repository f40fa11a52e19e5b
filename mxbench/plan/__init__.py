"""What a run measures: ``points`` (the sweep's points, their token-group sizes, the size bounds) and ``presets``
(the models' shapes, ``data/shapes/*.toml``). Above storage (a point is a stored ``Point``), below everything that
measures."""
