"""The compiled runner: `LanguageModel` with its steps through torch.compile over a static cache.

Same interface as the eager `LanguageModel` (the loop, every method, bench, tune and chat
are unchanged); what differs is underneath:

- the KV cache is a `StaticKVCache`: preallocated for the prompt plus the tokens asked
  for, rolled back by changing its length, grown in powers of two;
- every input row gets an explicit position and a 4-D mask row over the whole buffer
  (cache rows before the step, its own tree ancestors; nothing at or past the filled
  length), so a chain, a tree and one token are the same computation;
- steps of 1 token and steps of 2..MAX_COMPILED_ROWS tokens run through two compiled
  graphs (the second with a symbolic row count and capacity: one compile serves every
  draft size and every cache size); prefills and anything larger run eagerly over the
  same buffers.

Compiling happens on first use of a graph, in the calling thread, announced through
`on_notice`. A graph that fails to compile is dropped with one notice and its steps run
eagerly from then on (same cache, same results). On CUDA the graphs use CUDA graphs
(mode "reduce-overhead"); on CPU inductor with freezing (weights folded as constants).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

from pardec_cli.engine.model import TREE_ATTENTION, LanguageModel
from pardec_cli.engine.static_cache import StaticKVCache, capacity_for
from pardec_cli.engine.tree import ancestor_matrix, depths
from pardec_cli.errors import PardecUsageError

#: Steps with more rows than this (prefills, huge trees) run eagerly.
MAX_COMPILED_ROWS = 64
#: The graph kinds: one token (decoding), several (verifying a draft).
DECODE, VERIFY = "decode", "verify"


def compile_options(device_type: str) -> dict[str, Any]:
    """torch.compile arguments for a device: CUDA graphs on CUDA (the step is launch-bound
    there), inductor with freezing on CPU (weights folded and prepacked as constants)."""
    if device_type == "cuda":
        return {"mode": "reduce-overhead", "fullgraph": True}
    return {"options": {"freezing": True}, "fullgraph": True}


def graph_kind(rows: int) -> str | None:
    """Which compiled graph runs a step of `rows` inputs (None: eager)."""
    if rows == 1:
        return DECODE
    if 2 <= rows <= MAX_COMPILED_ROWS:
        return VERIFY
    return None


def step_mask(
    start: int, rows: int, capacity: int, parents: Sequence[int] | None, *, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask [1, 1, rows, capacity] (0 where attending, the dtype's minimum elsewhere) and
    position ids [1, rows] for `rows` inputs written at cache rows start..start+rows-1.

    Row r sees the `start` cached rows and, among the new ones, itself and its ancestors:
    all earlier rows for a chain, the tree's ancestors with `parents` (`engine.tree`).
    """
    if parents is None:
        allowed = torch.ones(rows, rows, dtype=torch.bool).tril_()
        positions = torch.arange(start, start + rows)
    else:
        allowed = torch.from_numpy(ancestor_matrix(parents))
        positions = torch.tensor([start, *(start + d for d in depths(parents))])
    low = torch.finfo(dtype).min
    mask = torch.full((rows, capacity), low, dtype=dtype)
    mask[:, :start] = 0
    mask[:, start : start + rows].masked_fill_(allowed, 0)
    return mask.view(1, 1, rows, capacity).to(device), positions.view(1, rows).to(device)


def _forward(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, hidden: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """One forward over the static cache: (logits [1, q, V], hidden states or None)."""
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
        past_key_values=cache, use_cache=True, output_hidden_states=hidden,
    )
    return out.logits, (tuple(out.hidden_states) if hidden else None)


@dataclass
class GraphState:
    """One compiled graph: its callable once built, or why it is not used."""

    compiled: Callable[..., Any] | None = None
    failed: str | None = None
    compile_seconds: float | None = None


class CompiledLanguageModel(LanguageModel):
    """A `LanguageModel` whose decoding steps run compiled over a `StaticKVCache`."""

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether `model` can run here: its attention must take a 4-D float mask."""
        return (getattr(model.config, "_attn_implementation", None) or "eager") in TREE_ATTENTION

    def __init__(
        self, model: Any, *, on_notice: Callable[[str], None] | None = None, compile_fn: Callable[..., Any] | None = None
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
        if self.device.type == "cpu" and self.dtype != torch.float32 and self.config._attn_implementation == "sdpa":
            # PyTorch's 16-bit SDPA kernel on CPUs without AMX costs ~0.35 ms per layer for one
            # query over 512 keys (fp32: 0.05 ms); the plain matmul-softmax-matmul ("eager"
            # attention), fused by inductor, does not. Same math, so the output is unchanged
            # up to 16-bit rounding; float32 keeps SDPA, where greedy output is bit-exact.
            model.set_attn_implementation("eager")
        self._on_notice = on_notice or (lambda message: None)
        self._compile_fn = compile_fn or torch.compile
        self._graphs: dict[tuple[str, bool], GraphState] = {}
        self.capacity_hint = 0

    # -- cache --------------------------------------------------------------------------

    def new_cache(self, tokens: int = 0) -> StaticKVCache:
        """A static cache sized for `tokens` positions (prompt + tokens to generate), or the
        smallest capacity when unknown; it grows when a generation goes longer."""
        limit = self.max_context
        capacity = capacity_for(max(tokens, 1) + MAX_COMPILED_ROWS)
        if limit is not None:
            capacity = min(capacity, capacity_for(limit + MAX_COMPILED_ROWS))
        return StaticKVCache(self.config, capacity, dtype=self.dtype, device=self.device)

    # -- graphs -------------------------------------------------------------------------

    def graph_states(self) -> dict[str, GraphState]:
        """The graphs used so far: "decode", "verify", "+hidden" variants -> state."""
        return {f"{kind}{'+hidden' if hidden else ''}": state for (kind, hidden), state in self._graphs.items()}

    def _graph(self, kind: str, hidden: bool) -> Callable[..., Any] | None:
        state = self._graphs.get((kind, hidden))
        if state is None:
            state = self._graphs[(kind, hidden)] = GraphState(compiled=self._compile_fn(_forward, **compile_options(self.device.type)))
        return state.compiled if state.failed is None else None

    def _drop(self, kind: str, hidden: bool, exc: BaseException) -> None:
        state = self._graphs[(kind, hidden)]
        state.compiled, state.failed = None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        self._on_notice(f"compiling the {kind} step failed ({state.failed}); running it eagerly")

    def warm(self, *, hidden_layers: bool = False) -> None:
        """Compile both graphs now (decode, verify; with hidden states too if asked) on a
        scratch cache, so that later steps do not wait: for sessions that live long
        (chat, serve) and for measurements (bench, tune)."""
        cache = self.new_cache()
        with torch.inference_mode():
            for hidden in (False, True) if hidden_layers else (False,):
                for rows in (1, 2):
                    self._run([0] * rows, cache, False, None, hidden=hidden)

    # -- forward ------------------------------------------------------------------------

    def _run(
        self, token_ids: Sequence[int], cache: Any, last_only: bool, parents: Sequence[int] | None, *, hidden: bool
    ) -> Any:
        if not isinstance(cache, StaticKVCache):
            return super()._run(token_ids, cache, last_only, parents, hidden=hidden)
        rows = len(token_ids)
        start = cache.length
        if start + rows > cache.capacity:
            cache.grow(capacity_for(start + rows + MAX_COMPILED_ROWS))
        mask, positions = step_mask(start, rows, cache.capacity, parents, dtype=self.dtype, device=self.device)
        cache.slots.positions = torch.arange(start, start + rows, device=self.device)
        input_ids = self.as_input(token_ids)
        # A prefill (last_only, many rows) runs eagerly: it keeps only the last row's logits.
        kind = graph_kind(rows) if rows == 1 or not last_only else None
        out = None
        if kind is not None and (graph := self._graph(kind, hidden)) is not None:
            self._mark_dynamic(kind, input_ids, positions, mask, cache)
            first = self._graphs[(kind, hidden)].compile_seconds is None
            if first:
                self._on_notice(f"compiling the {kind} step (once per model; cached on disk)")
            began = perf_counter()
            if self.device.type == "cuda":
                # The previous step's outputs were consumed (the loop keeps no logits across
                # steps): CUDA graph replays may reuse their memory.
                torch.compiler.cudagraph_mark_step_begin()
            try:
                out = graph(self.model, input_ids, positions, mask, cache, hidden)
            except Exception as exc:  # a compiler error must not end the generation
                self._drop(kind, hidden, exc)
            else:
                if first:
                    self._graphs[(kind, hidden)].compile_seconds = perf_counter() - began
        if out is None:
            out = self._eager(input_ids, positions, mask, cache, hidden, last_only)
        cache.length = start + rows
        logits, states = out
        return _Output(logits, states)

    def _eager(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, hidden: bool, last_only: bool) -> tuple[torch.Tensor, Any]:
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, output_hidden_states=hidden, logits_to_keep=1 if last_only else 0,
        )
        return out.logits, (tuple(out.hidden_states) if hidden else None)

    @staticmethod
    def _mark_dynamic(kind: str, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache) -> None:
        # One verify graph for every row count, one graph of each kind for every capacity.
        mark = torch._dynamo.maybe_mark_dynamic
        if kind == VERIFY:
            for tensor in (input_ids, positions, cache.slots.positions):
                mark(tensor, 1 if tensor.dim() == 2 else 0)
            mark(mask, 2)
        mark(mask, 3)
        for layer in cache.layers:
            mark(layer.keys, 2)
            mark(layer.values, 2)


@dataclass
class _Output:
    """The two fields of a transformers output that `LanguageModel` reads."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
