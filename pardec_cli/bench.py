"""Benchmark decoding methods side by side on a prompt set.

Methods run interleaved prompt by prompt (in a rotating order) after a warm-up, so slow
drift of a noisy machine hits every method alike; results are reported as ratios
measured in the same run. Output tokens of every method are compared with `vanilla`'s
(the match rate: 100% expected in float32; bf16 batched verification may round
differently after a near-tie).

Baselines are what pardec is measured against, run interleaved in the same way on the
same prompt token ids: Hugging Face `generate()` on the loaded model itself (`hf`), and
llama.cpp on the model's GGUF file (`llamacpp`, an optional extra).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

from pardec_cli.errors import PardecUsageError
from pardec_cli.planning import AUTO  # not a method: planned per prompt, as `pardec gen` plans it

HF_GREEDY = "hf"
HF_PROMPT_LOOKUP = "hf-pld"
LLAMA_CPP = "llama.cpp"
# --baseline names -> what they run.
BASELINES = {
    "hf": "Hugging Face generate() greedy on the same model and dtype with dense weights, as stock transformers runs "
          "it (and its prompt lookup when pld is benchmarked)",
    "llamacpp": "llama.cpp greedy on the model's GGUF file, in a worker process (pip install 'pardec[peers]')",
}
OVERALL = "overall"
# What `pardec bench` runs without --prompts: pardec's own prompts, 4 per task profile
# (categories code, chat, extraction), written for pardec and shipped in the package.
BUILTIN_PROMPTS = "built-in"


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of a set: Spec-Bench's first turn, or HumanEval's code prompt."""

    prompt_id: str
    category: str
    text: str


@dataclass(frozen=True)
class MethodChoice:
    """A method to benchmark: its label in the tables, registry name and knobs."""

    label: str
    name: str
    options: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    """One generation of one method on one prompt."""

    label: str
    prompt_id: str
    category: str
    new_tokens: int
    seconds: float
    steps: int
    drafted: int
    accepted: int
    token_ids: list[int]
    chosen: str | None = None  # for `auto`: the method and knobs it chose for this prompt
    switches: int = 0  # times the drafting configuration changed while decoding (method adaptive)
    round: int = 0  # which pass over the prompts (`Bench.run`'s rounds), from 0


def builtin_prompts_text() -> str:
    """The JSONL text of the prompt set shipped with pardec (`BUILTIN_PROMPTS`)."""
    from importlib import resources

    return resources.files("pardec_cli").joinpath("data/bench_prompts.jsonl").read_text("utf-8")


def load_prompts(path: Path | None) -> list[BenchPrompt]:
    """Read a Spec-Bench-format JSONL file ({"question_id", "category", "turns"}) or
    HumanEval ({"task_id", "prompt"}); None reads the built-in set."""
    if path is None:
        return _parse_prompts(builtin_prompts_text(), "built-in bench_prompts.jsonl")
    if not path.is_file():
        raise PardecUsageError(f"prompt file not found: {path}")
    return _parse_prompts(path.read_bytes().decode("utf-8", "replace"), str(path))


def _parse_prompts(text: str, path: str) -> list[BenchPrompt]:
    prompts: list[BenchPrompt] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PardecUsageError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if isinstance(record.get("turns"), list) and record["turns"]:
            prompts.append(BenchPrompt(str(record.get("question_id", number)), str(record.get("category", "default")), record["turns"][0]))
        elif isinstance(record.get("prompt"), str):
            category = str(record.get("category") or "humaneval")
            prompts.append(BenchPrompt(str(record.get("task_id", number)), category, record["prompt"]))
        else:
            raise PardecUsageError(f"{path}:{number}: expected Spec-Bench 'turns' or a 'prompt' field")
    if not prompts:
        raise PardecUsageError(f"{path} holds no prompts")
    return prompts


def limit_per_category(prompts: Iterable[BenchPrompt], limit: int | None) -> list[BenchPrompt]:
    """The first `limit` prompts of each category, in file order."""
    if not limit:
        return list(prompts)
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for prompt in prompts:
        if seen[prompt.category] < limit:
            seen[prompt.category] += 1
            kept.append(prompt)
    return kept


# A name and its knobs, whose values may hold one level of brackets (adaptive's arms).
_METHOD_ITEM = re.compile(r"\s*([A-Za-z0-9_+\-]+)\s*(?:\[((?:[^\[\]]|\[[^\[\]]*\])*)\])?\s*(?:,|$)")


def parse_methods(text: str) -> list[MethodChoice]:
    """'vanilla,pld,layerskip[layers=8,k=4]' -> choices; labels keep the knobs for the tables."""
    from pardec_cli.methods.options import parse_assignments, split_knobs
    from pardec_cli.methods.registry import get_spec

    choices: list[MethodChoice] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _METHOD_ITEM.match(text, pos)
        if not match or match.end() == pos:
            raise PardecUsageError(f"cannot read the method list at {text[pos:]!r} (form: a,b[key=value,...],c)")
        name, knobs = match.group(1), match.group(2)
        if name == AUTO:
            from pardec_cli.methods.registry import AUTO_OPTIONS

            own = {option.name for option in AUTO_OPTIONS}
            if knobs and not {k.partition("=")[0].strip() for k in split_knobs(knobs)} <= own:
                raise PardecUsageError(f"auto takes no knobs but its own ({', '.join(sorted(own))}): it chooses them "
                                       "(per prompt)")
        else:
            get_spec(name)  # unknown names fail here, before any model is loaded
        options = parse_assignments(split_knobs(knobs)) if knobs else {}
        label = f"{name}[{knobs}]" if knobs else name
        choices.append(MethodChoice(label, name, options))
        pos = match.end()
    if not choices:
        raise PardecUsageError("no methods to benchmark")
    return choices


def parse_baselines(text: str | None) -> list[str]:
    """'hf,llamacpp' -> ['hf', 'llamacpp'] (order kept, repeats dropped); unknown names are usage errors."""
    names: list[str] = []
    for name in (text or "").split(","):
        name = name.strip().lower().replace("llama.cpp", "llamacpp")
        if not name:
            continue
        if name not in BASELINES:
            raise PardecUsageError(f"unknown baseline {name!r}", hint=f"choose from: {', '.join(BASELINES)}")
        if name not in names:
            names.append(name)
    return names


class Baseline:
    """A peer pardec is measured against: it runs prompt token ids under its `labels`.

    `start` is called once with every prompt before the warm-up, `close` at the end;
    `describe` gives the report's lines about the settings it used, `settings` the same
    for the JSON document.
    """

    labels: tuple[str, ...] = ()

    def start(self, prompts: Sequence[list[int]], max_new_tokens: int) -> None:
        """Prepare for these prompts (all of them, known before the first run)."""

    def run(self, label: str, prompt: BenchPrompt, ids: list[int], max_new_tokens: int) -> Run:
        """Generate greedily from `ids`; the run, timed like pardec's (prompt included)."""
        raise NotImplementedError

    def describe(self) -> list[str]:
        return []

    def settings(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Release what `start` took (a worker process)."""


class HFBaseline(Baseline):
    """Hugging Face `generate()` greedy (and its prompt lookup) on the session's model as
    stock transformers runs it: dense weights in the session's dtype.

    Where the session holds quantized weights (`--weights int4`: pardec's own packed
    layers, which a transformers user does not have), `start` loads a second, dense copy.
    `model` replaces that copy (tests).
    """

    def __init__(self, session: Any, *, prompt_lookup: bool = False, model: Any = None) -> None:
        self.session = session
        self.labels = (HF_GREEDY, HF_PROMPT_LOOKUP) if prompt_lookup else (HF_GREEDY,)
        self.model = model

    def start(self, prompts: Sequence[list[int]], max_new_tokens: int) -> None:
        if self.model is not None:
            return
        if self.session.weights == "full" or self.session.model_path is None:
            self.model = self.session.target.model
            return
        from pardec_cli.store.loading import load_model

        self.model, _ = load_model(Path(self.session.model_path), dtype=self.session.dtype,
                                   device=str(self.session.target.device), weights="full")  # fmt: skip

    def run(self, label: str, prompt: BenchPrompt, ids: list[int], max_new_tokens: int) -> Run:
        import torch

        model = self.model if self.model is not None else self.session.target.model
        inputs = torch.tensor([ids], device=self.session.target.device)
        extra = {"prompt_lookup_num_tokens": 10} if label == HF_PROMPT_LOOKUP else {}
        eos = sorted(self.session.eos_token_ids)
        start = perf_counter()
        with torch.inference_mode():
            out = model.generate(
                inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=eos, pad_token_id=eos[0] if eos else None, **extra,
            )
        seconds = perf_counter() - start
        new = out[0, len(ids):].tolist()
        # generate() pads after EOS; count up to and including the first EOS, like pardec does.
        for i, token in enumerate(new):
            if token in self.session.eos_token_ids:
                new = new[: i + 1]
                break
        # Greedy generate() takes one step per token after the first; its prompt lookup does
        # not report its steps (0: shown as unknown).
        steps = max(len(new) - 1, 0) if label == HF_GREEDY else 0
        return Run(label, prompt.prompt_id, prompt.category, len(new), seconds, steps, 0, 0, new)

    def settings(self) -> dict[str, Any]:
        return {"engine": "transformers generate()", "dtype": self.session.dtype, "device": self.session.device,
                "weights": "full"}

    def describe(self) -> list[str]:
        return [f"hf: transformers generate(), {self.session.dtype}, dense weights"]

    def close(self) -> None:
        self.model = None


class LlamaCppBaseline(Baseline):
    """llama.cpp on the GGUF file the session's model came from, fed the same token ids.

    Greedy, the same `max_new_tokens`, as many threads as torch uses (`n_threads`), in a
    worker process (`pardec_cli.peers.llamacpp`). Raises `PeerError` when llama-cpp-python
    is not installed or the model has no GGUF file. `command` replaces the worker (tests).
    """

    labels = (LLAMA_CPP,)

    def __init__(self, session: Any, *, n_threads: int | None = None, command: Sequence[str] | None = None) -> None:
        from pardec_cli.peers.llamacpp import find_gguf, require_installed

        if command is None:
            require_installed()
        self.session = session
        self.gguf = find_gguf(session.model_name, source=session.model_source, path=session.model_path)
        if n_threads is None:
            import torch

            n_threads = torch.get_num_threads()  # pardec's own thread count: the same cores for both
        self.n_threads = n_threads
        self.command = command
        self.engine: Any = None

    def start(self, prompts: Sequence[list[int]], max_new_tokens: int) -> None:
        from pardec_cli.errors import PeerError
        from pardec_cli.peers.llamacpp import LlamaCpp

        longest = max((len(ids) for ids in prompts), default=0)
        # Room for the longest prompt and its answer, in llama.cpp's 256-token steps.
        n_ctx = -(-(longest + max_new_tokens + 8) // 256) * 256
        self.engine = LlamaCpp(self.gguf, n_ctx=n_ctx, n_threads=self.n_threads, command=self.command)
        self.engine.start()
        vocab, ours = self.engine.info.get("n_vocab"), len(self.session.tokenizer)
        if isinstance(vocab, int) and vocab < ours:
            raise PeerError(f"{self.gguf.name} has {vocab} tokens and {self.session.model_name}'s tokenizer {ours}: "
                            "llama.cpp cannot be fed the same token ids")

    def run(self, label: str, prompt: BenchPrompt, ids: list[int], max_new_tokens: int) -> Run:
        generation = self.engine.generate(ids, max_new_tokens, stop=sorted(self.session.eos_token_ids))
        new = generation.tokens
        # One decode per token after the first, like greedy generate().
        return Run(label, prompt.prompt_id, prompt.category, len(new), generation.seconds, max(len(new) - 1, 0), 0, 0,
                   new)

    def describe(self) -> list[str]:
        return self.engine.describe() if self.engine is not None else []

    def settings(self) -> dict[str, Any]:
        return self.engine.settings() if self.engine is not None else {"engine": "llama.cpp", "model": str(self.gguf)}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def make_baselines(names: Sequence[str], session: Any, choices: Sequence[MethodChoice]) -> list[Baseline]:
    """The baselines `names` (from `parse_baselines`) for `session`, in order."""
    made: list[Baseline] = []
    for name in names:
        if name == "hf":
            made.append(HFBaseline(session, prompt_lookup=any(c.name == "pld" for c in choices)))
        elif name == "llamacpp":
            made.append(LlamaCppBaseline(session))
    return made


class Bench:
    """Runs methods (and baselines: `make_baselines`) over prompts on one loaded model.

    Close it (or use it in a `with`) to stop the baselines' workers.
    """

    def __init__(self, session: Any, choices: Sequence[MethodChoice], *, max_new_tokens: int,
                 baselines: Sequence[Baseline] = (), profile: str = AUTO, drafters: Sequence[str] = ()) -> None:
        from pardec_cli.methods.registry import get_spec

        for choice in choices:
            if choice.name != AUTO:
                get_spec(choice.name)  # fail fast on an unknown name
        if "vanilla" not in [c.label for c in choices]:
            choices = [MethodChoice("vanilla", "vanilla"), *choices]
        self.session = session
        self.max_new_tokens = max_new_tokens
        self._fixed = [c for c in choices if c.name != AUTO]
        self.proposers = self._new_proposers()
        self._auto_options = {c.label: c.options for c in choices if c.name == AUTO}  # label -> auto's own knobs
        self.labels = [c.label for c in choices]
        # `auto` is planned per prompt by `planning`, as `pardec gen` plans it (for `profile`,
        # detected from the prompt when "auto"; `drafters` offered to it as --draft-model
        # offers them), with every setting fixed: one token budget, greedy, for all rows.
        # Each choice is built once.
        self.profile = profile
        self.planners: dict[str, Any] = {}  # label of an auto row -> its planner
        if any(c.name == AUTO for c in choices):
            from pardec_cli.engine.sampling_params import SamplingParams
            from pardec_cli.planning import ALL_SETTINGS, Planner, Settings

            settings = Settings(max_tokens=max_new_tokens, sampling=SamplingParams(), stop=(), system=None, raw=False)
            self.planners = {
                label: Planner(session, method=AUTO, options=options, profile=profile, settings=settings,
                               user_set=ALL_SETTINGS, drafters=drafters, apply=False)
                for label, options in self._auto_options.items()
            }
        self._auto_choices: dict[str, Any] = {}
        self.baselines = list(baselines)
        self._baseline_of = {label: b for b in self.baselines for label in b.labels}
        self.labels += list(self._baseline_of)
        self.runs: list[Run] = []

    def run(self, prompts: Sequence[BenchPrompt], progress: Callable[[int, int, BenchPrompt], None] | None = None,
            starting: Callable[[str, BenchPrompt, bool], None] | None = None, *, rounds: int = 1) -> list[Run]:
        """Warm up, then run every method on every prompt, interleaved, `rounds` times
        (each round's order rotated one more place, with proposers that have seen
        neither the warm-up nor an earlier round: `median_runs` keeps each prompt's
        typical run).

        `progress(done, total, prompt)` hears each finished timed run; `starting(label,
        prompt, warm_up)` each run about to start, warm-up runs included.
        """
        encoded = [(p, self.session.encode(p.text)) for p in prompts]
        # Compile the steps first (compiled runner), for every cache size the prompts need: never inside a timed run.
        self.session.target.warm(contexts=[len(ids) + self.max_new_tokens for _, ids in encoded])
        for baseline in self.baselines:
            baseline.start([ids for _, ids in encoded], self.max_new_tokens)
        from pardec_cli.schedule import WARM_UP_TOKENS, interleaved  # tune's warm-up rule and schedule

        if encoded:
            for label in self.labels:  # warm-up: allocator, kernels, caches
                if starting:
                    starting(label, encoded[0][0], True)
                self._run_one(label, encoded[0][0], encoded[0][1], max_new_tokens=WARM_UP_TOKENS)
        total = len(encoded) * len(self.labels) * rounds
        done = 0
        for round_ in range(rounds):
            # Methods remember earlier replies (suffix drafting's history, recycling's
            # table): a round would copy the warm-up's or an earlier round's outputs of the
            # same prompts (suffix: 10.9 tokens a step in a second round, 1.45 in the first).
            self.proposers, self._auto_choices = self._new_proposers(), {}
            shift = round_ % len(self.labels)  # never empty: vanilla is always a label
            for index, _, label in interleaved(self.labels[shift:] + self.labels[:shift], range(len(encoded))):
                prompt, ids = encoded[index]
                if starting:
                    starting(label, prompt, False)
                run = self._run_one(label, prompt, ids, self.max_new_tokens)
                run.round = round_
                self.runs.append(run)
                done += 1
                if progress:
                    progress(done, total, prompt)
        return self.runs

    def _new_proposers(self) -> dict[str, Any]:
        """label -> a proposer that has seen nothing yet, for each method but auto."""
        return {c.label: self.session.build_proposer(c.name, c.options) for c in self._fixed}

    def describe_baselines(self) -> list[str]:
        """The baselines' lines for the report: the settings they ran with, what happened."""
        return [line for b in self.baselines for line in b.describe()]

    def baseline_settings(self) -> dict[str, Any]:
        """label -> settings, for the JSON document."""
        return {label: b.settings() for b in self.baselines for label in b.labels}

    def close(self) -> None:
        """Stop the baselines' workers."""
        for baseline in self.baselines:
            baseline.close()

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_one(self, label: str, prompt: BenchPrompt, ids: list[int], max_new_tokens: int) -> Run:
        if label in self._baseline_of:
            return self._baseline_of[label].run(label, prompt, ids, max_new_tokens)
        chosen = None
        if label in self._auto_options:
            # Choosing is part of what auto costs: it is timed with the generation.
            start = perf_counter()
            proposer, chosen = self._auto_proposer(prompt.text, label)
        else:
            proposer = self.proposers[label]
            start = perf_counter()
        # Every run is recorded for later sessions; only auto's own runs teach this run's
        # auto (the reference methods' runs would teach it these very prompts).
        stream = self.session.stream(ids, max_new_tokens=max_new_tokens, proposer=proposer, teach=chosen is not None)
        for _ in stream:
            pass
        seconds = perf_counter() - start
        s = stream.stats
        return Run(label, prompt.prompt_id, prompt.category, s.generated_tokens, seconds, s.steps,
                   s.drafted_tokens, s.accepted_tokens, stream.token_ids, chosen, s.switches)

    def _auto_proposer(self, text: str, label: str) -> tuple[Any, str]:
        """auto's proposer for this prompt (as `planning` plans it for the row `label`,
        with that row's own knobs such as adapt=off), and the label of what auto chose."""
        plan = self.planners[label].plan(text)
        if plan.label not in self._auto_choices:
            self._auto_choices[plan.label] = self.session.build_proposer(plan.method, plan.knobs)
        chosen = plan.choice.label if plan.choice is not None else plan.label
        return self._auto_choices[plan.label], chosen


@dataclass
class Summary:
    """One table cell group: a method on a category (or overall)."""

    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup_vs_vanilla: float | None
    speedup_vs_hf: float | None
    mean_tokens_per_step: float | None  # None: the method does not report its steps
    acceptance_rate: float
    match_rate: float | None
    speedup_vs_llamacpp: float | None = None
    # Per-prompt spread next to each figure: "tokens_per_s", "vs_vanilla", "vs_hf",
    # "vs_llamacpp" -> {"median", "p10", "p90"} (`spread`), over the prompts of the group.
    spread: dict[str, dict[str, float]] = field(default_factory=dict)


SPREAD_NOTE = ("spread: median and 10th-90th percentile over prompts of the per-prompt value "
               "(tokens/s, or the ratio to the reference on the same prompt)")


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) with linear interpolation between order statistics
    (numpy's default); `values` must not be empty."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """{"median", "p10", "p90"} of per-prompt values, or None for none."""
    if not values:
        return None
    return {"median": round(percentile(values, 50), 3), "p10": round(percentile(values, 10), 3),
            "p90": round(percentile(values, 90), 3)}  # fmt: skip


def median_runs(runs: Sequence[Run]) -> list[Run]:
    """One run per method and prompt: of several rounds, the one of median time (the lower
    middle one of an even number), so that a hiccup of a shared machine in one round
    does not decide a prompt's ratio. Order of first appearance."""
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.label, r.prompt_id)].append(r)
    return [sorted(group, key=lambda r: r.seconds)[(len(group) - 1) // 2] for group in groups.values()]


def _per_prompt_rates(runs: Sequence[Run]) -> dict[str, float]:
    """prompt id -> tokens/s of one method's runs (the last run of a prompt wins)."""
    return {r.prompt_id: r.new_tokens / r.seconds for r in runs if r.seconds > 0}


def summarize(runs: Sequence[Run], labels: Sequence[str]) -> dict[str, dict[str, Summary]]:
    """category (and 'overall') -> label -> Summary."""
    reference = {r.prompt_id: r.token_ids for r in runs if r.label == "vanilla"}
    by_group: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_group[r.category].append(r)
        by_group[OVERALL].append(r)
    table: dict[str, dict[str, Summary]] = {}
    for group, group_runs in by_group.items():
        rates: dict[str, float] = {}
        cells: dict[str, Summary] = {}
        for label in labels:
            mine = [r for r in group_runs if r.label == label]
            if not mine:
                continue
            tokens = sum(r.new_tokens for r in mine)
            seconds = sum(r.seconds for r in mine)
            steps = sum(r.steps for r in mine)
            drafted = sum(r.drafted for r in mine)
            rates[label] = tokens / seconds if seconds else 0.0
            matched = [r.token_ids == reference[r.prompt_id] for r in mine if r.prompt_id in reference]
            cells[label] = Summary(
                prompts=len(mine), new_tokens=tokens, seconds=round(seconds, 4), tokens_per_s=round(rates[label], 3),
                speedup_vs_vanilla=None, speedup_vs_hf=None,
                mean_tokens_per_step=round((tokens - len(mine)) / steps, 3) if steps else None,
                acceptance_rate=round(sum(r.accepted for r in mine) / drafted, 4) if drafted else 0.0,
                match_rate=round(sum(matched) / len(matched), 4) if matched else None,
            )
        per_prompt = {label: _per_prompt_rates([r for r in group_runs if r.label == label]) for label in cells}
        for label, cell in cells.items():
            if rates.get("vanilla"):
                cell.speedup_vs_vanilla = round(rates[label] / rates["vanilla"], 3)
            if rates.get(HF_GREEDY):
                cell.speedup_vs_hf = round(rates[label] / rates[HF_GREEDY], 3)
            if rates.get(LLAMA_CPP):
                cell.speedup_vs_llamacpp = round(rates[label] / rates[LLAMA_CPP], 3)
            own = per_prompt[label]
            spreads = {"tokens_per_s": spread(list(own.values()))}
            for key, versus in (("vs_vanilla", "vanilla"), ("vs_hf", HF_GREEDY), ("vs_llamacpp", LLAMA_CPP)):
                theirs = per_prompt.get(versus, {})
                spreads[key] = spread([own[p] / theirs[p] for p in own if theirs.get(p)])
            cell.spread = {key: value for key, value in spreads.items() if value is not None}
        table[group] = cells
    return table


def _with_spread(value: str, cell_spread: dict[str, float] | None, width: int) -> str:
    """"1.42x (1.40, 1.10-1.83)": the figure, then the per-prompt median and p10-p90."""
    if cell_spread is None or value == "-":
        return f"{value:>{width}}"
    return f"{value} ({cell_spread['median']:.2f}, {cell_spread['p10']:.2f}-{cell_spread['p90']:.2f})".rjust(width)


def format_tables(table: dict[str, dict[str, Summary]]) -> str:
    """Plain-text tables, one per category, overall last (a 'vs llama.cpp' column when it ran).

    Each ratio is the group's total tokens/s over the reference's, followed by the
    per-prompt spread in parentheses: median, and 10th-90th percentile (`SPREAD_NOTE`).
    """
    lines: list[str] = []
    groups = sorted(g for g in table if g != OVERALL) + [OVERALL]
    width = max([24, *(len(label) for cells in table.values() for label in cells)])
    with_llamacpp = any(c.speedup_vs_llamacpp is not None for cells in table.values() for c in cells.values())
    with_hf = any(c.speedup_vs_hf is not None for cells in table.values() for c in cells.values())
    ratio_width = 24
    header = f"{'method':<{width}} {'tok/s':>7} {'vs vanilla (med, p10-p90)':>{ratio_width + 1}} "
    header += f"{'vs HF (med, p10-p90)':>{ratio_width}} " if with_hf else ""
    header += f"{'vs llama.cpp (med, p10-p90)':>{ratio_width + 3}} " if with_llamacpp else ""
    header += f"{'tok/step':>8} {'accept':>7} {'match':>6}"
    for group in groups:
        cells = table.get(group)
        if not cells:
            continue
        some = next(iter(cells.values()))
        lines.append(f"== {group} ({some.prompts} prompts) ==")
        lines.append(header)
        for label, c in cells.items():
            def ratio(x: float | None) -> str:
                return f"{x:.2f}x" if x is not None else "-"
            match = f"{c.match_rate:.0%}" if c.match_rate is not None else "-"
            per_step = f"{c.mean_tokens_per_step:.2f}" if c.mean_tokens_per_step is not None else "-"
            s = c.spread
            versus_hf = _with_spread(ratio(c.speedup_vs_hf), s.get("vs_hf"), ratio_width) + " " if with_hf else ""
            versus_llamacpp = (_with_spread(ratio(c.speedup_vs_llamacpp), s.get("vs_llamacpp"), ratio_width + 3) + " "
                               if with_llamacpp else "")  # fmt: skip
            lines.append(
                f"{label:<{width}} {c.tokens_per_s:>7.2f} "
                f"{_with_spread(ratio(c.speedup_vs_vanilla), s.get('vs_vanilla'), ratio_width + 1)} "
                f"{versus_hf}{versus_llamacpp}{per_step:>8} {c.acceptance_rate:>7.0%} {match:>6}"
            )
        lines.append("")
    lines.append(SPREAD_NOTE)
    return "\n".join(lines)


def format_auto_choices(runs: Sequence[Run]) -> str:
    """Per category, what `auto` chose and how often: 'code_edit: suffix[max_nodes=8] x10'."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    first = next((r.label for r in runs if r.chosen), None)  # `auto` and `auto[adapt=off]` choose alike
    for r in runs:
        if r.label == first and r.chosen:
            counts[r.category][r.chosen] += 1
    if not counts:
        return ""
    lines = ["auto chose:"]
    for category in sorted(counts):
        picks = sorted(counts[category].items(), key=lambda kv: -kv[1])
        lines.append(f"  {category}: " + ", ".join(f"{label} x{n}" for label, n in picks))
    return "\n".join(lines) + "\n"


def report_json(table: dict[str, dict[str, Summary]], runs: Sequence[Run], config: dict[str, Any]) -> dict[str, Any]:
    """The `--json` document: configuration, summary tables and every run."""
    return {
        "config": config,
        "summary": {g: {label: asdict(c) for label, c in cells.items()} for g, cells in table.items()},
        "runs": [asdict(r) for r in runs],
    }
