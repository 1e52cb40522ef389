"""`pardec tune --show`'s pictures: the measured cost curve and each profile's best speed-up."""

from __future__ import annotations

from pardec_cli.selection.costmodel import CostCurve
from pardec_cli.plots import cost_curve_figure, speedup_figure, tune_figures
from pardec_cli.selection.tuned import TunedCandidate, TunedProfile, TunedResults


def candidate(method: str, knobs: dict, speedup: float) -> TunedCandidate:
    return TunedCandidate(method=method, knobs=knobs, tokens_per_step=2.0, drafted=3.0, draft_ms=0.1,
                          tokens_per_s=40.0 * speedup, speedup=speedup, prompts=4, matched=4)


def results() -> TunedResults:
    curve = CostCurve.from_mapping({1: 30.0, 8: 33.0, 16: 38.0, 32: 52.0, 64: 90.0}, "measured by pardec tune")
    code = TunedProfile("code", candidates=[candidate("suffix", {"max_nodes": 8}, 1.9), candidate("pld", {}, 1.5)])
    code.best = code.candidates[0].label
    chat = TunedProfile("chat", candidates=[candidate("recycling", {"nodes": 8}, 1.1)])
    chat.best = chat.candidates[0].label
    unfinished = TunedProfile("extraction")  # no round finished: nothing to draw
    return TunedResults("smollm2-135m", "abc", "cpu: AMD EPYC (2 cores)", "float32", curve=curve,
                        profiles={"code": code, "chat": chat, "extraction": unfinished})


def test_the_cost_curve_is_drawn_against_the_tokens_verified() -> None:
    picture = cost_curve_figure([(1, 30.0), (8, 33.0), (64, 90.0)], width=70)
    lines = picture.splitlines()
    assert "\x1b[" not in picture and max(len(line) for line in lines) <= 70
    assert "tokens verified in one forward pass" in picture
    axis = next(line for line in lines if line.strip().startswith("1 "))
    assert axis.split() == ["1", "8", "64"]  # ticks at the measured points


def test_speedups_are_bars_with_their_values() -> None:
    picture = speedup_figure({"code: suffix[max_nodes=8]": 1.9, "chat: recycling[nodes=8]": 1.1}, width=70)
    code = next(line for line in picture.splitlines() if line.startswith("code: suffix"))
    chat = next(line for line in picture.splitlines() if line.startswith("chat: recycling"))
    assert code.rstrip().endswith("1.90") and chat.rstrip().endswith("1.10")
    assert code.count("▇") > chat.count("▇")  # longer bar for the larger speed-up


def test_tune_show_draws_the_curve_then_the_best_method_per_profile() -> None:
    picture = tune_figures(results(), width=80)
    assert picture.index("ms per forward pass") < picture.index("speed-up over vanilla")
    assert "code: suffix[max_nodes=8]" in picture and "chat: recycling[nodes=8]" in picture
    assert "extraction" not in picture.split("speed-up over vanilla", 1)[1]


def test_a_profile_where_nothing_beat_plain_decoding_draws_plain_decoding_as_auto_ranks_it() -> None:
    """The bar is what auto would run (as `pardec tune`'s summary says), not the search's
    last round: here that round ended on pld at 0.90x."""
    chat = TunedProfile("chat", candidates=[candidate("pld", {}, 0.9)])
    chat.best = chat.candidates[0].label
    picture = tune_figures(TunedResults("m", "f", "cpu", "float32", profiles={"chat": chat}), width=80)
    bar = next(line for line in picture.splitlines() if line.startswith("chat: "))
    assert bar.startswith("chat: plain decoding") and bar.rstrip().endswith("1.00")


def test_nothing_measured_draws_nothing() -> None:
    assert tune_figures(TunedResults("m", "f", "cpu", "float32"), width=80) == ""
