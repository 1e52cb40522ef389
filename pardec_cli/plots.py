"""Terminal pictures: `pardec bench --plot` and `pardec tune --show`, drawn with plotext.

Each function returns the picture as text (the caller prints it), so commands decide
where it goes and tests can read it. plotext is imported inside the functions: `pardec
--help` and every command that draws nothing never load it. plotext keeps one figure at
module level; every function here starts by clearing it, so no picture leaks into the
next.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

DEFAULT_WIDTH = 100

BOX_NOTE = "box: 25th-75th percentile of per-prompt tok/s, | median, whiskers min to max"


def _plotext(width: int, height: int, color: bool) -> Any:
    """plotext, its figure cleared and sized; without colour when `color` is False."""
    import plotext as plt

    plt.clear_figure()
    plt.theme("clear")
    if height:
        plt.plotsize(width, height)
    return plt


def _text(plt: Any, color: bool) -> str:
    text = plt.build()
    if not color:
        text = plt.uncolorize(text)
    # plotext ends each line with a colour reset even without colour; trailing blanks go too.
    return "\n".join(line.rstrip() for line in text.splitlines())


def bench_figure(runs: Sequence[Any], labels: Sequence[str], *, width: int = DEFAULT_WIDTH, color: bool = False) -> str:
    """tok/s of every method on every category, one box per (category, method) over its prompts.

    `runs` are `pardec_cli.bench.Run`s (label, category, new_tokens, seconds);
    `labels` orders the methods. The box spans the 25th to 75th percentile of the
    per-prompt tokens/s, its mark is the median, its whiskers reach the slowest and the
    fastest prompt (`BOX_NOTE`).
    """
    per_cell: dict[tuple[str, str], list[float]] = defaultdict(list)
    for run in runs:
        if run.seconds > 0:
            per_cell[(run.category, run.label)].append(run.new_tokens / run.seconds)
    categories = sorted({category for category, _ in per_cell})
    names, data = [], []
    # plotext draws the first box at the bottom: reversed, the table's order reads top-down.
    for category in reversed(categories):
        for label in reversed(list(labels)):
            values = per_cell.get((category, label))
            if values:
                names.append(f"{category} {label}")
                data.append(values)
    if not data:
        return ""
    plt = _plotext(width, max(8, 3 * len(data) + 4), color)
    plt.box(names, data, orientation="horizontal", width=0.4)
    plt.title("tokens/s per prompt, by category and method")
    return _text(plt, color) + "\n" + BOX_NOTE


def cost_curve_figure(points: Sequence[tuple[int, float]], *, width: int = DEFAULT_WIDTH, color: bool = False,
                      title: str = "") -> str:  # fmt: skip
    """The cost curve: time of one forward pass (ms) against the tokens it verifies.

    Flat at first is what makes parallel decoding pay: verifying 16 tokens costs little
    more than one. `points` are (tokens, ms), as in `CostCurve.points`.
    """
    if not points:
        return ""
    xs = [n for n, _ in points]
    ys = [ms for _, ms in points]
    plt = _plotext(width, 16, color)
    plt.plot(xs, ys, marker="braille")
    plt.scatter(xs, ys, marker="dot")
    plt.xticks(xs, [str(n) for n in xs])
    plt.ylim(0, max(ys) * 1.1)
    plt.title(title or "one forward pass: ms against tokens verified")
    plt.xlabel("tokens verified in one forward pass")
    plt.ylabel("ms")
    return _text(plt, color)


def speedup_figure(speedups: dict[str, float], *, width: int = DEFAULT_WIDTH, color: bool = False,
                   title: str = "") -> str:  # fmt: skip
    """Horizontal bars: the measured speed-up over vanilla per profile (name -> factor)."""
    if not speedups:
        return ""
    plt = _plotext(width, 0, color)
    plt.simple_bar(list(speedups), [round(v, 2) for v in speedups.values()], width=width,
                   title=title or "speed-up over vanilla of the best tuned method, per profile")  # fmt: skip
    return _text(plt, color).strip("\n")


def tune_figures(results: Any, *, width: int = DEFAULT_WIDTH, color: bool = False) -> str:
    """`pardec tune --show`'s pictures for one results file: its cost curve and its
    profiles' best speed-ups (`pardec_cli.selection.tuned.TunedResults`)."""
    parts = []
    if results.curve is not None:
        parts.append(cost_curve_figure(results.curve.points, width=width, color=color,
                                       title=f"{results.model} on {results.device}: ms per forward pass"))  # fmt: skip
    speedups = {}
    for name, profile in results.profiles.items():
        if not any(c.method != "vanilla" for c in profile.candidates):
            continue  # nothing measured yet
        best = profile.best_measured()  # as auto ranks them (and as `describe_profile` says)
        speedups[f"{name}: {best.label}" if best else f"{name}: plain decoding"] = best.speedup if best else 1.0
    if speedups:
        parts.append(speedup_figure(speedups, width=width, color=color))
    return "\n\n".join(part for part in parts if part)
