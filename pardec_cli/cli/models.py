"""`pardec pull`, `list`, `show`, `rm` and `import`: the models on this machine.

Thin: parse, call `pardec_cli.store`, print. Results go to stdout, progress and
diagnostics to stderr (progress bars only when stderr is a terminal). The store modules
are imported inside the commands, so `pardec --help` stays light.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _stderr_is_terminal() -> bool:
    return _is_terminal(sys.stderr)


def _stdin_is_terminal() -> bool:
    return _is_terminal(sys.stdin)


def _complete_model(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Tab completion of MODEL: the names `pardec gen -m` completes."""
    from pardec_cli.cli.completion import complete_model

    return complete_model(ctx, param, incomplete)


def _say(message: str) -> None:
    click.echo(f"pardec: {message}", err=True)


def _size(n: int | None) -> str:
    from pardec_cli.store.pull import human_size

    return "-" if n is None else human_size(n)


def _ago(stamp: str | None) -> str:
    """'3 min ago' from a timestamp written by `records.now()`."""
    from pardec_cli.store.records import parse_stamp

    if not stamp:
        return "never"
    moment = parse_stamp(stamp)
    if moment is None:
        return stamp
    seconds = time.time() - moment.timestamp()
    for unit, length in (("day", 86400), ("hour", 3600), ("min", 60)):
        if seconds >= length:
            count = int(seconds // length)
            plural = "s" if count > 1 and unit != "min" else ""
            return f"{count} {unit}{plural} ago"
    return "just now"


def _offline(flag: bool | None) -> bool:
    from pardec_cli.store.resolve import env_offline

    return env_offline() if flag is None else flag


# ----------------------------------------------------------------------- pull


@click.command()
@click.argument("model", shell_complete=_complete_model)
@click.option("--no-drafters", is_flag=True, help="Only the model: no drafters, Medusa or EAGLE heads.")
@click.option("--drafter", "drafters", multiple=True, metavar="NAME",
              help="Pull only this accelerator (alias or Hub id; repeatable) instead of all the catalog lists.")
@click.option("--revision", default=None, metavar="REV", help="Branch, tag or commit of the model (default: the catalog's, else main).")
@click.option("--offline", is_flag=True, default=None, help="Never contact the Hub: only check and record what is already cached (also HF_HUB_OFFLINE=1).")
def pull(model: str, no_drafters: bool, drafters: tuple[str, ...], revision: str | None, offline: bool | None) -> None:
    """Download MODEL and its accelerators into the Hugging Face cache.

    MODEL is a catalog alias (`pardec list --available` lists them, `pardec show ALIAS`
    describes one) or any Hub id org/name.
    Only the files a model needs are fetched; a second pull downloads nothing, and an
    interrupted pull resumes with the files it had finished. Each drafter's tokenizer
    is checked against the model's: a mismatch is an error that names the difference.

    \b
    Examples:
      pardec pull smollm2-1.7b                    the model and its two drafters
      pardec pull qwen2.5-7b --drafter qwen2.5-0.5b
      pardec pull HuggingFaceTB/SmolLM2-360M-Instruct --no-drafters
    """
    from pardec_cli.errors import PardecError
    from pardec_cli.store.pull import pull_model

    start = time.perf_counter()
    result = pull_model(
        model, revision=revision, no_drafters=no_drafters, drafters=drafters,
        offline=_offline(offline), progress=_stderr_is_terminal(), say=_say,
    )  # fmt: skip
    record = result.record
    target = record.target
    on_disk = target.size + sum(a.size for a in record.accelerators)
    got = f"downloaded {_size(result.downloaded_bytes)}" if result.downloaded_bytes else "nothing to download"
    click.echo(f"{record.name}: {got} in {time.perf_counter() - start:.1f} s; "
               f"{_size(on_disk)} on disk with accelerators ({target.repo} {target.revision} @ {target.commit[:8]})")  # fmt: skip
    for acc in record.accelerators:
        detail = f": {acc.detail}" if acc.detail else ""
        click.echo(f"  {acc.kind:<8} {acc.name or acc.repo}  {acc.status}{detail}")
    if result.removed_bytes:
        click.echo(f"  removed the previous revision ({_size(result.removed_bytes)})")
    if result.problems:
        more = f" (and {len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
        raise PardecError(
            result.problems[0] + more,
            hint="the model itself was pulled; choose accelerators with --drafter NAME, "
            "or skip them with --no-drafters",
        )


# ----------------------------------------------------------------------- list


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.option("-a", "--available", is_flag=True,
              help="List the catalog instead: every alias `pardec pull` knows, its size, what it brings "
              "(drafters, Medusa/EAGLE heads) and whether it is here.")
def list_models(as_json: bool, available: bool) -> None:
    """List the models on this machine: pulled, imported and embedded.

    Columns: the name to pass to -m, its catalog alias, where it came from, its size on
    disk, its accelerators (with their compatibility) and when it was last used.
    With --available: the catalog of models that can be pulled.

    \b
    Examples:
      pardec list                  what is here
      pardec list --available      what `pardec pull ALIAS` can fetch
      pardec show qwen2.5-7b       one entry in detail, installed or not
    """
    from pardec_cli.store.records import broken_records

    if available:
        _list_catalog(as_json)
        return
    from pardec_cli.store.inventory import list_models as inventory

    models = inventory()
    for broken in broken_records():
        _say(f"warning: {broken.message} ({broken.hint})")
    if as_json:
        click.echo(json.dumps([m.to_dict() for m in models], indent=2))
        return
    if not models:
        _say("no models yet: `pardec list --available` shows what can be pulled, "
             "`pardec pull ALIAS` downloads one")  # fmt: skip
        return
    rows = [("NAME", "ALIAS", "SOURCE", "SIZE", "ACCELERATORS", "LAST USED")]
    for m in models:
        accs = ", ".join(
            f"{a['name']} ({a['method']}{'' if a['status'] == 'compatible' else ', ' + a['status']})"
            for a in m.accelerators
        )
        source = m.source if m.complete else f"{m.source} (files missing)"
        rows.append((m.name, m.alias or "-", source, _size(m.size), accs or "-", _ago(m.last_used)))
    _table(rows)


def _table(rows: list[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell; the last one is left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


def accelerators_text(accelerators: list[dict[str, Any]]) -> str:
    """"drafters qwen2.5-0.5b*, qwen2.5-1.5b; heads Medusa, EAGLE" (* = installed here)."""
    groups: dict[str, list[str]] = {}
    for acc in accelerators:
        mark = "*" if acc["installed"] else ""
        groups.setdefault(acc["kind"], []).append(acc["name"] + mark)
    parts = []
    drafters = groups.pop("drafter", [])
    if drafters:
        parts.append(("drafters " if len(drafters) > 1 else "drafter ") + ", ".join(drafters))
    heads = [_HEAD_NAMES.get(kind, kind) + ("*" if any(n.endswith("*") for n in names) else "")
             for kind, names in groups.items()]
    if heads:
        parts.append("heads " + ", ".join(heads))
    return "; ".join(parts) or "-"


_HEAD_NAMES = {"medusa": "Medusa", "eagle": "EAGLE", "eagle3": "EAGLE-3"}


def _list_catalog(as_json: bool) -> None:
    from pardec_cli.store.inventory import catalog_rows

    rows = catalog_rows()
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = [("ALIAS", "PARAMS", "DOWNLOAD", "HERE", "ACCELERATORS")]
    for row in rows:
        e = row.entry
        download = "~" + _short_size(e.approx_download_bytes) if e.approx_download_bytes else "-"
        here = row.installed or "-"
        table.append((e.alias, e.params or "-", download, here, accelerators_text(row.accelerators)))
    _table(table)
    click.echo()
    click.echo("DOWNLOAD: the model alone, 16 bits a weight (a pull adds its accelerators; * = already here).")
    click.echo("`pardec show ALIAS` describes one; `pardec pull ALIAS` downloads it.")


def _short_size(n: int) -> str:
    """"270 MB", "3.4 GB": two or three significant digits, for a column."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


# ----------------------------------------------------------------------- show


@click.command()
@click.argument("model", shell_complete=_complete_model)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(model: str, as_json: bool) -> None:
    """Describe MODEL: architecture, size, files, accelerators, path.

    A catalog alias that is not installed is described from the catalog: its Hub
    repo, size, what it brings and how to pull it.
    """
    from pardec_cli.errors import ModelNotFoundError
    from pardec_cli.store.inventory import describe_catalog_entry, show_model

    try:
        info = show_model(model)
    except ModelNotFoundError:
        entry = describe_catalog_entry(model)
        if entry is None:
            raise
        _show_catalog_entry(entry, as_json)
        return
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    config = info["config"]
    params = config["parameters"]
    params_text = "-" if params is None else ("" if config["parameters_exact"] else "~") + _params(params)
    where = info["repo"] or ""
    if info.get("revision"):
        where += f" {info['revision']} @ {(info.get('commit') or '')[:8]}"
    lines = [
        ("name", info["name"] + (f" (alias {info['alias']})" if info["alias"] and info["alias"] != info["name"] else "")),
        ("source", f"{info['source']}" + (f", {where}" if where else "")),
        ("path", info["path"]),
        ("architecture", f"{config['architecture'] or '-'} ({config['model_type'] or '?'})"),
        ("parameters", params_text),
        ("layers", str(config["layers"] or "-")),
        ("hidden size", str(config["hidden_size"] or "-")),
        ("context", f"{config['context_length']} tokens" if config["context_length"] else "-"),
        ("vocabulary", str(config["vocab_size"] or "-")),
        ("dtype", str(config["dtype"] or "-")),
        ("chat template", "yes" if config["chat_template"] else "no (prompts are sent raw)"),
        ("size", f"{_size(info['size_bytes'])} in {len(info['files'])} files"),
        ("last used", _ago(info["last_used"])),
    ]
    if info.get("chat_template_notes"):
        lines.append(("chat format", info["chat_template_notes"]))
    if info.get("notes"):
        lines.append(("notes", info["notes"]))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key.ljust(width)}  {value}")
    click.echo("files")
    for file in info["files"]:
        click.echo(f"  {file['name']}  {_size(file['size_bytes'])}")
    click.echo("accelerators" + ("" if info["accelerators"] else "  none known"))
    for acc in info["accelerators"]:
        detail = f" ({acc['detail']})" if acc.get("detail") else ""
        click.echo(f"  {acc['name']}  --method {acc['method']}  {acc['status']}{detail}")


def _show_catalog_entry(info: dict[str, Any], as_json: bool) -> None:
    """`pardec show ALIAS` for an alias that is not on this machine."""
    from pardec_cli.store.catalog import accelerator_noun

    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    download = f"~{_size(info['download_bytes_estimate'])} to download (16-bit weights)" \
        if info["download_bytes_estimate"] else "unknown until pulled"
    lines = [
        ("name", f"{info['alias']} (catalog alias)"),
        ("description", info["description"] or "-"),
        ("repo", info["repo"] + (f" @ {info['revision']}" if info["revision"] else "")),
        ("family", info["family"]),
        ("parameters", info["params"] or "-"),
        ("size", download),
        ("installed", info["installed"] or f"no: `pardec pull {info['alias']}` downloads it"),
    ]
    if info["chat_template_notes"]:
        lines.append(("chat format", info["chat_template_notes"]))
    if info["notes"]:
        lines.append(("notes", info["notes"]))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key.ljust(width)}  {value}")
    click.echo("accelerators" + ("" if info["accelerators"] else "  none in the catalog"))
    for acc in info["accelerators"]:
        state = "installed" if acc["installed"] else "pulled with the model"
        repo = f" ({acc['repo']})" if acc["repo"] != acc["name"] else ""
        click.echo(f"  {accelerator_noun(acc['kind'])}: {acc['name']}{repo}  --method {acc['method']}  {state}")


def _params(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


# ------------------------------------------------------------------------- rm


@click.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL...", shell_complete=_complete_model)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--hf-cache", is_flag=True,
              help="Also delete the model's whole Hugging Face cache folder, including files pardec did not download.")
def rm(models: tuple[str, ...], yes: bool, hf_cache: bool) -> None:
    """Remove MODEL... from this machine; report the space freed.

    Removes only what pardec pulled for a model (its files and accelerators, except
    those another pulled model still uses) or imported into its store. Asks first on a
    terminal; -y skips the question.
    """
    from pardec_cli.errors import PardecError
    from pardec_cli.store.inventory import plan_removal

    plans = [p for spec in models for p in plan_removal(spec, hf_cache=hf_cache)]
    for plan in plans:
        click.echo(f"{plan.description}: {_size(plan.size)}", err=True)
        for kept in plan.kept:
            click.echo(f"  keeping {kept}", err=True)
    if not yes and _stdin_is_terminal():
        if not click.confirm("Remove?", default=False, err=True):
            raise PardecError("nothing removed: not confirmed", hint="answer y, or pass -y")
    total = 0
    for plan in plans:
        freed = plan.run()
        total += freed
        click.echo(f"removed {plan.name} (freed {_size(freed)})")
        for problem in plan.problems:
            _say(f"warning: {problem}")
    if len(plans) > 1:
        click.echo(f"freed {_size(total)} in total")


# --------------------------------------------------------------------- import


def default_import_name(path: Path) -> str:
    """A store name from a GGUF file name: lower case, other characters as '-'."""
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.stem
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return name or "imported"


@click.command(name="import")
@click.argument("file", type=click.Path(path_type=Path), metavar="FILE.gguf")
@click.option("--name", default=None, help="Name in pardec's store (default: from the file name).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]),
              help="Dtype the dequantized weights are saved in (float32 keeps greedy output bit-exact).")
@click.option("--force", is_flag=True, help="Replace a model of the same name.")
@click.option("--source-repo", default=None, metavar="ORG/NAME", help="Hub id the GGUF was made from (recorded).")
@click.option("-q", "--quiet", is_flag=True, help="No progress display (it is shown only on a terminal anyway).")
def import_gguf(file: Path, name: str | None, dtype: str, force: bool, source_repo: str | None, quiet: bool) -> None:
    """Convert a GGUF file (llama.cpp) into a model in pardec's store.

    Llama-family files keep their quantized blocks (the store takes about the file's
    size): Q4_0, Q4_1, Q4_K and Q8_0 run on pardec's 4- and 8-bit CPU kernels, other
    types (Q5, Q6_K, ...) are dequantized when the model loads and, with --weights auto,
    run on the 8-bit one (each layer in its own width). Other architectures are
    dequantized by transformers into --dtype. The model is saved with its tokenizer and
    chat template, then runs with -m NAME.
    """
    from pardec_cli.errors import PardecError
    from pardec_cli.home import models_dir
    from pardec_cli.store.gguf_import import _check_gguf_path, gguf_architecture
    from pardec_cli.store.gguf_import import import_gguf as convert
    from pardec_cli.store.inventory import _dir_size
    from pardec_cli.store.layout import check_model_name, is_complete

    _check_gguf_path(file.expanduser())
    architecture = gguf_architecture(file.expanduser())
    name = check_model_name(name or default_import_name(file))
    if is_complete(models_dir() / name) and not force:
        raise PardecError(
            f"a model named {name!r} already exists in {models_dir()}",
            hint="choose another --name, or pass --force to replace it",
        )
    from pardec_cli.progress import ProgressDisplay, progress_wanted
    from pardec_cli.store.loading import start_native_build
    from pardec_cli.store.quantized import is_quantized_dir

    if not quiet:
        _say(f"converting {file.name} ({architecture}) into {name}; big models take minutes")
    # The conversion is Python on one core: the native step's kernels, which run the GGUF's
    # blocks, build beside it (once for this machine) for the runs that follow.
    if start_native_build() and not quiet:
        _say("building pardec's AVX2 kernels for this CPU in the background (once)")
    start = time.perf_counter()
    with ProgressDisplay(progress_wanted(quiet)) as display:
        path = convert(file, name, overwrite=force, source_repo=source_repo, dtype=dtype, report=display.stages())
    kept = "its quantized blocks kept" if is_quantized_dir(path) else f"weights in {dtype}"
    click.echo(f"imported {name} in {time.perf_counter() - start:.1f} s: "
               f"{_size(_dir_size(path))} ({kept}) at {path}; run it with -m {name}")  # fmt: skip
