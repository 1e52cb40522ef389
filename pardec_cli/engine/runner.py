"""The compiled runner: `LanguageModel` with its steps through torch.compile over a static cache.

Same interface as the eager `LanguageModel` (the loop, every method, bench, tune and chat
are unchanged); what differs is underneath:

- the KV cache is a `StaticKVCache`: preallocated for the prompt plus the tokens asked
  for, rolled back by changing its length, grown in powers of two;
- every input row gets an explicit position and a 4-D mask row over the attended window
  (the filled rows rounded up to WINDOW_ROWS: cache rows before the step, its own tree
  ancestors; nothing at or past the filled length), so a chain, a tree and one token are
  the same computation, and attention does not read the empty tail of the buffer;
- steps of 1 token, of 2..REDUCE_ROWS and of REDUCE_ROWS+1..MAX_COMPILED_ROWS tokens run
  through three compiled graphs (the last two with a symbolic row count; all with a
  symbolic window and capacity: one compile serves every draft size and every cache
  size; two verify graphs because 16-bit CPU attention is written differently for a few
  rows, `engine.attention`); prefills and anything larger run eagerly over the same
  buffers.

Where the model is a Llama decoder on pardec's AVX2 q4q8 kernels, the three graphs are not
used at all: every step of up to MAX_COMPILED_ROWS rows is one call of `engine.native`
(nothing to compile; its first step is checked against the eager one), and so is a
prefill without hidden states up to NATIVE_PREFILL_MAX cache rows, NATIVE_PREFILL_ROWS
rows a call with only the last row's logits (no Python between layers, no head over the
prompt).

Compiling happens on first use of a graph, in the calling thread, announced through
`on_notice`. A graph that fails to compile is dropped with one notice and its steps run
eagerly from then on (same cache, same results).

On CPU each graph is precompiled (`aot_compile`: dynamo, AOTAutograd and inductor once)
and, given a `step_dir`, saved there: a later process loads it in seconds instead of
tracing the model again for a minute or more. Weights stay inputs of the graph (no
freezing), so one file serves every checkpoint of the same architecture, dtype and
weight layout (`step_fingerprint`), and its guards are not checked per call (the runner
alone builds its inputs); a loaded graph's first step is checked against the eager step.
On CUDA the graphs use CUDA graphs (`CUDA_OPTIONS`) through plain torch.compile.
A CUDA graph is recorded per input shape and replays fixed addresses, so there the rows of
a verify step are padded to a power of two (at most six recordings, not one per draft
size; the padded rows see only the cache and themselves and their outputs are dropped),
and a new generation reuses the cache buffers of a finished one of the same capacity
(new buffers would make every recorded graph record again); `warm(contexts=...)` records
every padded size for the capacities a bench or a tune will use before anything is timed.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from pardec_cli.engine.attention import CAUSAL_PREFILL, CPU_ATTENTION, KERNEL_ATTENTION, REDUCE_ROWS
from pardec_cli.engine.attention import register as register_attention
from pardec_cli.engine.model import TREE_ATTENTION, LanguageModel
from pardec_cli.engine.native import NO_HEAD, NativeStep, native_reason
from pardec_cli.engine.static_cache import StaticKVCache, capacity_for
from pardec_cli.engine.tree import ancestor_matrix, depths
from pardec_cli.engine.verify import HeadRows
from pardec_cli.errors import PardecUsageError, first_line
from pardec_cli import kernels
from pardec_cli.quant import (MERGE_SHARED_PRODUCTS, merge_shared_products, on_own_bf16_kernels, on_own_f32_kernels,
                              own_kernel_activations, weights_label)
from pardec_cli.weight_modes import ROUNDED_ACTIVATIONS

#: Steps with more rows than this (prefills, huge trees) run eagerly.
MAX_COMPILED_ROWS = 64
#: Rows of a prefill per native call (`engine.native`). Each row attends to every key of
#: its call's window, masked or not, so a longer call wastes attention on a long prompt;
#: on a 2-core Zen 4, 32, 64 and 128 were within noise of each other up to 400 tokens, 64
#: and 128 ahead at 400, 32 and 64 at 750 (docs/runner.md).
NATIVE_PREFILL_ROWS = 64
#: ... up to a cache this long: the native attention computes every (row, key) of a call's
#: window alone, the eager prefill's attends causally in blocks; on that Zen 4 the native
#: prefill was 1.6x the eager one at 94 tokens, 1.2x at 750 and at par at 1,200.
NATIVE_PREFILL_MAX = 1024
#: The graph kinds: one token (decoding), a few (verifying a draft of up to REDUCE_ROWS
#: rows, where the CPU attention sums broadcast products), more (verifying a larger one).
DECODE, VERIFY, VERIFY_WIDE = "decode", "verify", "verify-wide"
GRAPH_KINDS = (DECODE, VERIFY, VERIFY_WIDE)
#: Bumped when the graphs' inputs or outputs change: older saved steps are then ignored.
STEP_FORMAT = 4
#: Inductor options of the precompiled (CPU) steps. No runtime size, stride or alignment
#: asserts: the runner alone builds the inputs, a loaded step is checked against the
#: eager one, and the ~970 asserts per one-token step cost Python time on every step.
#: `realize_opcount_threshold`: store a broadcast operand once its expression has more
#: than 10 ops (inductor's CPU default, 50, kept the rotary-embedded query [9, 1, 64]
#: inlined in the one-token step's q.k reduction, so its cos and sin were recomputed for
#: every key: 33 us per layer instead of 10, 11% of that step; docs/runner.md).
#: Compiling on a CPU also runs `quant.merge_shared_products` (`cpu_graph_pass`).
PRECOMPILE_OPTIONS: dict[str, Any] = {
    "size_asserts": False, "alignment_asserts": False, "scalar_asserts": False, "realize_opcount_threshold": 10,
}
#: Added where the steps run pardec's attention op (KERNEL_ATTENTION), whose rows are
#: exact: `emulate_precision_casts` keeps eager's 16-bit roundings inside fused kernels.
#: Without it inductor reused a value's float32 form where it also stored the rounded one,
#: and whether it could depended on the graph: the one-token step took a norm's variance
#: from the unrounded residual sum, the verify step from the rounded one, so a token's
#: logits differed between decoding and verifying (0.2-1.0 apart) and bfloat16 speculation
#: drifted from plain decoding at near-ties. Not with the broadcast-products attention:
#: there it rounds every product before the sum (2-8 row steps 20-43% slower;
#: docs/runner.md, "The same bits in every step").
EXACT_ROW_OPTIONS: dict[str, Any] = {"emulate_precision_casts": True}
#: Attention reads the filled rows rounded up to this many (CPU; CUDA graphs read the
#: whole buffer: one recorded graph, not one per width).
WINDOW_ROWS = 64


#: Inductor options of the CUDA steps: CUDA graphs (mode "reduce-overhead": the step is
#: launch-bound there) and coordinate descent tuning, under which inductor writes a one-row
#: product as a tuned reduction instead of calling cuBLAS (and fuses int8 weights' dequantizing
#: into it): on an H200 the one-token step 9% faster (SmolLM2-135M 29%), compiling 2.3x longer
#: (docs/runner.md, "On a GPU").
CUDA_OPTIONS: dict[str, Any] = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
#: A CUDA graph tree runs a new shape's first call plainly, records at the second and replays
#: from the third.
RECORDING_CALLS = 3
#: Inductor warns on stderr once one graph has more than 8 recordings ("dynamic shapes ...
#: consider padding"): the runner pads already and records one per padded row count and
#: cache capacity on purpose (a 13-prompt bench made 9), so its recordings lift that limit.
QUIET_RECORDING: dict[str, Any] = {"triton.cudagraph_dynamic_shape_warn_limit": None}


def compile_options(device_type: str) -> dict[str, Any]:
    """torch.compile arguments for a device: CUDA graphs with tuned one-row products on
    CUDA (`CUDA_OPTIONS`), inductor with freezing on CPU (weights folded and prepacked as
    constants)."""
    if device_type == "cuda":
        return {"options": dict(CUDA_OPTIONS), "fullgraph": True}
    return {"options": {"freezing": True, **cpu_graph_pass()}, "fullgraph": True}


def cpu_graph_pass() -> dict[str, Any]:
    """The inductor option of the graph pass every CPU step compiles with: one int4 kernel
    call per group of layers multiplying the same input (`quant.share_products`)."""
    return {"post_grad_custom_pre_pass": merge_shared_products()}


def step_options(attention: str) -> dict[str, Any]:
    """Inductor options of a precompiled (CPU) step of a model run with `attention`."""
    return {**PRECOMPILE_OPTIONS, **(EXACT_ROW_OPTIONS if attention == KERNEL_ATTENTION else {})}


def precompiles(device_type: str) -> bool:
    """Whether steps are precompiled and saved (CPU, with torch's `aot_compile`) rather
    than compiled lazily by torch.compile in every process (CUDA graphs on CUDA)."""
    return device_type == "cpu" and hasattr(torch.compiler, "load_compiled_function")


def runner_attention(model: Any, amx: bool | None = None) -> str:
    """The attention the runner runs `model` with. In 16 bits on a CPU without AMX,
    pardec's (`engine.attention`): PyTorch's 16-bit SDPA kernel there costs ~0.35 ms per
    layer for one query over 512 keys (fp32: 0.05 ms), and transformers' eager one copies
    the cache for a `bmm` per layer in a step of a few rows, where pardec's compiles into
    loops over the cache; where its layers run on pardec's bfloat16 kernels, pardec's
    attention op (KERNEL_ATTENTION: each row computed alone, the same bits in every step).
    With AMX, transformers' eager attention (its `bmm` was measured faster there for 16-32
    rows; a few rows were not measured). Same math, so the output is unchanged up to 16-bit
    rounding. float32 keeps SDPA, except where its layers run on pardec's AVX2 kernels: there
    pardec's float32 attention op (each row alone, as in 16 bits: with q4q8's int8
    activations SDPA's rows moved a token's logits by up to ~2 between steps). `amx`: whether the CPU has AMX tiles (None:
    torch's own check, the one its kernels go by)."""
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    first = next(model.parameters())
    if first.device.type == "cpu" and first.dtype == torch.float32 and attention in ("sdpa", "eager", KERNEL_ATTENTION):
        # float32 layers on pardec's AVX2 kernels: its attention op too (each row alone)
        return KERNEL_ATTENTION if on_own_f32_kernels(model) else "sdpa" if attention == KERNEL_ATTENTION else attention
    if first.device.type == "cpu" and first.dtype != torch.float32 and attention in ("sdpa", "eager", CPU_ATTENTION, KERNEL_ATTENTION):
        if amx is None:
            amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
        if amx:
            return "eager"
        return KERNEL_ATTENTION if first.dtype == torch.bfloat16 and on_own_bf16_kernels(model) else CPU_ATTENTION
    return attention


def kv_dtype(model: Any) -> torch.dtype:
    """The dtype of the runner's KV cache for `model`: float16 for q4q8 or q8q8
    layers in float32 on pardec's AVX2 kernels, as llama.cpp keeps its cache beside the same
    arithmetic: attention reads half the bytes (SmolLM2-135M at 300 tokens: 14.7 MB a step
    in float32, the largest read after the weights' 95 MB; docs/runner.md); elsewhere the
    model's dtype. The rows are rounded once, as they are written, by every step alike."""
    first = next(model.parameters())
    if first.device.type == "cpu" and first.dtype == torch.float32 and weights_label(model) in ROUNDED_ACTIVATIONS and runner_attention(model) == KERNEL_ATTENTION:
        return torch.float16
    return first.dtype


def use_row_exact_attention(model: Any) -> bool:
    """For eager steps: where `runner_attention` gives float32 layers on pardec's AVX2
    kernels pardec's attention op, set it on the model as the compiled runner does, so a
    token's attention is the same bits in every eager step too; True where it did."""
    if next(model.parameters()).dtype != torch.float32 or runner_attention(model) != KERNEL_ATTENTION:
        return False
    _set_attention(model, KERNEL_ATTENTION)
    return True


def _set_attention(model: Any, attention: str) -> None:
    """Run `model` with `attention` from now on (pardec's registered with transformers first)."""
    if attention != model.config._attn_implementation:
        if attention in (CPU_ATTENTION, KERNEL_ATTENTION):
            register_attention(attention)
        model.set_attn_implementation(attention)


def step_fingerprint(model: Any) -> str:
    """What a saved step depends on: the architecture (config without its attention
    choice), the attention the runner uses, dtype, device type, the weight layout (module
    classes, their quantization groups and buffer names), the versions of torch, transformers and
    pardec, the compile options and, on a CPU, the vector instructions the kernels were
    compiled for. Not the weights: they are inputs of the graph."""
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k not in ("transformers_version", "name_or_path")}
    first = next(model.parameters())
    # Buffer names too: a module that gains one (within a pardec version) traces another graph.
    layout = sorted({
        f"{type(m).__module__}.{type(m).__qualname__}:{getattr(m, 'group_size', '')}:"
        + ",".join(sorted(name for name, _ in m.named_buffers(recurse=False)))
        for m in model.modules()
    })
    # The graph also bakes in the modeling code it traced: transformers' and pardec's.
    import transformers

    from pardec_cli import __version__

    versions = [torch.__version__, transformers.__version__, __version__]
    # A step saved with AVX512 kernels must not load where only AVX2 runs (a home shared
    # between machines, ATEN_CPU_CAPABILITY=avx2): inductor follows ATen's capability.
    isa = torch.backends.cpu.get_cpu_capability() if first.device.type == "cpu" else ""
    attention = runner_attention(model)
    facts = [STEP_FORMAT, config, attention, str(first.dtype), first.device.type, layout, versions, PRECOMPILE_OPTIONS, MERGE_SHARED_PRODUCTS, isa]
    if attention == KERNEL_ATTENTION:
        facts.append(EXACT_ROW_OPTIONS)
    cache = kv_dtype(model)
    if cache != first.dtype:  # the cache's buffers are graph inputs (a step saved over float32 ones must not load)
        facts.append(f"cache {cache}")
    ours = sorted({a for m in model.modules() if (a := own_kernel_activations(m)) is not None})
    if ours:  # the graph calls pardec's own kernels
        libraries = {kernels.AVX2 if a == "float32" else kernels.AVX512 for a in ours}
        facts += [*sorted(kernels.source_digest(lib) for lib in libraries), ours]
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_file(step_dir: Path, model: Any, kind: str = DECODE, hidden: bool = False) -> Path:
    """Where the precompiled `kind` step of `model` is saved in `step_dir`."""
    return step_dir / f"{kind}{'+hidden' if hidden else ''}-{step_fingerprint(model)}.pt2"


def _input_guards(entries: Sequence[Any]) -> list[bool]:
    # Keep the guards on the step's own inputs (shapes, dtypes) and the symbolic-shape
    # constraints; drop the thousands on the model's modules and parameters: the model
    # is fixed for the runner's life, and they cannot be saved with the graph.
    return [
        entry.guard_type == "SHAPE_ENV"
        or (entry.guard_type == "TENSOR_MATCH" and not entry.is_global and not isinstance(entry.value, torch.nn.Parameter)
            and not getattr(entry.value, "is_mkldnn", False))  # an opaque prepacked weight (quant.Int8Head)
        for entry in entries
    ]


def attended_rows(filled: int, capacity: int, fixed_shapes: bool) -> int:
    """How many cache rows a step over `filled` rows (cached plus its own) attends to: the
    whole buffer where steps keep to fixed shapes (CUDA graphs), else a window."""
    if fixed_shapes:
        return capacity
    return min(capacity, -(-filled // WINDOW_ROWS) * WINDOW_ROWS)


def padded_rows(rows: int) -> int:
    """The row count a padded verify step runs with: the next power of two (2..64)."""
    return 1 << (rows - 1).bit_length()


def graph_kind(rows: int) -> str | None:
    """Which compiled graph runs a step of `rows` inputs (None: eager)."""
    if rows == 1:
        return DECODE
    if 2 <= rows <= REDUCE_ROWS:
        return VERIFY
    if rows <= MAX_COMPILED_ROWS:
        return VERIFY_WIDE
    return None


def step_mask(
    start: int, rows: int, width: int, parents: Sequence[int] | None, *, dtype: torch.dtype, device: torch.device,
    padding: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask [1, 1, rows + padding, width] over the first `width` cache rows (0 where
    attending, the dtype's minimum elsewhere) and position ids [1, rows + padding] for
    `rows` inputs written at cache rows start..start+rows-1 (start + rows + padding <= width).

    Row r sees the `start` cached rows and, among the new ones, itself and its ancestors:
    all earlier rows for a chain, the tree's ancestors with `parents` (`engine.tree`).
    `padding` rows follow (written at the next cache rows, their outputs unused): each sees
    the cached rows and itself, so its attention stays finite.
    """
    low = torch.finfo(dtype).min
    if parents is None and rows == 1 and not padding:  # a decoding step: 3 tensor ops, not 10 (~26 us, not ~50)
        one = torch.full((1, width), low, dtype=dtype)
        one[:, : start + 1] = 0
        return one.view(1, 1, 1, width).to(device), torch.tensor([[start]], device=device)
    if parents is None:
        allowed = torch.ones(rows, rows, dtype=torch.bool).tril_()
        positions = torch.arange(start, start + rows)
    else:
        allowed = torch.from_numpy(ancestor_matrix(parents))
        positions = torch.tensor([start, *(start + d for d in depths(parents))])
    total = rows + padding
    mask = torch.full((total, width), low, dtype=dtype)
    mask[:, :start] = 0
    mask[:rows, start : start + rows].masked_fill_(allowed, 0)
    if padding:
        pad = torch.arange(rows, total)
        mask[pad, start + pad] = 0
        positions = torch.cat([positions, start + pad])
    return mask.view(1, 1, total, width).to(device), positions.view(1, total).to(device)


def _forward(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, hidden: bool, cache_keyword: str) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """One forward over the static cache: (logits [1, q, V], hidden states or None).
    `cache_keyword` is `engine.cache.cache_keyword(model)`, a constant of the graph."""
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
        use_cache=True, output_hidden_states=hidden, **{cache_keyword: cache},
    )
    return out.logits, (tuple(out.hidden_states) if hidden else None)


@dataclass
class GraphState:
    """One compiled graph: its callable once built, or why it is not used."""

    compiled: Callable[..., Any] | None = None
    failed: str | None = None
    compile_seconds: float | None = None
    #: "compiled" (traced in this process, lazily or ahead of time) or "loaded" (saved step)
    origin: str = "compiled"
    #: a loaded step's first output is compared with the eager step's before it is trusted
    unchecked: bool = False


class CompiledLanguageModel(LanguageModel):
    """A `LanguageModel` whose decoding steps run compiled over a `StaticKVCache`."""

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether `model` can run here: its attention must take a 4-D float mask."""
        return (getattr(model.config, "_attn_implementation", None) or "eager") in TREE_ATTENTION

    def __init__(
        self, model: Any, *, on_notice: Callable[[str], None] | None = None, compile_fn: Callable[..., Any] | None = None,
        step_dir: Path | None = None, compile_missing: bool = True, fixed_shapes: bool | None = None, native: bool = True,
    ) -> None:
        super().__init__(model)
        if not self.supports(model):
            attention = getattr(self.config, "_attn_implementation", None)
            raise PardecUsageError(
                f"the compiled runner needs an attention that takes a 4-D mask; the model uses {attention!r}",
                hint="run this model eagerly (compile off)",
            )
        # Every runner compiles the same function (`_forward`) for its model and its two
        # kinds of step; dynamo's default of 8 entries per function would silently turn
        # the graphs of a second and third model in one process (tests, a drafter) eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _set_attention(model, runner_attention(model))
        self._on_notice = on_notice or (lambda message: None)
        # An injected compile_fn (tests) always compiles lazily, like torch.compile on CUDA.
        self._precompile = compile_fn is None and precompiles(self.device.type)
        self._compile_fn = compile_fn or torch.compile
        self.step_dir = step_dir if self._precompile else None
        # False: only saved steps are used, any other kind runs eagerly (nobody waits a
        # minute for a compile in the middle of a short generation).
        self.compile_missing = compile_missing
        self._graphs: dict[tuple[str, bool], GraphState] = {}
        # (kind, hidden, rows, capacity) -> calls so far, up to RECORDING_CALLS (CUDA)
        self._shape_calls: dict[tuple[str, bool, int, int], int] = {}
        self.capacity_hint = 0
        # Steps keep to a few shapes (None: on CUDA, where each shape is a recording): verify
        # rows padded to a power of two, attention over the whole buffer.
        self.fixed_shapes = self.device.type == "cuda" if fixed_shapes is None else fixed_shapes
        # capacity -> (the cache using these buffers, weakly; the buffers): a new cache takes
        # the buffers of a finished generation (see the module doc).
        self._spare: dict[int, tuple[weakref.ref[StaticKVCache], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        # Layers that round their activations to int8 (q4q8, q8q8): a fused kernel's last-bit
        # difference flips some of those roundings, so a loaded step is checked as in 16 bits.
        self._rounds_activations = weights_label(model) in ROUNDED_ACTIVATIONS
        self.kv_dtype = kv_dtype(model)
        # Where the model is what pardec's AVX2 library computes as one call per step
        # (`engine.native`), that call replaces the graphs: nothing to compile. `native`
        # False keeps the graphs (tests of the graphs themselves).
        self.native: NativeStep | None = NativeStep(model) if native and native_reason(model) is None else None
        self._native_checked = False

    # -- cache --------------------------------------------------------------------------

    def new_cache(self, tokens: int = 0) -> StaticKVCache:
        """A static cache sized for `tokens` positions (prompt + tokens to generate), or the
        smallest capacity when unknown; it grows when a generation goes longer."""
        capacity = self._capacity(tokens)
        owner, buffers = self._spare.get(capacity, (None, None))
        if owner is not None and owner() is not None:
            buffers = None  # still in use (a chat's cache, a second generation at once)
        cache = StaticKVCache(self.config, capacity, dtype=self.kv_dtype, device=self.device, buffers=buffers)
        if buffers is not None or owner is None:
            self._spare[capacity] = (weakref.ref(cache), cache.buffers())
        return cache

    def _capacity(self, tokens: int) -> int:
        capacity = capacity_for(max(tokens, 1) + MAX_COMPILED_ROWS)
        if self.max_context is not None:
            capacity = min(capacity, capacity_for(self.max_context + MAX_COMPILED_ROWS))
        return capacity

    # -- graphs -------------------------------------------------------------------------

    def graph_states(self) -> dict[str, GraphState]:
        """The graphs used so far: "decode", "verify", "+hidden" variants -> state."""
        return {f"{kind}{'+hidden' if hidden else ''}": state for (kind, hidden), state in self._graphs.items()}

    def _build(self, kind: str, hidden: bool, args: tuple[Any, ...]) -> GraphState:
        """The graph for a kind of step: loaded from `step_dir`, precompiled now (and
        saved), or (CUDA, injected compilers) a torch.compile wrapper compiling on first call."""
        if not self._precompile:
            self._on_notice(f"compiling the {kind} step (once per model; cached on disk)")
            return GraphState(compiled=self._compile_fn(_forward, **compile_options(self.device.type)))
        path = step_file(self.step_dir, self.model, kind, hidden) if self.step_dir is not None else None
        if path is not None and path.is_file():
            try:
                with path.open("rb") as file:
                    loaded = torch.compiler.load_compiled_function(file, external_data={"model": self.model})
                loaded.disable_guard_check()
                return GraphState(compiled=loaded, origin="loaded", unchecked=True)
            except Exception as exc:  # another torch, a truncated file: compile it again
                then = "compiling it again" if self.compile_missing else "running it eagerly"
                self._on_notice(f"the saved {kind} step could not be loaded ({first_line(exc, typed=True)}); {then}")
        if not self.compile_missing:
            return GraphState(failed="not saved (runs eagerly)")
        self._on_notice(f"compiling the {kind} step (once per model; saved for later runs)")
        # No backward graph: with parameters that require grad, AOTAutograd would build one.
        self.model.requires_grad_(False)
        # No duck sizing: a window as wide as the buffer at compile time must not become
        # one symbol with the capacity (the graph runs without its guards).
        from torch.fx.experimental import _config as shapes_config

        # No automatic dynamism: dynamo remembers what changed between compiles of
        # `_forward` in this process, and another model's (a drafter's head size and so its
        # attention scale) would make a float symbolic, which aot_compile cannot trace.
        from torch._dynamo import config as dynamo_config

        with shapes_config.patch(use_duck_shape=False), dynamo_config.patch(automatic_dynamic_shapes=False):
            options = {"guard_filter_fn": _input_guards, **step_options(self.config._attn_implementation), **cpu_graph_pass()}
            compiled = torch.compile(_forward, fullgraph=True, options=options).aot_compile((args, {}))
        compiled.disable_guard_check()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                compiled.save_compiled_function(str(path), external_data={"model": self.model})
            except Exception as exc:  # a full disk must not end the generation
                self._on_notice(f"could not save the compiled {kind} step ({first_line(exc, typed=True)}); it is compiled again next time")
        return GraphState(compiled=compiled)

    def _drop(self, kind: str, hidden: bool, exc: BaseException) -> None:
        state = self._graphs[(kind, hidden)]
        state.compiled, state.failed = None, first_line(exc, typed=True)
        self._on_notice(f"compiling the {kind} step failed ({state.failed}); running it eagerly")

    def warm(self, *, hidden_layers: bool = False, contexts: Sequence[int] = ()) -> None:
        """Compile the graphs now (decode, verify, verify-wide; with hidden states too if asked) on a
        scratch cache, so that later steps do not wait: for sessions that live long
        (chat, serve) and for measurements (bench, tune).

        With fixed shapes (CUDA) every padded row count is run too, three times (CUDA
        graph trees warm up, record, then replay), for the cache capacity of each of
        `contexts` (token counts, prompt plus new tokens, that generations will reach): a
        recording belongs to one capacity's buffers, which the scratch cache leaves to the
        next generation of that capacity (`new_cache`).
        """
        rows_list: tuple[int, ...] = (1, 2, REDUCE_ROWS + 1)  # one step of each graph kind
        repeats = 1
        capacities = [self._capacity(0)]
        if self.fixed_shapes:
            rows_list = (1, *(1 << i for i in range(1, MAX_COMPILED_ROWS.bit_length())))  # 1, 2, 4, ..., 64
            repeats = 3
            capacities = sorted({*capacities, *(self._capacity(tokens) for tokens in contexts)})
        with torch.inference_mode():
            for capacity in capacities:
                cache = self.new_cache(capacity - MAX_COMPILED_ROWS)
                # A short eager prefill first: a loaded graph is checked on its first step, and
                # 16-bit logits at the very first positions are too sensitive to rounding. The
                # steps go on with distinct tokens: a row of one token repeated (token 0, SmolLM2's
                # <|endoftext|>) gave degenerate bf16 logits whose compiled and eager rows differed
                # by up to 2.3x their norm, failing a good saved verify-wide step every run. Ordinary
                # words from the middle of the vocabulary, not its first ids (SmolLM2's special
                # tokens: after 16 of them hidden states reach 10^4, and with activations rounded
                # to int8 the native step's logits differed from the eager step's by 57% of their
                # norm for q8q8, failing a good native step; 0.2% after text).
                vocab = int(getattr(self.model.config, "vocab_size", 0) or 1 << 16)
                words = vocab // 2
                self._run([(words + i) % vocab for i in range(16)], cache, True, None, hidden=False)
                for hidden in (False, True) if hidden_layers else (False,):
                    for rows in rows_list:
                        for _ in range(repeats):
                            self._run([(words + 16 + i) % vocab for i in range(rows)], cache, False, None, hidden=hidden)
                            cache.length -= rows  # the scratch rows go; the capacity stays
                del cache  # its buffers go to the next generation of this capacity

    # -- forward ------------------------------------------------------------------------

    def forward_rows(self, token_ids: Sequence[int], cache: Any, *, parents: Sequence[int] | None = None) -> torch.Tensor | HeadRows:
        """`forward`; on the native step, for more rows than a tile, the logits come as
        `HeadRows`: the head runs for the rows verification reads, not for every row."""
        logits = self._run(token_ids, cache, False, parents, hidden=False, head_rows=True).logits
        return logits if isinstance(logits, HeadRows) else logits[0]

    def _run(
        self, token_ids: Sequence[int], cache: Any, last_only: bool, parents: Sequence[int] | None, *, hidden: bool,
        head_rows: bool = False,
    ) -> Any:
        if not isinstance(cache, StaticKVCache):
            return super()._run(token_ids, cache, last_only, parents, hidden=hidden)
        rows = len(token_ids)
        start = cache.length
        # Without the head (`HeadRows`) once the native step was checked (its check compares
        # logits), for more rows than a tile: up to a tile, a walk's first read computes them all.
        head_rows = head_rows and rows > self.row_tile and not last_only and not hidden and self.native is not None and self._native_checked
        no_head = NO_HEAD if head_rows else 0
        if last_only and rows > 1 and parents is None and not hidden and self.native is not None and start + rows <= NATIVE_PREFILL_MAX:
            prefilled = self._native_prefill(token_ids, cache)
            if prefilled is not None:
                return prefilled
        # A prefill (last_only, many rows) runs eagerly: it keeps only the last row's logits.
        kind = graph_kind(rows) if rows == 1 or not last_only else None
        padding = padded_rows(rows) - rows if kind in (VERIFY, VERIFY_WIDE) and self.fixed_shapes else 0
        chain = kind is not None and parents is None and not padding and self.native is not None and self._native_checked
        out = self._native_chain(token_ids, cache, start, hidden, no_head) if chain else None  # None: it failed, eager below
        if out is None:
            mask, positions = self._place(cache, start, rows, parents, padding)
            input_ids = self.as_input([*token_ids, *[0] * padding])
            if kind is not None and not chain:
                if self.native is not None:
                    out = self._native_step(input_ids, positions, mask, cache, start, hidden, logit_rows=no_head)
                else:
                    out = self._compiled_step(kind, hidden, (self.model, input_ids, positions, mask, cache, hidden, self._cache_keyword))
            if out is None:
                head_rows = False
                # A fresh prefill of a chain: causal from the top left, no mask to read (`attention.prefill_attention`).
                causal = kind is None and start == 0 and parents is None
                out = self._eager(input_ids, positions, mask, cache, hidden, last_only, causal=causal)
        cache.length = start + rows
        logits, states = out
        if head_rows and self.native is not None:  # [1, rows, E] final-normed rows
            return _Output(HeadRows(logits[0], self.native.head, self.row_tile), None)
        if padding:  # [1, rows + padding, V] -> [1, rows, V]; hidden states alike
            logits = logits[:, :rows]
            states = None if states is None else tuple(state[:, :rows] for state in states)
        return _Output(logits, states)

    def _compiled_step(self, kind: str, hidden: bool, args: tuple[Any, ...]) -> Any:
        """Run one step through its graph (building it first if needed); None: run it eagerly."""
        _, input_ids, positions, mask, cache = args[:5]
        state = self._graphs.get((kind, hidden))
        began = perf_counter()
        # torch.compile (not precompiled) reads the dynamic-dimension marks on every call.
        if state is None or not self._precompile:
            self._mark_dynamic(kind, input_ids, positions, mask, cache)
        if state is None:
            try:
                state = self._graphs[(kind, hidden)] = self._build(kind, hidden, args)
            except Exception as exc:  # a compiler error must not end the generation
                self._graphs[(kind, hidden)] = GraphState()
                self._drop(kind, hidden, exc)
                return None
        if state.compiled is None:
            return None
        if state.unchecked:
            return self._first_loaded_step(kind, hidden, state, args)
        recording = False
        if self.device.type == "cuda":
            # The previous step's outputs were consumed (the loop keeps no logits across
            # steps): CUDA graph replays may reuse their memory.
            torch.compiler.cudagraph_mark_step_begin()
            recording = self.records(kind, hidden, input_ids.shape[-1], cache.capacity)
        try:
            with quiet_recording() if recording else nullcontext():
                out = state.compiled(*args)
        except Exception as exc:
            self._drop(kind, hidden, exc)
            return None
        if state.compile_seconds is None:
            state.compile_seconds = perf_counter() - began
        return out

    def records(self, kind: str, hidden: bool, rows: int, capacity: int) -> bool:
        """Whether this CUDA step's call may warm up or record a graph: the first
        `RECORDING_CALLS` of its shape (counted here)."""
        key = (kind, hidden, rows, capacity)
        calls = self._shape_calls.get(key, 0)
        if calls >= RECORDING_CALLS:
            return False
        self._shape_calls[key] = calls + 1
        return True

    def _room(self, cache: StaticKVCache, start: int, rows: int, padding: int = 0) -> int:
        """Room in `cache` for `rows` (+ `padding`) inputs at `start` (grown if needed, with
        room for a wide step more), and how many of its rows a step over them attends."""
        if start + rows + padding > cache.capacity:
            cache.grow(capacity_for(start + rows + MAX_COMPILED_ROWS))
        return attended_rows(start + rows + padding, cache.capacity, self.fixed_shapes)

    def _place(self, cache: StaticKVCache, start: int, rows: int, parents: Sequence[int] | None, padding: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room in `cache` for `rows` (+ `padding`) inputs at `start` (grown if needed), and
        their mask and position ids (`step_mask`, over the attended window), also set as the
        cache's slots for the attention functions of eager and compiled steps."""
        width = self._room(cache, start, rows, padding)
        mask, positions = step_mask(start, rows, width, parents, dtype=self.dtype, device=self.device, padding=padding)
        cache.slots.positions = torch.arange(start, start + rows + padding, device=self.device)
        cache.slots.window = mask
        return mask, positions

    def _native_prefill(self, token_ids: Sequence[int], cache: StaticKVCache) -> _Output | None:
        """A chain of new rows (a prompt, or a chat turn's new text after cached rows) through
        `engine.native`, NATIVE_PREFILL_ROWS at a time, each call computing its last row's
        logits only: (logits [1, 1, V]). None where the native step failed or was turned
        off on the way (the cache is as it was: the caller prefills eagerly)."""
        start, rows = cache.length, len(token_ids)
        self._room(cache, start, rows)  # grown once for the whole prefill, not per call
        logits = None
        for lo in range(0, rows, NATIVE_PREFILL_ROWS):
            part = token_ids[lo : lo + NATIVE_PREFILL_ROWS]
            at, count = start + lo, len(part)
            mask, positions = self._place(cache, at, count, None, 0)
            out = self._native_step(self.as_input(part), positions, mask, cache, at, False, logit_rows=1)
            if out is None or self.native is None:
                cache.length = start
                return None
            cache.length = at + count
            logits = out[0]
        return _Output(logits, None)

    def _native_chain(self, token_ids: Sequence[int], cache: StaticKVCache, start: int, hidden: bool, logit_rows: int = 0) -> Any:
        """A chain of new rows (plain decoding, a drafted sequence) on the native step once its
        first step was checked: the op makes the rows' positions and causal mask itself, so no
        mask or position tensors are built in Python (after a step has streamed the weights
        through the caches, each torch call between steps costs tens of microseconds; the
        mask's took ~0.1 ms of a 5 ms step: docs/runner.md). None where the step failed."""
        window = self._room(cache, start, len(token_ids))  # as `_place` attends
        return self._native_step(self.as_input(token_ids), None, None, cache, start, hidden, logit_rows, window=window)

    def _native_step(self, input_ids: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None,
                     cache: StaticKVCache, start: int, hidden: bool, logit_rows: int = 0, window: int = 0) -> Any:  # fmt: skip
        """A step through `engine.native` (logits of its last `logit_rows` rows, 0: of every
        row, `NO_HEAD`: its final-normed rows, once checked; positions and mask None: a chain
        over the first `window` cache rows, once checked);
        its first one is checked against the eager step (run first: the cache keeps the rows
        the native step writes, as in every later step). A mismatch, or an error, turns the
        native step off for this model, with a notice."""
        assert self.native is not None
        expected = None
        if not self._native_checked:
            assert positions is not None and mask is not None
            expected = self._eager(input_ids, positions, mask, cache, hidden, False)
        try:
            out = self.native(input_ids, positions, mask, start, cache.buffers(), hidden, logit_rows, window)
        except Exception as exc:
            self.native = None
            self._on_notice(f"the native step failed ({first_line(exc, typed=True)}); compiling the steps instead")
            return None
        if expected is None:
            return out
        if logit_rows:
            expected = (expected[0][:, -logit_rows:], expected[1])
        if not _close(out[0], expected[0], exact=False):
            self.native = None
            self._on_notice("the native step's logits differ from the eager step's; compiling the steps instead")
            return self._eager(input_ids, positions, mask, cache, hidden, False)  # the eager step's rows in the cache
        self._native_checked = True
        return out

    def _first_loaded_step(self, kind: str, hidden: bool, state: GraphState, args: tuple[Any, ...]) -> Any:
        """A loaded step's first run, checked against the eager step on the same inputs
        (both write the same cache rows; the eager one first, so that the cache keeps the
        graph's rows, as in every later step); a mismatch drops the saved graph, and the
        next step of this kind compiles it again."""
        _, input_ids, positions, mask, cache, hidden = args[:6]
        assert state.compiled is not None
        expected = self._eager(input_ids, positions, mask, cache, hidden, False)
        began = perf_counter()
        try:
            out = state.compiled(*args)
        except Exception as exc:
            out, reason = None, first_line(exc, typed=True)
        seconds = perf_counter() - began
        if out is not None and _close(out[0], expected[0], exact=not self._rounds_activations):
            state.unchecked, state.compile_seconds = False, seconds
            return out
        if out is not None:
            reason = "its logits differ from the eager step's"
        del self._graphs[(kind, hidden)]
        if self.step_dir is not None:
            step_file(self.step_dir, self.model, kind, hidden).unlink(missing_ok=True)
        self._on_notice(f"the saved {kind} step does not fit this model ({reason}); compiling it again")
        return self._eager(input_ids, positions, mask, cache, hidden, False)  # the eager step's rows in the cache

    def _eager(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, hidden: bool,
               last_only: bool, *, causal: bool = False) -> tuple[torch.Tensor, Any]:  # fmt: skip
        # `causal` goes to pardec's own attention functions only (transformers passes the
        # model's extra keyword arguments on to its attention function).
        ours = getattr(self.model.config, "_attn_implementation", None) in (CPU_ATTENTION, KERNEL_ATTENTION)
        extra = {CAUSAL_PREFILL: True} if causal and ours else {}
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
            output_hidden_states=hidden, logits_to_keep=1 if last_only else 0, **{self._cache_keyword: cache}, **extra,
        )
        return out.logits, (tuple(out.hidden_states) if hidden else None)

    @staticmethod
    def _mark_dynamic(kind: str, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache) -> None:
        # One verify graph for every row count, one graph of each kind for every capacity.
        mark = torch._dynamo.maybe_mark_dynamic
        if kind != DECODE:
            for tensor in (input_ids, positions, cache.slots.positions):
                mark(tensor, 1 if tensor.dim() == 2 else 0)
            mark(mask, 2)
        mark(mask, 3)
        for layer in cache.layers:
            mark(layer.keys, 2)
            mark(layer.values, 2)



@contextmanager
def quiet_recording() -> Iterator[None]:
    """Around a CUDA step's first calls (compiling, recording): inductor configured with
    `QUIET_RECORDING` where this torch has that option, and without its advice to compute
    float32 products in TF32 (it would print in a float32 run, which pardec keeps exact on
    purpose)."""
    import warnings

    from torch._inductor import config

    known = all(hasattr(config.triton, key.split(".", 1)[1]) for key in QUIET_RECORDING)
    with config.patch(QUIET_RECORDING) if known else nullcontext(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
        yield


def _close(got: torch.Tensor, expected: torch.Tensor, exact: bool = True) -> bool:
    """Whether a loaded step's logits match the eager step's: to float32 rounding, or in
    16 bits (or with activations rounded to int8, not `exact`) to within half their norm. A graph of another model misses by about the norm
    itself (or more); fused kernels round differently from eager ones, and through 30
    bf16 layers of SmolLM2-135M that moves the logits by 0.5-4% of their norm after a
    prompt, but by up to 35% at the first two positions of an empty cache."""
    if got.shape != expected.shape:
        return False
    if expected.dtype == torch.float32 and exact:
        return torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
    error = float((got.float() - expected.float()).norm())
    return error <= 0.5 * float(expected.float().norm())


@dataclass
class _Output:
    """The two fields of a transformers output that `LanguageModel` reads."""

    logits: torch.Tensor | HeadRows
    hidden_states: tuple[torch.Tensor, ...] | None
