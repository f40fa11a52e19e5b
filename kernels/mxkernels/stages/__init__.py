"""The declared stage tables of every workload, ``<workload>_specs`` says what each stage computes
(contract, oracle, comparison rule) and ``<workload>`` lays them out as a pass's ordered stages with shapes and costs.
The step: ``step_specs``, ``pipeline``; the layer: ``layer_specs``, ``layer``; expert parallelism: ``ep_stages`` (its
specs and strategies), ``ep_wgrad``, ``ep_layer``."""
