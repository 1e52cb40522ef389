"""A loaded model plus a decoding method: what `gen`, `chat`, `bench` and `tune` drive.

Layers (after mlx-lm): `engine.loop.decode` yields token-level step events;
`Session.stream` wraps them in text chunks (multi-byte safe, stop strings removed) and
keeps the statistics; `Session.generate` returns the whole result.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pardec_cli.engine.events import FINISH_CANCELLED, FINISH_REPETITION, FINISH_STOP, GenerationStats, StepEvent
from pardec_cli.engine.sampling_params import SamplingParams
from pardec_cli.errors import PardecUsageError

DEFAULT_MAX_TOKENS = 256
COMPILE_MODES = ("auto", "on", "off")


def use_compile_cache() -> None:
    """Keep torch.compile's on-disk caches (inductor's FX graphs, AOTAutograd) in pardec's
    store, unless the user pointed TORCHINDUCTOR_CACHE_DIR elsewhere: a later process
    that compiles the same graphs then skips most of the work. (torch writes its own
    default into the variable the first time it looks, so that default counts as unset.)"""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from pardec_cli.home import compile_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())


def compiled_steps_dir() -> Path:
    """Where the compiled runner saves its precompiled steps (pardec's store)."""
    from pardec_cli.home import compile_cache_dir

    return compile_cache_dir() / "steps"


@dataclass(frozen=True)
class Chunk:
    """New text released by one decoding step (may be empty: held back or partial character)."""

    text: str
    event: StepEvent


@dataclass
class GenerationResult:
    """Everything about one finished generation."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    method: str
    knobs: dict[str, Any] = field(default_factory=dict)


class TextStream:
    """Iterates text chunks of one generation; afterwards holds its text, ids and stats.

    Stopping the iteration early (a `break`, Ctrl-C) is safe: `finish()` marks the
    generation cancelled and flushes what was held back. With `repetition_guard` a reply
    caught in a loop ends there, with finish reason "repetition" (see `RepetitionGuard`).
    """

    def __init__(self, events: Iterator[StepEvent], tokenizer: Any, stop: Sequence[str], prompt_tokens: int,
                 *, repetition_guard: Any = False, on_finish: Callable[[TextStream], None] | None = None) -> None:
        from pardec_cli.engine.text import IncrementalDetokenizer, RepetitionGuard, StopMatcher

        self._events = events
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = StopMatcher(stop)
        # True: the default guard; a RepetitionGuard: that one (its thresholds); False: none.
        self._guard = repetition_guard if isinstance(repetition_guard, RepetitionGuard) else \
            RepetitionGuard() if repetition_guard else None
        self.stats = GenerationStats(prompt_tokens=prompt_tokens)
        self.token_ids: list[int] = []
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        # Decoding steps (the prefill excluded): drafting and verifying seconds, and the
        # steps that drafted nothing (one-token forwards) with their verify seconds, for
        # what auto learns from use (`selection.learned`).
        self.decode_propose_s = self.decode_verify_s = self.base_verify_s = 0.0
        self.base_steps = 0
        self._on_finish = on_finish

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def __iter__(self) -> Iterator[Chunk]:
        for event in self._events:
            keep = self._guard.push(event.tokens) if self._guard is not None else None
            if keep is not None:  # a loop: the reply ends after this step's first `keep` tokens
                event = replace(event, tokens=tuple(event.tokens[:keep]), finish_reason=FINISH_REPETITION)
                close = getattr(self._events, "close", None)
                if close is not None:
                    close()
            self.stats.add(event)
            self.token_ids.extend(event.tokens)
            if event.index > 0:
                self.decode_propose_s += event.propose_s
                self.decode_verify_s += event.verify_s
                if event.drafted == 0:
                    self.base_steps += 1
                    self.base_verify_s += event.verify_s
            text = self._stop.push(self._detok.push(event.tokens))
            if event.finish_reason is not None:
                self.finish_reason = event.finish_reason
                text += self._stop.push(self._detok.flush()) + self._stop.flush()
            if self._stop.stopped:
                self.finish_reason = FINISH_STOP
            self.parts.append(text)
            if self.finish_reason is not None:
                self._finished()
            yield Chunk(text, event)
            if self.finish_reason is not None:
                return

    def _finished(self) -> None:
        """Tell `on_finish` once (the session records what this generation measured)."""
        callback, self._on_finish = self._on_finish, None
        if callback is not None:
            callback(self)

    def finish(self) -> str:
        """Mark an interrupted generation as cancelled; return text that was still held back."""
        if self.finish_reason is not None:
            return ""
        self.finish_reason = FINISH_CANCELLED
        close = getattr(self._events, "close", None)
        if close is not None:
            close()
        tail = self._stop.flush()
        self.parts.append(tail)
        self._finished()
        return tail


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after), and what a
    successful block left frozen (`gc.freeze`: later collections skip it). Loading imports
    torch and transformers and builds the model, some 400,000 objects that live as long as
    the process: the collector's passes over them as they piled up cost 0.6-1.3 s of a
    `pardec gen`'s start, and once it was back on its first pass still walked them all,
    ~0.25-0.28 s inside the first reply (a full collection right after a load finds no
    garbage there to free; docs/runner.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


class Session:
    """A target model, its tokenizer and the current decoding method."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "model",
        dtype: str = "float32",
        device: str = "cpu",
        offline: bool | None = None,
        model_source: str | None = None,
        model_path: Path | None = None,
        model_repo: str | None = None,
        compiled: bool = False,
        compile_missing: bool = True,
        notice: Callable[[str], None] | None = None,
        weights: str = "full",
    ) -> None:
        from pardec_cli.engine.model import LanguageModel

        if compiled:
            from pardec_cli.engine.runner import CompiledLanguageModel

            self.target: LanguageModel = CompiledLanguageModel(
                model, on_notice=notice, step_dir=compiled_steps_dir(), compile_missing=compile_missing
            )
        else:
            from pardec_cli.engine.runner import use_row_exact_attention

            use_row_exact_attention(model)  # float32 on pardec's AVX2 kernels: each row's attention alone
            self.target = LanguageModel(model)
        self.tokenizer = tokenizer
        self.model_name = model_name
        self._notice = notice
        # Where the weights came from (None for a model built in memory): `auto` reads
        # tuned results and installed accelerators by them, and the heads are found by them.
        self.model_source, self.model_path, self.model_repo = model_source, model_path, model_repo
        self.dtype = dtype
        self.weights = weights  # "full", "int8" or "int4": how the decoder's weights are held
        self.device = device
        self.offline = offline
        # Decoding on a stand-in for the native step its kernels' build will bring (`load`).
        self.stand_in = False
        self._drafters: dict[str, tuple[Any, Any]] = {}
        self._proposers: dict[tuple[str, str], Any] = {}
        self._auto_selectors: dict[tuple[str, ...], Any] = {}
        self._profiles: dict[str, Any] | None = None
        self._usage_recorder: Any = None
        self.method_name = "vanilla"
        self.method_options: dict[str, Any] = {}
        self.proposer = self._build("vanilla", {})

    # -- construction -----------------------------------------------------------------

    @classmethod
    @collection_paused()
    def load(
        cls, model_spec: str | None, *, dtype: str = "auto", device: str = "auto", offline: bool | None = None,
        progress: bool = False, compile: str = "off", expected_tokens: int | None = None,
        notice: Callable[[str], None] | None = None, weights: str = "auto", measuring: bool = False,
    ) -> Session:
        """Resolve `model_spec` (alias, Hub id, directory, None for the embedded model) and load it.

        `compile`: "on" runs decoding steps through the compiled runner
        (`engine.runner`), "off" eagerly, "auto" compiled where it pays back: for
        `expected_tokens` (None: a long-lived session such as chat, serve, bench or tune)
        more than the runner's break-even on this device. `notice` receives the runner's
        one-line messages (compiling, falling back to eager). `measuring` (bench, tune): where
        pardec's AVX2 kernels are not built yet, build them and wait, rather than time the
        eager step a first run takes meanwhile.
        """
        from pardec_cli.hardware import resolve_device, resolve_dtype
        from pardec_cli.store.embedded import embedded_pending
        from pardec_cli.store.loading import (NATIVE_BUILD_WAIT_S, load_model, native_auto, native_build_pending,
                                              native_stand_in, start_native_build)
        from pardec_cli.store.resolve import resolve_model

        if compile not in COMPILE_MODES:
            raise PardecUsageError(f"compile must be one of {', '.join(COMPILE_MODES)}, not {compile!r}")
        device = resolve_device(device)
        auto = (dtype or "auto").strip().lower() == "auto"
        # A first run converts the embedded model (tens of seconds on one core): the native
        # step's kernels build beside it and are waited for where the step this run would
        # take instead is eager float32 (no bfloat16 hardware), ten times slower. bench and
        # tune always wait: they time the step later runs take, not this run's stand-in.
        early = auto and device == "cpu" and model_spec is None and embedded_pending() and start_native_build()
        if measuring and auto and device == "cpu" and not early:
            early = native_build_pending()
        wait_s = NATIVE_BUILD_WAIT_S if early and (measuring or resolve_dtype(dtype, device) == "float32") else 0.0
        # Imported after the build started: transformers' modules take seconds to import.
        from pardec_cli.engine.compile_policy import compile_pays
        from pardec_cli.engine.native import native_reason
        from pardec_cli.engine.runner import GRAPH_KINDS, CompiledLanguageModel, step_file
        resolved = resolve_model(model_spec, offline=offline, progress=progress)
        # auto: float32 where the native step runs the model (a GGUF's 4-bit blocks, auto's
        # q8q8 of dense layers) once its kernels are built here, and for q4q8 and q8q8 asked for
        native = auto and device == "cpu" and native_auto(resolved.path, weights, start=True, wait_s=wait_s, notice=notice)
        dtype = resolve_dtype(dtype, device, blocks4=native)
        model, tokenizer = load_model(resolved.path, dtype=dtype, device=device, weights=weights, notice=notice)
        # auto: compile for long-lived sessions and long work; for shorter work only when an
        # earlier run saved the steps, and then without compiling any that are missing.
        saved = all(step_file(compiled_steps_dir(), model, kind).is_file() for kind in GRAPH_KINDS)
        # A model the native step takes (`engine.native`) has nothing to compile: auto takes it.
        compiled = compile == "on" or (
            compile == "auto" and CompiledLanguageModel.supports(model)
            and (native_reason(model) is None or compile_pays(expected_tokens, device, saved=saved))
        )
        compile_missing = compile == "on" or compile_pays(expected_tokens, device)
        if compiled:
            use_compile_cache()
        from pardec_cli.quant import weights_label

        session = cls(
            model, tokenizer, model_name=resolved.name, dtype=dtype, device=device, offline=offline,
            model_source=resolved.source, model_path=resolved.path, model_repo=resolved.repo,
            compiled=compiled, compile_missing=compile_missing, notice=notice, weights=weights_label(model),
        )
        # A load that runs the native step once its kernels are built decodes meanwhile on a
        # stand-in (a bfloat16 CPU's first run): no cost curve is measured for its steps.
        session.stand_in = auto and device == "cpu" and not native and native_stand_in(resolved.path, weights)
        if compiled:
            # Load (or compile) the steps now, while the model loads: otherwise the first
            # generation's first steps would pay for it, and the rates that auto's arms and
            # learning from use measure would count it as decoding.
            session.target.warm()
        return session

    @property
    def compiled(self) -> bool:
        """Whether decoding steps go through the compiled runner."""
        from pardec_cli.engine.runner import CompiledLanguageModel

        return isinstance(self.target, CompiledLanguageModel)

    @property
    def runner(self) -> str:
        """What runs a decoding step: "native" (one call of pardec's AVX2 library per step,
        `engine.native`), "compiled" (the compiled runner's graphs) or "eager"."""
        if not self.compiled:
            return "eager"
        return "native" if getattr(self.target, "native", None) is not None else "compiled"

    @property
    def held_weights(self) -> str:
        """How the weights are held and multiplied: `weights`, with "+pardec" where layers
        run pardec's own bfloat16 kernels ("int4+pardec", `quant.kernel_suffix`)."""
        from pardec_cli.quant import kernel_suffix

        return self.weights + kernel_suffix(self.target.model)

    @property
    def step_kind(self) -> str:
        """What one decoding step is here, for what its cost depends on (learning from use
        keeps the kinds apart): "bfloat16/int4/compiled", "bfloat16/int4+pardec/compiled"
        (pardec's own kernels)."""
        from pardec_cli.selection.learned import step_kind

        return step_kind(self.dtype, self.held_weights, self.runner)

    def heads_key(self) -> str:
        """The folder name of this model's trained heads in pardec's store."""
        from pardec_cli.store.heads import model_key

        return model_key(self.model_name, source=self.model_source, path=self.model_path)

    def _find_heads(self, kind: str) -> Path | None:
        """The directory of this model's installed heads of `kind` (trained, else pulled), or None."""
        from pardec_cli.store.heads import find_heads

        found = find_heads(self.model_name, kind, source=self.model_source, path=self.model_path, repo=self.model_repo)
        return found.path if found is not None else None

    def _load_drafter(self, spec: str) -> tuple[Any, Any]:
        """Load (once) a second model on the target's device and dtype; it must share the
        target's tokenizer (drafted ids are compared with the target's)."""
        if spec not in self._drafters:
            from pardec_cli.engine.model import LanguageModel
            from pardec_cli.store.loading import load_model
            from pardec_cli.store.resolve import resolve_model
            from pardec_cli.store.tokenizer_compat import tokenizer_mismatch

            resolved = resolve_model(spec, offline=self.offline)
            model, tokenizer = load_model(resolved.path, dtype=self.dtype, device=self.device)
            problem = tokenizer_mismatch(self.tokenizer, tokenizer)
            if problem:
                raise PardecUsageError(
                    f"draft model {spec!r} does not share the target's tokenizer: {problem}",
                    hint="choose a drafter from the same model family",
                )
            self._drafters[spec] = (LanguageModel(model), tokenizer)
        return self._drafters[spec]

    def _build(self, name: str, options: Mapping[str, Any]) -> Any:
        from pardec_cli.methods.base import MethodEnv
        from pardec_cli.methods.registry import create
        from pardec_cli.store.heads import read_marker

        env = MethodEnv(self.target, self.tokenizer, self._load_drafter, self._find_heads, self.model_name,
                        heads_notes=read_marker, step_ms=self._step_ms)
        return create(name, options, env)

    def _step_ms(self, tokens: int, context: int) -> float:
        """Milliseconds of a forward verifying `tokens` tokens after `context` tokens of text
        here: auto's cost curve (measured once per model, machine and step kind; else estimated)."""
        return float(self.auto_selector().curve.ms_at(tokens, context))

    def build_proposer(self, name: str, options: Mapping[str, Any] | None = None) -> Any:
        """A new proposer for this session's model, without making it the current method."""
        return self._build(name, dict(options or {}))

    def profiles(self, *, refresh: bool = False) -> dict[str, Any]:
        """The task profiles (`selection.profiles.load_profiles`: built-in and the user's
        files), read on first use and kept, as `auto_selector` keeps its own: reading them
        costs ~5 ms, a twentieth of a 16-token reply. `refresh` reads them again."""
        if refresh or self._profiles is None:
            from pardec_cli.selection.profiles import load_profiles

            self._profiles = load_profiles()
        return self._profiles

    def auto_selector(self, drafters: Sequence[str] = (), *, refresh: bool = False) -> Any:
        """`--method auto`'s `AutoSelector` for this model and machine, built on first use
        (`planning.build_selector`: the hardware, the session's `profiles`, the installed
        accelerators plus `drafters`, and tuned results) and kept per set of drafters.
        `refresh` reads everything again (after `pardec tune` saved new results), the
        profiles too."""
        key = tuple(drafters)
        if refresh or key not in self._auto_selectors:
            from pardec_cli.planning import build_selector

            selector = build_selector(self, key, self.profiles(refresh=refresh))
            if selector.learned_curve is None:
                selector.learned_curve = self._learn_step_curve()
            self._auto_selectors[key] = selector
        return self._auto_selectors[key]

    def _learn_step_curve(self) -> Any:
        """Measure what verifying n tokens costs with this session's steps, once per model,
        machine and step kind, and keep it in learned.json (None with learning off).
        Estimates miss what dominates some steps: torch's CPU int4 kernel computes rows
        in tiles of 4, so 16 rows cost 3.2x one there, not the 1.2x AMX would suggest."""
        from pardec_cli.selection.learned import keep_session_curve, learning_enabled
        from pardec_cli.tuning.curve import measure_step_curve

        if not learning_enabled() or self.stand_in:  # a stand-in's steps: no later run takes them
            return None
        if self._notice is not None:
            self._notice(f"measuring the cost of verifying n tokens with {self.step_kind} steps (once, about two seconds)")
        curve = measure_step_curve(self)
        keep_session_curve(self, curve)
        return curve

    def set_method(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        """Switch the decoding method (validated; the old one stays if this fails).

        A method used before in this session with the same options is reused rather
        than rebuilt (proposers reset per generation in `start()`), so switching per
        prompt, as `--method auto` does over a batch, builds each method once.
        """
        options = dict(options or {})
        key = (name, repr(sorted(options.items())))
        proposer = self._proposers.get(key) or self._build(name, options)
        self._proposers[key] = proposer
        self.proposer, self.method_name, self.method_options = proposer, name, options

    # -- prompts ----------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: str | Sequence[Mapping[str, str]], *, system: str | None = None, raw: bool = False) -> list[int]:
        """Prompt text (or a list of chat messages) -> token ids (see `encode_prompt`)."""
        return encode_prompt(self.tokenizer, prompt, system=system, raw=raw)

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends a reply: the tokenizer's EOS and the generation config's."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        config_eos = getattr(getattr(self.target.model, "generation_config", None), "eos_token_id", None)
        if isinstance(config_eos, int):
            ids.add(config_eos)
        elif config_eos:
            ids.update(int(i) for i in config_eos)
        return ids

    @property
    def recommended_sampling(self) -> dict[str, Any]:
        """Temperature, top_p, top_k as the model's generation_config.json recommends them
        (empty when it recommends none); a sampling profile (chat) uses them."""
        from pardec_cli.planning import recommended_sampling

        return recommended_sampling(getattr(self.target.model, "generation_config", None))

    # -- generation -------------------------------------------------------------------

    def stream(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        proposer: Any = None,
        repetition_guard: bool = False,
        profile: str | None = None,
        record: bool = True,
        teach: bool = True,
    ) -> TextStream:
        """Start a generation; iterate the returned stream for text chunks.

        `proposer` overrides the session's method for this one generation (the benchmark
        interleaves several methods over one loaded model this way); `repetition_guard`
        ends a reply caught in a loop (the chat's default). When the generation
        ends, what it measured (tokens per step, step times) is recorded for `--method
        auto` under `profile` (None: the profile detected from the prompt), unless
        `record` is False (tune keeps its own records) or learning is off
        (`selection.learned`): one small write per generation, none per step. With `teach`
        (the default) this session's auto ranks with it from its next choice on, as a
        later session would (a benchmark's reference methods do not teach the auto it
        compares them with on the same prompts).
        """
        from pardec_cli.engine.loop import decode

        proposer = proposer or self.proposer
        on_finish = None
        if record:
            if self._usage_recorder is None:
                from pardec_cli.selection.learned import UsageRecorder

                self._usage_recorder = UsageRecorder(self, on_record=self._learned)
            on_finish = self._usage_recorder.callback(proposer, prompt_ids, profile, live=teach)
        events = decode(
            self.target,
            proposer,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_ids=self.eos_token_ids,
        )
        return TextStream(events, self.tokenizer, stop, len(prompt_ids), repetition_guard=repetition_guard,
                          on_finish=on_finish)

    def _learned(self, profile: str, label: str, row: Any) -> None:
        """A generation recorded `row` (`UsageRecorder.on_record`): every auto selector of
        this session ranks with it from now on."""
        for selector in self._auto_selectors.values():
            selector.learn(profile, label, row)

    def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> GenerationResult:
        """Run a generation to the end and return it whole."""
        stream = self.stream(prompt_ids, **kwargs)
        for _ in stream:
            pass
        return GenerationResult(
            stream.text, stream.token_ids, stream.finish_reason or "", stream.stats, self.method_name,
            self.proposer.knobs(),
        )


def encode_prompt(
    tokenizer: Any, prompt: str | Sequence[Mapping[str, str]], *, system: str | None = None, raw: bool = False,
) -> list[int]:
    """Prompt text (or a list of chat messages) -> token ids, as every engine gets them.

    Through the model's chat template unless `raw` or the model has none; a system
    prompt is added as the first message. (`--engine vllm` encodes with this too, so
    both engines see the same ids.)
    """
    if raw or not getattr(tokenizer, "chat_template", None):
        if not isinstance(prompt, str):
            prompt = "\n\n".join(m["content"] for m in prompt)
        text = f"{system}\n\n{prompt}" if system else prompt
        ids = tokenizer(text).input_ids
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system:
            messages = [{"role": "system", "content": system}, *[m for m in messages if m["role"] != "system"]]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise PardecUsageError("the prompt is empty")
    return list(ids)
