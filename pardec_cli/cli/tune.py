"""`pardec tune`: measure this machine and find the fastest method knobs per task profile."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

import click

from pardec_cli.cli.options import FiniteFloat, compile_notice, compile_option, model_options
from pardec_cli.cli.output import is_terminal, loading_status


class ProfileOrAll(click.ParamType):
    """A profile name or "all"."""

    name = "PROFILE|all"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        from pardec_cli.selection.profiles import profile_names

        return [CompletionItem(n) for n in ["all", *profile_names()] if n.startswith(incomplete)]


@click.command()
@model_options
@compile_option
@click.option("-P", "--profile", "profile", default="all", show_default=True, type=ProfileOrAll(),
              help="The task profile to tune, or all.")
@click.option("--budget", type=FiniteFloat(min=0.0, min_open=True), default=None, metavar="MINUTES",
              help="Time to spend measuring, all profiles together.  [default: 3; 10 with --thorough]")
@click.option("--thorough", is_flag=True, help="The longer search: every candidate's neighbouring knob settings too, "
              "and 96 tokens per run.")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              metavar="FILE.jsonl", help="Tune on these prompts (as `gen --prompts` reads them) instead of the built-in "
              "sets; with several profiles each prompt goes to its detected profile.")
@click.option("--methods", "methods_text", default="", metavar="LIST", help="Only these methods (comma-separated names).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=8), default=None,
              help="Tokens generated per measured run.  [default: 64, 96 with --thorough; doubled up to 256 where "
              "plain decoding of a run takes under half a second]")
@click.option("--show", is_flag=True, help="Print the saved results (all models) and exit; on a terminal also draw each cost curve and the speed-ups per profile.")
@click.option("--reset", is_flag=True, help="Remove MODEL's saved results (every device and dtype) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --show: print the results as JSON.")
def tune(model: str | None, dtype: str, weights: str, device: str, offline: bool | None, compile: str, profile: str,
         budget: float | None, thorough: bool, prompts_file: Path | None, methods_text: str, max_tokens: int | None,
         show: bool, reset: bool, as_json: bool) -> None:
    """Find the fastest method and knobs for MODEL on this machine, per task profile.

    First the verification cost curve is measured (a forward over 1..64 new tokens);
    then per profile the profile's first few candidate methods (with --thorough: all
    of them and their neighbouring knob settings) are screened on a prompt (the curve
    predicts their speed from exact token counts; the slow ones go) and the rest
    compete by successive halving on more and more prompts, each run timed end to end
    against plain decoding and its output checked against plain decoding's. At the
    end it says what it measured (tokens per step, speed-up with its spread over the
    prompts), then the best. Results are saved per model, device and dtype under the
    pardec home, as they are measured: Ctrl-C keeps them, and running the same command
    again resumes. `--method auto` and `pardec doctor` use them from then on, ranked
    above any profile prior; results for another device, dtype or version of the
    model are never used.

    \b
    Examples:
      pardec tune                             every profile, about 3 minutes
      pardec tune --budget 2 -P code
      pardec tune --thorough --budget 20      the longer search
      pardec tune -P code --methods pld,suffix
      pardec tune --show
      pardec tune --reset
    """
    from pardec_cli.errors import PardecUsageError

    if show and reset:
        raise PardecUsageError("--show and --reset cannot be combined")
    if as_json and not show:
        raise PardecUsageError("--json goes with --show")
    if show:
        show_results(model, device, dtype, as_json)
        return
    if reset:
        reset_results(model)
        return
    if budget is None:
        budget = 10.0 if thorough else 3.0
    lengthen = max_tokens is None  # not given: longer runs where plain decoding is quick (`tuner.RUN_TARGET_S`)
    if max_tokens is None:
        max_tokens = 96 if thorough else 64
    run_tune(model, dtype, device, offline, profile, budget, prompts_file, methods_text, max_tokens, weights, compile,
             thorough=thorough, lengthen=lengthen)


def _model_key(model: str | None, device: str, dtype: str) -> tuple[str, str | None, str, str]:
    """(name, fingerprint or None, device key, dtype) of MODEL here, without loading it."""
    from pardec_cli.doctor import find_model, model_native
    from pardec_cli.hardware import detect_hardware
    from pardec_cli.selection.tuned import fingerprint_directory

    name, path, _repo = find_model(model)
    hardware = detect_hardware(device, dtype, blocks4=model_native(model))
    return name, fingerprint_directory(path) if path else None, hardware.key, hardware.dtype


def show_results(model: str | None, device: str, dtype: str, as_json: bool) -> None:
    from dataclasses import asdict

    from pardec_cli.selection.tuned import scan_results, tuned_dir
    from pardec_cli.tuning.tuner import describe_results

    found, broken = scan_results()
    for exc in broken:
        click.echo(f"pardec: warning: {exc.message} ({exc.hint})", err=True)
    name, fingerprint, device_key, dtype_name = _model_key(model, device, dtype)
    if model is not None:
        found = [r for r in found if r.model == name or r.fingerprint == fingerprint]
    if as_json:
        data = []
        for r in found:
            item = asdict(r)
            item["path"] = str(r.path)
            item["curve"] = r.curve.to_dict() if r.curve else None
            item["applies_here"] = r.matches(fingerprint or "", device_key, dtype_name)
            data.append(item)
        click.echo(json.dumps(data, indent=1))
        return
    if not found:
        click.echo(f"no tuned results yet (in {tuned_dir()}): `pardec tune` measures them")
        return
    for index, results in enumerate(found):
        if index:
            click.echo()
        applies = results.matches(fingerprint or "", device_key, dtype_name) if results.model == name or \
            results.fingerprint == fingerprint else None
        for line in describe_results(results, applies=applies):
            click.echo(line)
        if sys.stdout.isatty():  # pictures for people; pipes get the lines above only
            from pardec_cli.plots import tune_figures

            click.echo()
            click.echo(tune_figures(results, width=min(shutil.get_terminal_size().columns, 100), color=True))


def reset_results(model: str | None) -> None:
    from pardec_cli.doctor import find_model
    from pardec_cli.selection.tuned import fingerprint_directory, remove_results, scan_results

    found, broken = scan_results()
    # Files that are not valid cannot say which model they are for, and are of no use to
    # any: --reset removes them whatever MODEL is (it is the documented fix).
    for exc in broken:
        path = getattr(exc, "path", None)
        if path is not None and path.is_file():
            path.unlink()
            click.echo(f"removed {path} (it was not valid)")
    name, path, _repo = find_model(model)
    fingerprint = fingerprint_directory(path) if path else None
    mine = [r for r in found if r.model == name or (fingerprint and r.fingerprint == fingerprint)]
    if not mine:
        if not broken:
            click.echo(f"no tuned results for {name}: nothing to remove")
        return
    for removed in remove_results(mine):
        click.echo(f"removed {removed}")


def run_tune(model: str | None, dtype: str, device: str, offline: bool | None, profile: str, budget: float,
             prompts_file: Path | None, methods_text: str, max_tokens: int, weights: str = "auto",
             compile: str = "auto", *, thorough: bool = False, lengthen: bool = False) -> None:
    from pardec_cli.errors import PardecUsageError
    from pardec_cli.planning import AUTO, load_profiles_checked
    from pardec_cli.methods.registry import get_spec
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.session import Session
    from pardec_cli.tuning.tuner import Tuner, TuneRequest, describe_profile

    methods = [m.strip() for m in methods_text.split(",") if m.strip()]
    for name in methods:
        if name == AUTO:
            raise PardecUsageError("--methods takes method names; auto is what tune informs")
        get_spec(name)  # unknown names fail before the model loads
    if profile != "all":
        load_profiles_checked(profile)
    profiles = list(load_profiles()) if profile == "all" else [profile]
    request = TuneRequest(profiles, budget * 60, max_tokens, prompts_file, methods, thorough=thorough, lengthen=lengthen)
    with loading_status("loading model"):
        session = Session.load(model, dtype=dtype, device=device, offline=offline, progress=is_terminal(sys.stderr),
                               compile=compile, notice=compile_notice, weights=weights, measuring=True)
    view = ProgressView(budget * 60)
    tuner = Tuner(session, request, on_event=view.show)
    click.echo(f"pardec tune: {session.model_name} in {session.dtype} on {tuner.hardware.name}; "
               f"{', '.join(profiles)}; budget {budget:g} min{' (thorough)' if thorough else ''}", err=True)
    view.start()
    try:
        results = tuner.run()
    except KeyboardInterrupt:
        view.stop()
        path = tuner.results.path
        runs = sum(len(p.runs) for p in tuner.results.profiles.values())
        where = f" in {path}" if path else ""
        click.echo(f"pardec: interrupted: {runs} measured runs kept{where}; run the same command again to resume",
                   err=True)
        raise
    finally:
        view.stop()
    click.echo(f"measured on {tuner.hardware.name}, {session.dtype} ({results.path}):")
    if results.curve is not None:
        click.echo(f"  cost curve: verifying n tokens costs {results.curve.describe((8, 16, 32))} one "
                   f"(1 token: {results.curve.base_ms:.1f} ms)")
    for name in profiles:
        tuned = results.profiles.get(name)
        if tuned is None:
            continue
        click.echo(f"  {name}: {len(tuned.runs)} runs on {tuned.prompts} prompts, {tuned.max_new_tokens} tokens each")
        for line in describe_profile(tuned):
            click.echo(f"    {line}")
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.planning import ALL_SETTINGS, Settings, plan_reply

    selector = session.auto_selector(refresh=True)
    settings = Settings(max_tokens=max_tokens, sampling=SamplingParams(), stop=(), system=None, raw=False)
    known = load_profiles()
    click.echo("auto now picks:")
    for name in profiles:
        plan = plan_reply("", method=AUTO, options={}, profile=name, settings=settings, user_set=ALL_SETTINGS,
                          profiles=known, selector=selector)
        click.echo(f"  {name:<10} {plan.choice.label} ({plan.choice.estimate.describe()})")


class ProgressView:
    """Tune's progress on stderr from its first second: on a terminal a rich progress bar
    over the time budget (stage, runs, best so far, elapsed); in a pipe a line per phase."""

    def __init__(self, budget_s: float, *, tty: bool | None = None) -> None:
        self.budget_s = budget_s
        self.start_time = perf_counter()
        self.phase: tuple[str | None, str] | None = None
        self.tty = is_terminal(sys.stderr) if tty is None else tty
        self.progress: Any = None
        self.task: Any = None

    def start(self) -> None:
        """Show the bar now (before the first measurement: warming up and timing take seconds)."""
        self.start_time = perf_counter()
        if not self.tty:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            # plain text: a label such as pld[num_draft=8] is not rich markup
            SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(bar_width=24),
            TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn(), TextColumn("of {task.fields[budget]}"),
            console=Console(stderr=True), transient=True, refresh_per_second=4,
        )
        self.task = self.progress.add_task("starting", total=self.budget_s, detail="", budget=_clock(self.budget_s))
        self.progress.start()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def _update(self, description: str | None = None, detail: str | None = None) -> None:
        if self.progress is None:
            return
        fields: dict[str, Any] = {"completed": min(perf_counter() - self.start_time, self.budget_s)}
        if description is not None:
            fields["description"] = description
        if detail is not None:
            fields["detail"] = detail
        self.progress.update(self.task, **fields)

    def _say(self, text: str) -> None:
        """A line that stays (above the bar on a terminal)."""
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            click.echo(text, err=True)

    def show(self, event: Any) -> None:
        elapsed = perf_counter() - self.start_time
        if event.stage == "stage":
            self._update(event.message, "")
            return
        if event.stage == "curve":
            self._update("cost curve", f"{event.done}/{event.total} forwards")
            if event.done == event.total:
                self._say(f"pardec: cost curve measured ({_clock(elapsed)})")
            return
        if event.stage in ("skip", "note", "done"):
            text = event.message if event.stage != "done" else \
                f"{event.profile}: search {'finished' if event.message == 'done' else 'stopped: ' + event.message} ({_clock(event.done)})"
            self._say(f"pardec: {text}")
            return
        progress = event.progress
        phase = (event.profile, progress.phase)
        if phase != self.phase and self.progress is None:
            click.echo(f"pardec: {event.profile}: {progress.phase}", err=True)
        self.phase = phase
        # Screening measures each candidate on one prompt: too little to name a leader.
        best = (f"leading {progress.best} {progress.best_speedup:.2f}x"
                if progress.best and progress.best_speedup and progress.phase != "screen" else "")
        runs = f"{progress.done}/{max(progress.planned, progress.done)} runs"
        self._update(f"{event.profile}: {progress.phase}", f"{runs}  {best}".rstrip())


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"
