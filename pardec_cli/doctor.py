"""What `pardec doctor` reports, gathered without printing (the CLI formats it).

The machine (CPU features, memory, GPUs with their class and speed estimate), the
versions that matter, the models and accelerators on this machine, the profiles, and
for one model what `--method auto` would pick per profile and from what (tuned
results or priors), and that model's floor: the memory bandwidth measured by a copy
test, the bytes of weights one forward reads, the time those bytes take at that
bandwidth, and the measured one-token forward as a multiple of it.

On a machine without a GPU driver nothing but the floor (`floor_report`) imports torch:
versions come from package metadata, the model's size from its files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
from pathlib import Path
from typing import Any

from pardec_cli import __version__


def package_version(name: str) -> str | None:
    """An installed distribution's version, without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build() -> dict[str, str | None]:
    """torch's version and the CUDA/ROCm version it was built for, read from
    ``torch/version.py`` instead of importing torch (which takes seconds)."""
    info: dict[str, str | None] = {"version": package_version("torch"), "cuda": None, "rocm": None}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return info
    if spec is None or not spec.submodule_search_locations:
        return info
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text("utf-8")
    except OSError:
        return info
    for key in ("cuda", "hip"):
        match = re.search(rf"^{key}\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if match:
            info["cuda" if key == "cuda" else "rocm"] = match.group(1)
    return info


def versions() -> dict[str, Any]:
    """pardec, Python, torch (with its CUDA/ROCm build), transformers, textual."""
    torch = torch_build()
    return {
        "pardec": __version__,
        "python": platform.python_version(),
        "torch": torch["version"],
        "torch_cuda": torch["cuda"],
        "torch_rocm": torch["rocm"],
        "transformers": package_version("transformers"),
        "textual": package_version("textual"),
        "vllm": vllm_report()["version"],
    }


def vllm_report() -> dict[str, Any]:
    """Whether vLLM is installed (without importing it), and which pardec methods it runs
    (as which vLLM method) or not (and the closest it has)."""
    from pardec_cli.vllm_engine.plan import INSTALL, vllm_version
    from pardec_cli.vllm_engine.translate import TABLE, NotOnVllm

    return {
        "version": vllm_version(),
        "install": INSTALL,
        "runs": {name: r.method or "plain decoding" for name, r in TABLE.items() if not isinstance(r, NotOnVllm)},
        "not": {name: {"why": r.why, "closest": r.closest} for name, r in TABLE.items() if isinstance(r, NotOnVllm)},
    }


def machine(device: str = "auto", dtype: str = "auto", model: str | None = None,
            weights: str = "auto") -> tuple[dict[str, Any], Any]:  # fmt: skip
    """(report, Hardware): the CPU, memory, GPUs, and what --device/--dtype resolve to for
    `model` (`-m`; None: the embedded one) with `--weights` `weights`."""
    from pardec_cli.hardware import (
        available_ram_bytes, cpu_info, cpu_isa, detect_hardware, probe_gpus, total_ram_bytes,
    )

    cpu = cpu_info()
    gpus = probe_gpus() if device != "cpu" else []
    from pardec_cli.selection.estimates import estimate as device_estimate

    hardware = detect_hardware(device, dtype, blocks4=model_native(model, weights))
    speed = device_estimate(hardware)
    flags = {
        "avx2": cpu.has_avx2, "avx512": cpu.has_avx512, "avx512_bf16": cpu.has_avx512_bf16, "amx_bf16": cpu.has_amx_bf16,
    }
    report = {
        "cpu": {"model": cpu.model_name, "logical_cores": cpu.logical_cores, "isa": cpu_isa(cpu), **flags},
        "ram_bytes": total_ram_bytes(),
        "ram_available_bytes": available_ram_bytes(),
        "gpus": [
            {"index": g.index, "name": g.name, "memory_bytes": g.total_memory_bytes,
             "capability": f"{g.capability[0]}.{g.capability[1]}", "bf16": g.has_bf16}
            for g in gpus
        ],
        "device": hardware.device,
        "dtype": hardware.dtype,
        "hardware_class": hardware.hw_class,
        "estimate": {
            "bandwidth_gbs": round(speed.bandwidth_gbs, 1),
            "gflops": round(speed.gflops, 1),
            "source": speed.source,
        },
    }
    return report, hardware


def models() -> list[dict[str, Any]]:
    """Every model on this machine, with its accelerators (as `pardec list --json`)."""
    from pardec_cli.store.inventory import list_models

    return [m.to_dict() for m in list_models()]


def model_native(spec: str | None, weights: str = "auto") -> bool:
    """Whether `--dtype auto` runs the model `-m` names in float32 on the native step with
    `--weights` `weights` (`store.loading.native_auto`: its kernels built, nothing started)."""
    from pardec_cli.store.loading import native_auto

    return native_auto(find_model(spec)[1], weights)


def find_model(spec: str | None) -> tuple[str, Path | None, str | None]:
    """(name, directory or None, repo) of the model `-m` names, without downloading or
    converting: the embedded model is found only once it was converted."""
    from pardec_cli.store.accelerators import local_path
    from pardec_cli.store.embedded import EMBEDDED_ALIAS, EMBEDDED_REPO
    from pardec_cli.store.records import find

    name = (spec or EMBEDDED_ALIAS).strip()
    record = find(name)
    repo = record.target.repo if record else (EMBEDDED_REPO if name == EMBEDDED_ALIAS else None)
    if repo is None:
        from pardec_cli.store.catalog import lookup_alias

        entry = lookup_alias(name)
        repo = entry.repo if entry else (name if "/" in name and not name.startswith((".", "/", "~")) else None)
    return name, local_path(name), repo


def _native_expected(summary: dict[str, Any]) -> bool:
    """Whether `store.inventory.config_summary` describes a Llama decoder with SiLU: what
    the native step computes (`engine.native`; known for sure once the model is loaded).
    A converted GGUF's config names no architectures, only its model type."""
    return (summary.get("model_type") == "llama" and summary.get("architecture") in (None, "LlamaForCausalLM")
            and summary.get("activation") in ("silu", "swish"))


def _kernel_suffix(hardware: Any, held: str, kernels_now: dict[str, Any], *, avx2: bool) -> str:
    """`quant.kernel_suffix` as loading will leave a model held as `held`, without loading
    it: "+pardec" where its layers run pardec's float32 kernels (the AVX2 library, `avx2`)
    or bfloat16 ones (the AVX512 library, built and on; dense layers only without AMX), as
    `store.loading.load_model` decides. `Session.step_kind` names the steps it learned
    about with it: without it doctor read none of what gen, chat and bench recorded."""
    from pardec_cli.store.loading import bf16_kernel_weights
    from pardec_cli.weight_modes import ROUNDED_ACTIVATIONS

    if avx2:
        return "+pardec" if held in (*ROUNDED_ACTIVATIONS, "full", "int8") else ""
    bf16 = (hardware.device == "cpu" and hardware.dtype == "bfloat16" and kernels_now["enabled"] and kernels_now["bfloat16"]
            and kernels_now["status"] == "built")  # fmt: skip
    return "+pardec" if bf16 and bf16_kernel_weights(held) else ""


def auto_report(spec: str | None, hardware: Any, *, weights: str = "auto") -> dict[str, Any]:
    """For one model: its size, accelerators, tuned results, and auto's pick per profile."""
    from pardec_cli.selection.costmodel import ModelShape
    from pardec_cli.selection.profiles import load_profiles
    from pardec_cli.selection.selector import AutoSelector, ModelInfo
    from pardec_cli.store.accelerators import installed_accelerators
    from pardec_cli.store.inventory import config_summary
    from pardec_cli.selection.learned import learned_path, learning_enabled, read_usage, step_kind
    from pardec_cli.selection.tuned import find_results, fingerprint_directory, unusable_results

    name, path, repo = find_model(spec)
    report: dict[str, Any] = {"name": name, "path": str(path) if path else None}
    if path is None:
        report["problem"] = ("the embedded model is converted on first use (`pardec gen` does it)"
                             if spec is None else f"{name} is not on this machine (`pardec pull {name}`)")
        return report
    summary = config_summary(path)
    shape = ModelShape.from_config_summary(summary)
    report.update(parameters=summary.get("parameters"), layers=summary.get("layers"))
    if shape is None:
        report["problem"] = "its size cannot be read from its files"
        return report
    fingerprint = fingerprint_directory(path)
    source = "local" if name.startswith((".", "/", "~")) else None  # as `resolve_model` names a folder
    accelerators = installed_accelerators(name, repo, source=source, path=path)
    tuned = find_results(fingerprint, hardware.key, hardware.dtype)
    notes = unusable_results(name, fingerprint, hardware.key, hardware.dtype)
    report["accelerators"] = [{"kind": a.kind, "ref": a.ref, "parameters": a.parameters} for a in accelerators]
    report["tuned"] = None if tuned is None else {
        "path": str(tuned.path), "updated": tuned.updated, "profiles": sorted(tuned.profiles),
        "curve": tuned.curve.to_dict() if tuned.curve else None,
    }
    report["notes"] = list(notes)
    # What `pardec gen --weights WEIGHTS` of a short reply runs: eager steps, or the native
    # step where the model is one it takes (`engine.native`; known for sure once loaded).
    from pardec_cli.store.quantized import stored_kind
    from pardec_cli.weight_modes import ROUNDED_ACTIVATIONS, resolve_weights

    kernels_now = int4_kernels_report()  # auto's q4q8 and q8q8 in float32 need the AVX2 kernels built
    avx2 = (hardware.device == "cpu" and hardware.dtype == "float32" and kernels_now["enabled"] and kernels_now["float32"]
            and kernels_now["avx2_status"] == "built")  # fmt: skip
    held = resolve_weights(weights, dtype=hardware.dtype, device=hardware.device, stored=stored_kind(path),
                           avx2=avx2)  # fmt: skip
    runner = "native" if held in ROUNDED_ACTIVATIONS and avx2 and _native_expected(summary) else "eager"
    step = step_kind(hardware.dtype, held + _kernel_suffix(hardware, held, kernels_now, avx2=avx2), runner)
    usage = read_usage(fingerprint, hardware.key, step) if learning_enabled() else None
    report["learned"] = (
        "off (learn = false in config.toml, or PARDEC_LEARN=0)" if usage is None else
        f"{sum(len(rows) for by_label in usage.rows.values() for rows in by_label.values())} generations recorded "
        f"in {learned_path()} ({step} steps)"
    )
    selector = AutoSelector(hardware, ModelInfo(name, shape, fingerprint, path, repo), profiles=load_profiles(),
                            accelerators=accelerators, tuned=tuned, usage=usage, notes=notes,
                            learned_curve=usage.curve if usage is not None else None)
    picks = {}
    for profile in selector.profiles:
        choice = selector.choose(None, profile)
        picks[profile] = {
            "method": choice.method, "knobs": choice.knobs, "label": choice.label,
            "expected_speedup": round(choice.estimate.speedup, 3), "basis": choice.estimate.basis,
            "skipped": [f"{label}: {why}" for label, why in choice.skipped],
            # What was measured for this profile on this machine (tune and use), best first.
            "measured": [{"label": m.label, "speedup": round(m.speedup, 3), "low": round(m.low, 3),
                          "high": round(m.high, 3), "runs": m.runs, "tokens_per_step": round(m.tokens_per_step, 3),
                          "source": m.source} for m in selector.ranking(profile)],
        }
        report["curve"] = {"source": choice.curve.source, "relative": {n: round(choice.curve.relative(n), 2) for n in (8, 16, 32, 64)}}
    report["auto"] = picks
    return report


def profiles_report() -> dict[str, Any]:
    """The profiles and where each was read from."""
    from pardec_cli.selection.profiles import load_profiles, user_profiles_dir

    return {
        "user_dir": str(user_profiles_dir()),
        "profiles": {name: {"description": p.description, "sources": list(p.sources)} for name, p in load_profiles().items()},
    }


def compiled_runner_report() -> dict[str, Any]:
    """The compiled runner (`--compile`): whether inductor can build here (it needs a C++
    compiler on CPU), where its on-disk cache is and how big, and when `auto` compiles."""
    import os
    import shutil

    from pardec_cli.engine.compile_policy import BREAK_EVEN_SAVED_TOKENS, BREAK_EVEN_TOKENS
    from pardec_cli.home import compile_cache_dir
    from pardec_cli.session import compiled_steps_dir

    folder = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or compile_cache_dir())
    size, files = 0, 0
    if folder.is_dir():
        for file in folder.rglob("*"):
            if file.is_file():
                files += 1
                size += file.stat().st_size
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    # Precompiled steps, one file per kind of step and model architecture/dtype/layout.
    steps = sorted(compiled_steps_dir().glob("*.pt2"))
    saved = [{"file": step.name, "kind": step.name.rsplit("-", 1)[0], "bytes": step.stat().st_size} for step in steps]
    return {"cxx_compiler": compiler, "cache_dir": str(folder), "cache_bytes": size, "cache_files": files,
            "steps_dir": str(compiled_steps_dir()), "saved_steps": saved,
            "break_even_tokens": dict(BREAK_EVEN_TOKENS), "break_even_saved_tokens": dict(BREAK_EVEN_SAVED_TOKENS),
            "int4_kernels": int4_kernels_report()}


def int4_kernels_report() -> dict[str, Any]:
    """pardec's own int4 kernels (`pardec_cli.kernels`): which this CPU runs, whether they
    are built in the store (or building, or failed and why), and whether they are on."""
    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info
    from pardec_cli.home import kernels_dir

    flags = cpu_info().flags
    directory = kernels.build_dir(kernels_dir())
    avx2 = kernels.build_dir(kernels_dir(), kernels.avx2_library(flags))
    return {"dir": str(directory), "status": kernels.status(directory), "enabled": kernels.enabled(),
            "bfloat16": kernels.cpu_supported(flags, "bfloat16"), "int8": kernels.cpu_supported(flags, "int8"),
            "float32": kernels.avx2_runs(flags),
            "avx2_dir": str(avx2), "avx2_status": kernels.status(avx2)}


# -- the floor: how fast one forward could be, and how fast it is ------------------------

FLOOR_CONTEXT_TOKENS = 300  # as `pardec tune`'s cost curve: a realistic decoding position
FLOOR_FORWARD_REPEATS = 5
#: The forward is measured this many times after the model loads, a read test after each;
#: the floor takes the fastest read, the multiple the fastest forward. On a shared 2-core
#: VM the read test gave 14-28 GB/s from one doctor run to the next, so one test before the
#: load and one forward after it put the multiple anywhere from 1.2x to 1.9x.
FLOOR_ROUNDS = 3


def bandwidth_floor_ms(weight_bytes: int, bandwidth_gbs: float) -> float:
    """The least time one forward can take when it must read `weight_bytes` at
    `bandwidth_gbs` (GB/s = 1e9 bytes/s), in milliseconds."""
    if bandwidth_gbs <= 0:
        raise ValueError("bandwidth must be positive")
    return weight_bytes / (bandwidth_gbs * 1e9) * 1e3


def floor_multiple(forward_ms: float, floor_ms: float) -> float:
    """How many times the floor a measured forward takes (1.0 = at the floor)."""
    return forward_ms / floor_ms


def weight_bytes(model: Any) -> int:
    """Bytes of weights one decoding forward of `model` (a torch module) reads.

    The memory every parameter and buffer spans, each byte once (tied weights are one
    tensor; layers sharing a packed weight hold views of it; weights moved to huge pages
    share a few large storages, `hugepages`), less the scales such layers keep for eager
    steps (`quant.share_products`), less the input embedding when the output layer does
    not multiply through it (untied, or a `quant.Int8Head`'s or `quant.RecordsHead`'s
    copy): a lookup reads a few of its rows.
    The KV cache a forward also reads is left out (small at a few hundred tokens).
    """
    from pardec_cli.quant import Int4Linear, Int8Head, RecordsHead, lookup_only_embedding

    # A layer sharing its group's product reads the group's scales; its own copy serves eager steps.
    unread = {id(m.scales_and_zeros) for m in model.modules() if isinstance(m, Int4Linear) and m.shared_columns is not None}
    # An Int8Head (RecordsHead) multiplies through its int8 (records) copy, a buffer; its dense
    # weight is there for readers of get_output_embeddings() only.
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output, (Int8Head, RecordsHead)):
        unread.add(id(output.weight))
    table = lookup_only_embedding(model)
    if table is not None:
        unread.add(id(table))
    opaque, spans = 0, []
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in unread:
            continue
        if tensor.is_mkldnn:  # an opaque prepacked copy: no memory to look at
            opaque += tensor.numel() * tensor.element_size()
        elif tensor.numel():
            elements = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
            spans.append((tensor.data_ptr(), tensor.data_ptr() + elements * tensor.element_size()))
    total, reached = 0, 0
    for lo, hi in sorted(spans):  # the union of the spans
        total += max(0, hi - max(lo, reached))
        reached = max(reached, hi)
    return opaque + total


def kv_cache_bytes(config: Any, tokens: int, element_size: int) -> int | None:
    """Bytes of keys and values one forward reads over a `tokens`-token context of a decoder
    with `config`'s layers, KV heads and head size, `element_size` bytes an element; None
    for a config that does not name them as transformers' Llama-like ones do."""
    layers, heads, hidden = (getattr(config, key, None) for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0 and isinstance(hidden, int)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim * tokens * element_size


def one_token_forward_ms(session: Any, *, context_tokens: int = FLOOR_CONTEXT_TOKENS,
                         repeats: int = FLOOR_FORWARD_REPEATS) -> tuple[float, int]:
    """(best ms of a one-token forward over a `context_tokens`-token context, the context's length).

    Measured through `session.target` (``forward`` on a fresh ``new_cache()``), as
    `pardec tune` measures its cost curve: whatever runner the session decodes with.
    """
    from pardec_cli.tuning.curve import measure_curve, plain_context

    context = plain_context(session, context_tokens)
    curve = measure_curve(session, context, points=(1,), repeats=repeats)
    return curve.base_ms, len(context)


def floor_report(spec: str | None, hardware: Any, model: dict[str, Any], *, compile: str = "off",
                 weights: str = "auto") -> dict[str, Any]:  # fmt: skip
    """Memory bandwidth of the device, and for the model `spec` (as `auto_report` found it,
    in `model`): weight bytes, the bandwidth floor of one forward, the measured forward.

    The model is loaded on `hardware.device` in `hardware.dtype`, offline. A model that is
    not here, or does not load, leaves its part out with a `problem`.
    """
    from pardec_cli.errors import PardecError
    from pardec_cli.hardware import COPY_TEST_BYTES, COPY_TEST_REPEATS, measure_memory_bandwidth

    # A forward reads its weights and writes next to nothing: its floor is at the read
    # rate. The copy test (STREAM's convention, read + written; earlier figures used it)
    # is kept beside it.
    bandwidth = measure_memory_bandwidth(hardware.device, kind="read")
    copy = measure_memory_bandwidth(hardware.device, kind="copy")
    source = f"read test: best of {COPY_TEST_REPEATS} sums over {COPY_TEST_BYTES >> 20} MiB"
    report: dict[str, Any] = {
        "device": hardware.device, "bandwidth_gbs": round(bandwidth, 2), "bandwidth_source": source,
        "copy_gbs": round(copy, 2),
    }
    if model.get("problem"):
        report["problem"] = model["problem"]
        return report
    from pardec_cli.session import Session

    try:
        # auto: as a short gen (one token expected): the native step where it applies, no compiling.
        session = Session.load(spec, dtype=hardware.dtype, device=hardware.device, offline=True, compile=compile,
                               weights=weights, expected_tokens=1 if compile == "auto" else None)  # fmt: skip
        session.target.warm()  # the compiled runner compiles here, not inside the measured forward
    except PardecError as exc:
        report["problem"] = f"cannot load {model['name']}: {exc.message}"
        return report
    from pardec_cli.hugepages import huge_page_bytes, thp_setting

    # The weights go on 2 MB pages where the kernel offers them (`hugepages`): the process's
    # memory on such pages is mostly theirs, the bandwidth tests' buffers being freed.
    if hardware.device == "cpu":  # a GPU's weights are in its own memory: pages say nothing there
        report.update(huge_pages=thp_setting(), huge_page_bytes=huge_page_bytes())
    read = weight_bytes(session.target.model)
    forward = float("inf")
    for _ in range(FLOOR_ROUNDS):  # forwards and read tests alternated: both at the machine's quietest
        ms, context = one_token_forward_ms(session)
        forward = min(forward, ms)
        bandwidth = max(bandwidth, measure_memory_bandwidth(hardware.device, kind="read"))
    report.update(bandwidth_gbs=round(bandwidth, 2),
                  bandwidth_source=f"{source}, {FLOOR_ROUNDS + 1} times around {FLOOR_ROUNDS} forward measurements")
    floor = bandwidth_floor_ms(read, bandwidth)
    copy_floor = bandwidth_floor_ms(read, copy)
    # The cache the forward also attends to: left out of the floor (issue 16's target is the
    # weights'), shown beside it, as it grows with the context (docs/runner.md, session 43).
    target = session.target
    cache_dtype = getattr(target, "kv_dtype", None) or next(target.model.parameters()).dtype
    cache = kv_cache_bytes(getattr(target.model, "config", None), context, cache_dtype.itemsize)
    if cache is not None:
        cache_floor = bandwidth_floor_ms(read + cache, bandwidth)
        report.update(cache_bytes=cache, cache_dtype=str(cache_dtype).removeprefix("torch."),
                      cache_floor_ms=round(cache_floor, 3), cache_multiple=round(floor_multiple(forward, cache_floor), 2))
    report.update(dtype=session.dtype, weights=session.held_weights, compiled=session.compiled, runner=session.runner, weight_bytes=read, floor_ms=round(floor, 3), forward_ms=round(forward, 3),
                  context_tokens=context, multiple=round(floor_multiple(forward, floor), 2),
                  copy_floor_ms=round(copy_floor, 3), copy_multiple=round(floor_multiple(forward, copy_floor), 2))
    return report
