"""Measure the per-step priors that profiles/*.toml give the cost model of `--method auto`.

For every profile's built-in tuning prompts and every method configuration below, runs
greedy generation on one model and reports, per step: tokens emitted, drafted tokens
verified, and the host's time (ms) beyond plain decoding's: drafting, and everything
around the target's forward that plain decoding does not pay (verifying a tree, the
cache's kept path, the top-k rows token recycling learns from): the cost model's
`draft_ms`, which the verification cost curve (forwards alone) does not hold. Greedy token
counts do not depend on the hardware, only on the model and the prompts, so these are
the priors profiles ship with (except for methods that size their drafts by the step's
cost, such as `pld[fit=true]`: measure those on the runner auto uses, the default here);
`pardec tune` measures the same things on a user's own machine and model.

    python -m devtools.measure_priors [-m MODEL] [--per-profile 8] [-n 96] [--json out.json]
    python -m devtools.measure_priors --candidates cpu   # each profile's candidates for a class
"""

from __future__ import annotations

import argparse
import json
import sys
import time

CONFIGS = [
    ("vanilla", {}),
    ("pld", {"num_draft": 2}), ("pld", {"num_draft": 4}), ("pld", {"num_draft": 8}), ("pld", {}), ("pld", {"num_draft": 16}),
    ("pld", {"branches": 4}),
    # one-token matches left out: what the profiles' cpu candidates use (docs/auto.md)
    ("pld", {"num_draft": 2, "min_ngram": 2}), ("pld", {"num_draft": 4, "min_ngram": 2}), ("pld", {"num_draft": 8, "min_ngram": 2}),
    # lengths fitted per step (by the session's cost curve and its own step times): machine-dependent
    ("pld", {"num_draft": 16, "fit": True}), ("pld", {"num_draft": 16, "fit": True, "min_ngram": 2}),
    ("suffix", {"max_nodes": 4}), ("suffix", {"max_nodes": 8}), ("suffix", {"max_nodes": 16}), ("suffix", {}), ("suffix", {"max_nodes": 64}),
    ("suffix", {"max_nodes": 8, "min_match": 2}),  # the code and extraction profiles' cpu candidate
    ("recycling", {"nodes": 8, "depth": 4}), ("recycling", {"nodes": 16}), ("recycling", {}), ("recycling", {"nodes": 64, "depth": 8}),
    ("lookahead", {"window": 4, "ngram": 3, "guesses": 3}), ("lookahead", {}), ("lookahead", {"window": 10, "ngram": 5, "guesses": 10}),
    ("jacobi", {"window": 4}), ("jacobi", {}),
    ("layerskip", {}), ("layerskip", {"k": 2, "max_k": 6}),
    ("suffix+recycling", {"suffix.max_nodes": 8, "recycling.nodes": 8, "recycling.depth": 4}),
    ("suffix+recycling", {"suffix.max_nodes": 16, "recycling.nodes": 16}),
    ("suffix+recycling", {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None)
    # auto: what `pardec gen` loads (on a CPU, the native 4-bit step where its kernels are built)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--candidates", default="", metavar="GROUP",
                        help="measure each profile's candidates for this hardware group (cpu, gpu, ...) instead of the list above")
    parser.add_argument("--per-profile", type=int, default=8)
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("--only", default="", help="comma-separated method names to keep")
    parser.add_argument("--profiles", default="code,chat,extraction", help="comma-separated profiles to measure")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from pardec_cli.errors import PardecError
    from pardec_cli.selection.profiles import get_profile, method_label
    from pardec_cli.session import Session
    from pardec_cli.tuning.prompts import builtin_prompts

    session = Session.load(args.model, dtype=args.dtype, device="cpu", weights=args.weights, compile=args.compile)
    print(f"step: {session.step_kind}", file=sys.stderr)
    results = {}
    for profile in args.profiles.split(","):
        if args.candidates:
            listed = get_profile(profile).candidates.get(args.candidates, ())
            every_config = [("vanilla", {})] + [(c.method, dict(c.knobs)) for c in listed]
        else:
            every_config = CONFIGS
        # plain decoding first, always: the others' host time is counted beyond its own
        configs = [c for c in every_config if c[0] == "vanilla" or not args.only or c[0] in args.only.split(",")]
        every = builtin_prompts(profile)
        prompts = every[:: max(len(every) // args.per_profile, 1)][: args.per_profile]  # spread over the set
        encoded = [session.encode(p.text) for p in prompts]
        for name, knobs in configs:
            try:
                proposer = session.build_proposer(name, knobs)
            except PardecError as exc:  # an accelerator this model lacks (drafter, heads)
                print(f"{profile:<10} {method_label(name, knobs):<70} skipped: {exc}", file=sys.stderr, flush=True)
                continue
            steps = tokens = drafted = 0
            propose = verify = forward = 0.0
            start = time.perf_counter()
            for ids in encoded:
                for chunk in session.stream(ids, max_new_tokens=args.max_tokens, proposer=proposer, record=False, teach=False):
                    event = chunk.event
                    if event.index == 0:  # the prefill
                        continue
                    steps += 1
                    tokens += len(event.tokens)
                    drafted += event.drafted
                    propose += event.propose_s
                    verify += event.verify_s
                    forward += event.forward_s
            label = method_label(name, knobs)
            host_ms = (propose + verify - forward) / steps * 1000  # per step, outside the target's forward
            if name == "vanilla":
                plain_host_ms = host_ms
            row = {
                "tokens_per_step": round(tokens / steps, 3), "drafted": round(drafted / steps, 2),
                # what plain decoding pays too is in its baseline already
                "draft_ms": round(max(host_ms - plain_host_ms, 0.0), 2),
                "propose_ms": round(propose / steps * 1000, 2), "forward_ms": round(forward / steps * 1000, 2),
                "host_ms": round(host_ms, 2), "seconds": round(time.perf_counter() - start, 1),
            }
            results.setdefault(profile, {})[label] = row
            print(f"{profile:<10} {label:<70} {row}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
