"""Replay auto's switching policy offline, over what every arm would draft at every position.

    python -m devtools.replay_adaptive record --prompts ../shared/bench/spec_bench_dev.jsonl \\
        --limit-per-category 3 -n 96 --out tables.json
    python -m devtools.replay_adaptive replay tables.json [--seeds 3] [--noise 0.08] [-O margin=0.1]

Greedy output is the same whatever drafts it, so for one prompt every configuration sees
the same text: `record` decodes it once (plain decoding), asks auto which arms it would
switch among (`--method auto`'s plan, from this home's learned state), and for each of
those arms and a few reference configurations notes, at every position of the output,
how many nodes it would draft and how many of them greedy verification would keep.
`replay` then runs `methods.adaptive.SwitchPolicy` over those tables with a step-cost
model (the cost curve auto ranks with on this machine, plus the loop's time per step,
times lognormal noise with occasional spikes) and compares it with each configuration run
alone, with its first arm alone, and with the best of its arms per prompt (an oracle):
policy changes are measured in seconds, not in benchmark runs whose noise on a shared
2-core machine exceeds the effects (docs/adaptive.md).

What it leaves out: drafting time beyond a fixed per-method guess, the prefill, and the
wait before a dry run is scored (scored at once here); a tree's nodes cost as many rows.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
from pathlib import Path
from typing import Any

REFERENCES = ("vanilla", "pld[num_draft=2]", "pld[min_ngram=2,num_draft=4]", "suffix")
# Milliseconds a step spends outside the forward (the loop, verification, the text stream):
# docs/runner.md, session 31.
LOOP_MS = 0.5
DRAFT_MS = {"suffix": 0.15, "pld": 0.02}  # a draft's own time per step (suffix: its trie walk)


def record(args: argparse.Namespace) -> None:
    """Decode each prompt plainly; per arm and position, (nodes drafted, nodes kept)."""
    from pardec_cli import api
    from pardec_cli.engine.proposal import EMPTY_DRAFT, Outcome, StartContext, fit_to_tiles
    from pardec_cli.engine.sampling_params import SamplingParams
    from pardec_cli.engine.tree import kept_along
    from pardec_cli.methods.adaptive import ARM_SEPARATOR

    by_category: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for line in Path(args.prompts).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_category[row["category"]].append(row)
    session = api.load()
    out = []
    for category in sorted(by_category):
        for row in by_category[category][: args.limit_per_category]:
            text = row["turns"][0]
            planned = api.stream(session, text, method="auto", max_tokens=args.n, temperature=0)
            arms = planned.knobs.get("arms", "") if planned.method == "adaptive" else ""
            planned.cancel()
            ids = session.encode(text)
            session.set_method("vanilla", {})
            plain = session.stream(ids, max_new_tokens=args.n, record=False, teach=False)
            for _ in plain:
                pass
            output = list(plain.token_ids)
            labels = list(dict.fromkeys([a.strip() for a in arms.split(ARM_SEPARATOR) if a.strip()] + list(REFERENCES)))
            adaptive = session.build_proposer("adaptive", {"arms": " | ".join(labels)})  # arms sharing indexes, as auto's do
            adaptive.start(StartContext(session.target, tuple(ids), SamplingParams(), None))
            table: dict[str, list[tuple[int, int]]] = {label: [] for label in labels}
            for q in range(1, len(output)):  # q tokens emitted: the first came from the prefill
                context = [*ids, *output[:q]]
                for label, arm in zip(labels, adaptive.arms):
                    draft = fit_to_tiles(arm.propose(context, len(output) - q), session.target.row_tile)
                    kept = kept_along(draft, output[q:])
                    table[label].append((len(draft.tokens), min(len(output) - q - 1, len(output) if kept is None else kept)))
                for arm in adaptive.arms:  # every arm learns the next token, as an idle arm does
                    arm.update([*context, output[q]], EMPTY_DRAFT, Outcome(accepted=0))
            out.append({"category": category, "id": row.get("question_id"), "arms": arms, "tokens": len(output), "table": table})
            print(f"{category} {row.get('question_id')}: {arms or '(one configuration)'}", flush=True)
    curve = session.auto_selector().curve  # what auto ranks with: measured here, else estimated
    Path(args.out).write_text(json.dumps({"curve_ms": {str(n): ms for n, ms in curve.points}, "prompts": out}))
    print(f"wrote {args.out} ({len(out)} prompts; cost curve {curve.points}, {curve.source})")


class Costs:
    """Step milliseconds: the cost curve at 1 + drafted rows, the loop's time and the draft's,
    times lognormal noise (sigma) with a spike (x1.2-1.6) on a share of the steps."""

    def __init__(self, curve: dict[str, float], seed: int, sigma: float, spikes: float) -> None:
        from pardec_cli.selection.costmodel import CostCurve

        # auto's own model of a forward's time: interpolated, extrapolated by the last slope
        self.curve = CostCurve.from_mapping({int(rows): ms for rows, ms in curve.items()}, "replayed")
        self.random, self.sigma, self.spikes = random.Random(seed), sigma, spikes

    def step(self, label: str, drafted: int) -> float:
        noise = math.exp(self.random.gauss(0, self.sigma))
        if self.random.random() < self.spikes:
            noise *= self.random.uniform(1.2, 1.6)
        return (self.curve.ms(1 + drafted) + LOOP_MS + draft_ms(label)) * noise


def draft_ms(label: str) -> float:
    return 0.0 if label == "vanilla" else DRAFT_MS.get(label.split("[")[0], 0.02)


def run_alone(table: dict[str, list[tuple[int, int]]], label: str, tokens: int, costs: Costs) -> float:
    """Milliseconds for `label` alone to decode the output."""
    q, ms = 1, 0.0
    while q < tokens:
        drafted, kept = table[label][q - 1]
        ms += costs.step(label, drafted)
        q += kept + 1
    return ms


def run_policy(table: dict[str, list[tuple[int, int]]], labels: list[str], tokens: int, costs: Costs,
               knobs: dict[str, Any]) -> float:  # fmt: skip
    """Milliseconds for `SwitchPolicy` over `labels` (every arm dry-runnable, as pld, suffix
    and plain decoding are), with `Adaptive`'s dry-run cadence."""
    from pardec_cli.methods import adaptive

    policy = adaptive.SwitchPolicy(len(labels), dry=[True] * len(labels), **knobs)
    last_dry = [0] * len(labels)
    q, ms = 1, 0.0
    while q < tokens:
        arm = policy.next_arm()
        for i, label in enumerate(labels):
            if i != arm and policy.step - last_dry[i] >= adaptive.DRY_EVERY:
                last_dry[i] = policy.step
                drafted, kept = table[label][q - 1]
                ms += draft_ms(label)
                policy.observe_dry(i, kept + 1 if drafted else 1, drafted)
        drafted, kept = table[labels[arm]][q - 1]
        seconds = costs.step(labels[arm], drafted) / 1000
        ms += seconds * 1000
        policy.observe(arm, kept + 1, seconds, drafted)
        q += kept + 1
    return ms


def replay(args: argparse.Namespace) -> None:
    from pardec_cli.methods.options import parse_assignments, resolve_options
    from pardec_cli.methods.registry import get_spec

    data = json.loads(Path(args.tables).read_text())
    knobs = resolve_options("adaptive", get_spec("adaptive").options, parse_assignments(args.option))
    knobs.pop("arms", None)
    totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for prompt in data["prompts"]:
        table, tokens = prompt["table"], prompt["tokens"]
        arms = [a.strip() for a in prompt["arms"].split("|") if a.strip()] or [REFERENCES[0]]
        cell = totals[prompt["category"]]
        for seed in range(args.seeds):  # each run draws the same noise: seed by seed, a paired comparison
            alone = {label: run_alone(table, label, tokens, Costs(data["curve_ms"], seed, args.noise, args.spikes))
                     for label in table}  # fmt: skip
            cell["auto (replayed)"] += run_policy(table, arms, tokens, Costs(data["curve_ms"], seed, args.noise, args.spikes), knobs)
            cell["its first arm alone"] += alone[arms[0]]
            cell["best of its arms per prompt"] += min(alone[a] for a in arms)
            for label in REFERENCES:
                cell[label] += alone[label]
    overall: collections.Counter[str] = collections.Counter()
    for cell in totals.values():
        overall.update(cell)
    columns = list(overall)
    print(f"milliseconds as speed-ups over vanilla (seeds {args.seeds}, noise {args.noise}, knobs {knobs})")
    print(f"{'category':<16}" + "".join(f"{c[:22]:>24}" for c in columns))
    for category, cell in [*sorted(totals.items()), ("overall", overall)]:
        print(f"{category:<16}" + "".join(f"{cell['vanilla'] / cell[c]:>23.3f}x" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="decode prompts and note every arm's drafts (loads the embedded model)")
    rec.add_argument("--prompts", required=True, help="Spec-Bench-format JSONL")
    rec.add_argument("--limit-per-category", type=int, default=3)
    rec.add_argument("-n", type=int, default=96, help="tokens per prompt")
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay the policy over recorded tables")
    rep.add_argument("tables")
    rep.add_argument("--seeds", type=int, default=3)
    rep.add_argument("--noise", type=float, default=0.08, help="lognormal sigma of a step's time")
    rep.add_argument("--spikes", type=float, default=0.08, help="share of steps slowed 1.2-1.6x")
    rep.add_argument("-O", "--option", action="append", default=[], help="an adaptive knob, e.g. -O margin=0.1")
    args = parser.parse_args()
    record(args) if args.command == "record" else replay(args)


if __name__ == "__main__":
    main()
