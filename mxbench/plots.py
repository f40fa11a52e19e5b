"""The figures of stored runs as a notebook imports them (``from mxbench.plots import breakdown_figure``): each
``*_figure`` takes a Run or the frame of one run and returns a matplotlib Figure; ``plot_all`` writes every figure
a run has. They live with their workloads (``workloads/step/plots.py``, ``workloads/peers/figure.py``) and with the
readers of any run (``reporting/plots.py``); this module only hands them on."""

from .reporting.plots import plot_all
from .views.panels import save
from .workloads.peers.figure import peers_figure
from .workloads.step.plots import (
    PANELS,
    bandwidth_figure,
    breakdown_figure,
    gemm_speedup_figure,
    net_speedup_figure,
    plot_bandwidth,
    plot_breakdown,
    plot_gemm_speedup,
    plot_net_speedup,
    plot_power,
    plot_roofline,
    power_figure,
    projection_figure,
    roofline_figure,
)

__all__ = ["PANELS", "bandwidth_figure", "breakdown_figure", "gemm_speedup_figure", "net_speedup_figure",
           "peers_figure", "plot_all", "plot_bandwidth", "plot_breakdown", "plot_gemm_speedup", "plot_net_speedup",
           "plot_power", "plot_roofline", "power_figure", "projection_figure", "roofline_figure", "save"]  # fmt: skip
