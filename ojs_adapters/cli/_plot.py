"""``ojs-retry schedule --plot``: the delay and its jitter band over retries.

matplotlib is optional and never a dependency: it is looked up when a plot is
asked for, and its absence is reported as a clear error.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import click

from ojs_adapters.policy import RetryPolicy


def plot_schedule(policy: RetryPolicy, rows: Sequence[dict[str, Any]], path: str) -> None:
    """Draw the capped delay and its jitter band for ``rows`` to ``path``."""
    if importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib, which is not installed "
                                   "(pip install matplotlib); nothing was drawn")
    if not rows:
        raise click.ClickException("--plot: the policy allows no retries; nothing to draw")
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # files only; never open a window
    pyplot = importlib.import_module("matplotlib.pyplot")
    retries = [row["retry"] for row in rows]
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    axes.fill_between(retries, [row["jitter_low"] for row in rows],
                      [row["jitter_high"] for row in rows], alpha=0.3, label="jitter band")
    axes.plot(retries, [row["capped"] for row in rows], marker="o", label="capped delay")
    axes.axhline(policy.max_interval.total_seconds(), linestyle="--", label="max_interval")
    axes.set_xlabel("retry # (attempt - 1)")
    axes.set_ylabel("delay (s)")
    axes.set_yscale("log")
    axes.set_title(f"{policy.backoff_strategy} backoff, max_attempts {policy.max_attempts}")
    axes.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
