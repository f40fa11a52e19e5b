"""Progress of a sweep on stderr: a bar on a terminal, one plain line per point in logs and CI."""

from __future__ import annotations

import sys

import click

from ..storage.results import Point


class Progress:
    """A click progress bar over the points on a terminal; one plain line per point otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done = total, enabled, 0
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = click.progressbar(
                length=total, label="sweep", file=sys.stderr, item_show_func=lambda p: p.label() if p else ""
            )

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def start(self, point: Point) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.current_item = point
            self.bar.render_progress()
        elif self.enabled:
            click.echo(f"[{self.done}/{self.total}] {point.label()}", err=True)

    def finish(self, point: Point) -> None:
        if self.bar is not None:
            self.bar.update(1, point)
