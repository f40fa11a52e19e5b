"""Expert parallelism's own pieces: the all-to-alls (``comm``) and the weight gradient's precision option
(``wgrad``). Its stage tables are ``stages.ep_stages`` and ``stages.ep_layer``; its autograd front doors
``autograd.ep_projection`` and ``autograd.ep_layer``."""
