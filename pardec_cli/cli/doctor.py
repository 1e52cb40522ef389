"""`pardec doctor`: what pardec sees on this machine, and what `--method auto` would do."""

from __future__ import annotations

import json
from typing import Any

import click

from pardec_cli.cli.completion import complete_model
from pardec_cli.weight_modes import WEIGHT_MODES


def _gib(n: int | None) -> str:
    return "?" if not n else f"{n / 1024**3:.1f} GiB"


def _params(n: int | None) -> str:
    if not n:
        return "? parameters"
    return f"{n / 1e9:.2f}B parameters" if n >= 1e9 else f"{n / 1e6:.1f}M parameters"


@click.command()
@click.option("-m", "--model", "model", default=None, metavar="MODEL", shell_complete=complete_model,
              help="The model to report auto's choices for. Default: the embedded SmolLM2-135M-Instruct.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:N]", help="As for pardec gen.")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              help="As for pardec gen.")
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="Measure the floor: memory bandwidth (a read test, and a copy test beside it) and MODEL's one-token forward against it "
              "(a few seconds). --no-measure answers at once.")
@click.option("--compile", "compile", type=click.Choice(["auto", "off", "on"]), default="auto", show_default=True,
              help="The runner MODEL's forward is measured on: auto, what a short gen uses (the native step where the "
              "model is one it takes, else eager); on, the compiled runner (compiles first, tens of seconds); off, eager.")
@click.option("--weights", default="auto", show_default=True, type=click.Choice(WEIGHT_MODES),
              help="As for pardec gen: the weights MODEL's floor and forward are measured with, and auto's "
              "picks shown for (auto: what gen uses).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def doctor(model: str | None, device: str, dtype: str, measure: bool, compile: str, weights: str, as_json: bool) -> None:
    """Show the hardware, versions, models and accelerators pardec sees, what
    --method auto would pick for each task profile with MODEL (and why: tuned
    measurements or profile priors), and how far MODEL's decoding step is from the
    hardware's floor.

    \b
    The floor: one forward must read the model's weights, so it cannot take less than
    (bytes of weights) / (memory read bandwidth). doctor measures the bandwidth with a
    short read test (and a copy test, whose read + written rate some CPUs double), then
    times a one-token forward over a 300-token context on the runner that gen uses, and
    prints it as a multiple of that floor (1.0x = at the floor). The keys and values that
    forward attends to are a second line: bytes read too, small at 300 tokens, growing
    with a chat's length.

    With --no-measure, on a machine without a GPU driver, this does not import torch,
    so it answers at once.
    """
    from pardec_cli import doctor as report_lib

    machine, hardware = report_lib.machine(device, dtype, model, weights)
    report = {
        "versions": report_lib.versions(),
        "machine": machine,
        "models": report_lib.models(),
        "profiles": report_lib.profiles_report(),
        "vllm": report_lib.vllm_report(),
        "model": report_lib.auto_report(model, hardware, weights=weights),
        "compiled": report_lib.compiled_runner_report(),
    }
    report["floor"] = report_lib.floor_report(model, hardware, report["model"], compile=compile, weights=weights) \
        if measure else None
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in format_report(report):
        click.echo(line)


def format_report(report: dict[str, Any]) -> list[str]:
    """The text report, a few aligned lines per section."""
    v, m = report["versions"], report["machine"]
    torch = v["torch"] or "not installed"
    if v["torch"]:
        torch += f" (CUDA {v['torch_cuda']})" if v["torch_cuda"] else f" (ROCm {v['torch_rocm']})" if v["torch_rocm"] else " (CPU build)"
    lines = [
        f"pardec {v['pardec']} · Python {v['python']} · torch {torch} · transformers {v['transformers'] or 'not installed'}",
        "",
        "machine",
    ]
    cpu = m["cpu"]
    features = [name for key, name in (("avx2", "AVX2"), ("avx512", "AVX512"), ("avx512_bf16", "AVX512-bf16"), ("amx_bf16", "AMX-bf16")) if cpu[key]]
    lines.append(f"  cpu       {cpu['model'] or 'unknown'}, {cpu['logical_cores']} logical cores; "
                 f"{', '.join(features) or 'no AVX2/AVX512/AMX'}")
    lines.append(f"  memory    {_gib(m['ram_bytes'])} ({_gib(m['ram_available_bytes'])} available)")
    if m["gpus"]:
        for g in m["gpus"]:
            lines.append(f"  gpu {g['index']}     {g['name']}, {_gib(g['memory_bytes'])}, compute {g['capability']}, "
                         f"bf16 {'yes' if g['bf16'] else 'no'}")
    else:
        lines.append("  gpus      none")
    est = m["estimate"]
    lines.append(f"  runs on   {m['device']} in {m['dtype']} (class {m['hardware_class']}; estimate from "
                 f"{est['source']}: ~{est['bandwidth_gbs']:g} GB/s, ~{est['gflops']:g} GFLOPS)")
    lines += ["", "models"]
    if report["models"]:
        for model in report["models"]:
            accs = ", ".join(f"{a['name']} ({a['kind']}, {a['status']})" for a in model["accelerators"]) or "no accelerators"
            lines.append(f"  {model['name']:<24} {model['source']:<9} {accs}")
    else:
        lines.append("  none yet (the embedded model is converted on first use; `pardec pull MODEL` adds more)")
    profiles = report["profiles"]
    names = ", ".join(f"{n}{'' if len(p['sources']) == 1 and 'built-in' in p['sources'][0] else ' (yours)'}"
                      for n, p in profiles["profiles"].items())
    lines += ["", f"profiles    {names}   (your own: {profiles['user_dir']})"]
    lines += _vllm_lines(report["vllm"])
    lines += _model_lines(report["model"])
    lines += _compiled_lines(report["compiled"])
    if report.get("floor"):
        lines += _floor_lines(report["floor"], report["model"]["name"])
    return lines


def _floor_lines(floor: dict[str, Any], name: str) -> list[str]:
    lines = ["", f"floor of {name}",
             f"  memory        {floor['bandwidth_gbs']:.1f} GB/s read on {floor['device']} ({floor['bandwidth_source']}; "
             f"a copy test moves {floor['copy_gbs']:.1f} GB/s, read + written)"]
    if floor.get("problem"):
        return [*lines, f"  {floor['problem']}"]
    lines.append(f"  weights       {floor['weight_bytes'] / 1e6:.1f} MB read by one forward ({floor['dtype']}, "
                 f"{floor['weights']} weights, {floor['runner']} step)")
    if "huge_pages" in floor:  # CPU only
        lines.append(f"  pages         {_pages(floor['huge_pages'], floor.get('huge_page_bytes'))}")
    lines.append(f"  floor         {floor['floor_ms']:.2f} ms per forward (weights / read bandwidth)")
    lines.append(f"  forward       {floor['forward_ms']:.2f} ms for one token over a {floor['context_tokens']}-token "
                 f"context: {floor['multiple']:.2f}x the floor ({floor['copy_multiple']:.2f}x one at the copy test's rate)")
    if "cache_bytes" in floor:
        lines.append(f"  with cache    {floor['cache_bytes'] / 1e6:.1f} MB of keys and values ({floor['cache_dtype']}) read too: "
                     f"{floor['cache_floor_ms']:.2f} ms, the forward {floor['cache_multiple']:.2f}x that")
    return lines


def _pages(setting: str | None, huge_bytes: int | None) -> str:
    """Where the weights are: on 2 MB pages (`hugepages`), or why not."""
    if setting is None:
        return "4 KB pages (this system has no transparent huge pages)"
    if setting == "never" or not huge_bytes:
        return f"4 KB pages (transparent huge pages: {setting})"
    return f"{huge_bytes / 1e6:.0f} MB of this process on 2 MB pages (transparent huge pages: {setting})"


def _compiled_lines(compiled: dict[str, Any]) -> list[str]:
    cache = (f"{compiled['cache_files']} files, {compiled['cache_bytes'] / 2**20:.0f} MiB" if compiled["cache_files"]
             else "empty: nothing compiled yet")
    breakeven, saved_even = compiled["break_even_tokens"], compiled["break_even_saved_tokens"]
    others = "".join(f", {tokens}+ on {device.upper()}" for device, tokens in breakeven.items() if device != "cpu")
    steps = compiled["saved_steps"]
    if steps:
        kinds = ", ".join(sorted({step["kind"] for step in steps}))
        saved = (f"{len(steps)} in {compiled['steps_dir']} ({kinds}; "
                 f"{sum(step['bytes'] for step in steps) / 2**20:.0f} MiB): later runs load them in seconds")
    else:
        saved = "none yet: the first compiled run (bench, tune, serve, or gen/chat --compile on) saves them"
    return [
        "", "compiled runner (--compile)",
        f"  compiler      {compiled['cxx_compiler'] or 'no C++ compiler found: CPU steps run eagerly (install g++)'}",
        *(f"  {'kernels' if i == 0 else '':<13} {line}" for i, line in enumerate(_kernels_lines(compiled["int4_kernels"]))),
        f"  cache         {compiled['cache_dir']} ({cache})",
        f"  saved steps   {saved}",
        f"  auto          compiles for bench, tune and serve, and for gen/chat work of {breakeven['cpu']}+ tokens on CPU"
        f" ({saved_even['cpu']}+ once the model's steps are saved){others}",
    ]


def _kernels_lines(k: dict[str, Any]) -> list[str]:
    """pardec's own kernel libraries: what each does here, a line each (the AVX512 one for
    bfloat16, the AVX2 one for float32; an AVX512 CPU runs both)."""
    lines = []
    uses = ", ".join(what for name, what in (("bfloat16", "int4, int8 and full weights in bfloat16"), ("int8", "--weights q4q8 in bfloat16")) if k[name])
    if uses:
        lines.append(_library_line(uses, k["status"], k["dir"], "in bfloat16", k["enabled"]))
    if k.get("float32"):
        lines.append(_library_line("full, int8, q4q8 and q8q8 weights in float32", k["avx2_status"], k["avx2_dir"],
                                   "in float32", k["enabled"]))
    return lines or ["torch's (this CPU lacks AVX2, FMA and F16C for pardec's)"]


def _library_line(uses: str, status: str, directory: str, first: str, enabled: bool) -> str:
    if not enabled:
        return f"torch's (PARDEC_KERNELS=0); pardec's would run {uses}"
    if status == "built":
        return f"pardec's, built in {directory}: {uses}"
    if status == "not built":
        return f"pardec's for {uses}: not built yet (the first load {first} builds them in the background)"
    return f"pardec's for {uses}: {status} ({directory})"


def _vllm_lines(vllm: dict[str, Any]) -> list[str]:
    """Whether `--engine vllm` works here, and what it can run."""
    state = f"vllm {vllm['version']} installed" if vllm["version"] else f"vllm not installed ({vllm['install']})"
    runs = ", ".join(name if name == target else f"{name} (as {target})" for name, target in vllm["runs"].items())
    lacks = ", ".join(f"{name} (closest: {v['closest']})" for name, v in vllm["not"].items())
    return ["", f"engines     pardec; {state}",
            f"  on vllm   {runs}",
            f"  not       {lacks}"]


def _model_lines(model: dict[str, Any]) -> list[str]:
    lines = ["", f"auto with {model['name']}"]
    if model.get("problem"):
        return [*lines, f"  {model['problem']}"]
    lines[-1] += f" ({_params(model.get('parameters'))}, {model.get('layers')} layers)"
    accs = ", ".join(f"{a['ref']} ({a['kind']})" for a in model["accelerators"]) or "none installed"
    lines.append(f"  accelerators  {accs}")
    tuned = model["tuned"]
    lines.append(f"  tuned         {'profiles ' + ', '.join(tuned['profiles']) + ' on ' + tuned['updated'][:10] if tuned else 'not yet (`pardec tune`)'}")
    curve = model.get("curve")
    if curve:
        rel = ", ".join(f"{n}: {r}x" for n, r in curve["relative"].items())
        lines.append(f"  cost curve    verifying n tokens costs {rel} one ({curve['source']})")
    for note in model.get("notes", []):
        lines.append(f"  note          {note}")
    learned = model.get("learned")
    if learned is not None:
        lines.append(f"  learned       {learned}")
    for profile, pick in model["auto"].items():
        basis = {"measured": "measured here", "prior": "profile prior",
                 "baseline": "nothing expected to beat it"}[pick["basis"]]
        lines.append(f"  {profile:<13} {pick['label']:<40} {pick['expected_speedup']:.2f}x expected ({basis})")
        for m in pick.get("measured", [])[:5]:
            spread = f" ({m['low']:.2f}-{m['high']:.2f})" if m["runs"] > 1 else ""
            lines.append(f"  {'':<15}measured {m['label']}: {m['speedup']:.2f}x{spread} over {m['runs']} run{'s' * (m['runs'] != 1)} ({m['source']})")
    return lines
