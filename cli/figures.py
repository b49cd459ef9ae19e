"""A study's figure as the papers draw it: error against iterations, per cell, over seeds.

Training error is thin and dashed, test error bold (2015 Fig. 1, 4, 6); a band spans the
seeds' min-max around their median. Studies of plain against residual nets get the
2015 Fig. 6 layout: plain nets left, residual nets right, one colour per depth.
The input is `core.studies.results.curves` (or the API's `/curves` cells), so any caller
can draw it; the output is PNG bytes, drawn with Agg and no global pyplot state
(matplotlib is imported only to draw, so the command line starts without it).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.studies.results import cell_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Curve = dict[str, Any]  # cell, values, steps, center, lower, upper, seeds
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
FAMILY = re.compile(r"^(?:cifar_|imagenet_)?(plain|resnet|preact_resnet)(\d+)$")


def png(
    train: Sequence[Curve],
    test: Sequence[Curve],
    *,
    title: str,
    plain_and_residual: bool = False,
) -> bytes:
    """The figure as PNG: `train`/`test` are the cells' `train/error` and `test/error` curves;
    `plain_and_residual` draws plain nets and residual nets side by side (2015 Fig. 6)."""
    from matplotlib.figure import Figure  # its Agg canvas draws the PNG

    panels = _panels(train, plain_and_residual)
    figure = Figure(figsize=(5.5 * len(panels), 4.5), layout="constrained", dpi=120)
    grid = figure.subplots(1, len(panels), squeeze=False)[0]
    tests = {curve["cell"]: curve for curve in test}
    colour_key = _depth_key if plain_and_residual else _cell_key
    colours = _colours([colour_key(curve) for _, curves in panels for curve in curves])
    top = _top([*train, *test])
    legend_title = ", ".join(train[0]["values"]) if train else ""
    for axes, (name, curves) in zip(grid, panels, strict=True):
        for curve in curves:
            colour = colours[colour_key(curve)]
            # The bold test line names the cell; a cell not yet tested, its training line.
            named = _draw(
                axes, tests.get(curve["cell"], {}), colour, dashed=False, label=_label(curve)
            )
            _draw(axes, curve, colour, dashed=True, label=None if named else _label(curve))
        _style(axes, name, top, legend_title=legend_title)
    figure.suptitle(f"{title}\ndashed: training error, bold: test error; band: min-max over seeds")
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def _panels(curves: Sequence[Curve], split: bool) -> list[tuple[str, list[Curve]]]:
    """One panel with every cell, or the plain nets' panel and the residual nets' panel."""
    if not split:
        return [("", list(curves))]
    plain = [curve for curve in curves if _family(curve["values"]) == "plain"]
    residual = [curve for curve in curves if _family(curve["values"]) != "plain"]
    return [("plain", plain), ("residual", residual)]


def _family(values: dict[str, Any]) -> str | None:
    found = FAMILY.match(str(values.get("model.name", "")))
    return found.group(1) if found else None


def _cell_key(curve: Curve) -> str:
    """A colour per cell."""
    return str(curve["cell"])


def _depth_key(curve: Curve) -> str:
    """A colour per cell without its net's family: plain-20 and ResNet-20 share one."""
    values = curve["values"]
    found = FAMILY.match(str(values.get("model.name", "")))
    rest = {axis: value for axis, value in values.items() if axis != "model.name" or not found}
    return f"{found.group(2) if found else ''} {sorted(rest.items())!r}"


def _colours(keys: Sequence[str]) -> dict[str, str]:
    """The palette's colours in turn, to the keys in the order they first come."""
    return {key: PALETTE[index % len(PALETTE)] for index, key in enumerate(dict.fromkeys(keys))}


def _label(curve: Curve) -> str:
    return cell_label(curve["values"]) or f"cell {curve['cell']}"


def _points(curve: Curve) -> tuple[list[int], list[float], list[float], list[float]]:
    """The steps that have a centre, and the centre and band there, in %."""
    steps, mids, lows, highs = [], [], [], []
    columns = (curve.get(key, []) for key in ("steps", "center", "lower", "upper"))
    for step, mid, low, high in zip(*columns, strict=True):
        if mid is None:
            continue
        steps.append(step)
        mids.append(100 * mid)
        lows.append(100 * (mid if low is None else low))
        highs.append(100 * (mid if high is None else high))
    return steps, mids, lows, highs


def _draw(axes: Axes, curve: Curve, colour: str, *, dashed: bool, label: str | None) -> bool:
    """One curve's median and band; False when it has no points yet."""
    steps, mids, lows, highs = _points(curve)
    if not steps:
        return False
    axes.fill_between(steps, lows, highs, color=colour, alpha=0.1 if dashed else 0.2, lw=0)
    # A run tested only at its end has one test point: a marker shows it.
    marker = "o" if len(steps) == 1 else None
    style = {"linestyle": "--", "linewidth": 0.9} if dashed else {"linewidth": 2.2}
    axes.plot(steps, mids, color=colour, label=label, marker=marker, **style)
    return True


def _top(curves: Sequence[Curve]) -> float:
    """The y limit in %: three times the worst final median, as the papers cut the first
    iterations' errors off to show where the nets end."""
    finals = [100 * mid for curve in curves for mid in curve.get("center", [])[-1:] if mid]
    return min(100.0, max(5.0, 3 * max(finals))) if finals else 100.0


def _style(axes: Axes, name: str, top: float, *, legend_title: str) -> None:
    axes.set_title(name)
    axes.set_xlabel("iterations")
    axes.set_ylabel("error (%)")
    axes.set_ylim(0, top)
    axes.set_xlim(left=0)
    axes.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    axes.grid(alpha=0.3)
    handles, _ = axes.get_legend_handles_labels()
    if handles:
        axes.legend(title=legend_title or None, fontsize="small")
    else:
        axes.text(0.5, 0.5, "no curves yet", ha="center", transform=axes.transAxes)
