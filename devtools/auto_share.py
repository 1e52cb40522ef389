"""From `pardec bench --json` reports: auto's tokens/s as a share of the best single method's, per category.

    python -m devtools.auto_share bench.json [more.json ...] [--before untuned.json]

Every other label in the report except vanilla, hf and hf-pld counts as a single
method. With --before, the auto column of that report (e.g. before `pardec tune`) is
shown next to it, as speed-ups over vanilla measured in the same run.
"""

from __future__ import annotations

import argparse
import json

BASELINES = {"vanilla", "hf", "hf-pld", "auto"}


def table(report: dict) -> dict[str, dict]:
    rows = {}
    for category, cells in report["summary"].items():
        singles = {label: c for label, c in cells.items() if label not in BASELINES}
        if "auto" not in cells or not singles:
            continue
        best_label, best = max(singles.items(), key=lambda kv: kv[1]["tokens_per_s"])
        auto = cells["auto"]
        rows[category] = {
            "auto": auto["tokens_per_s"], "auto_vs_vanilla": auto["speedup_vs_vanilla"],
            "best": best_label, "best_tokens_per_s": best["tokens_per_s"],
            "share": auto["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else 0.0,
            "prompts": auto["prompts"],
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--before", default=None, help="a report with auto before tuning (same prompts)")
    args = parser.parse_args()
    before = table(json.load(open(args.before))) if args.before else {}
    for path in args.reports:
        rows = table(json.load(open(path)))
        print(f"== {path}")
        head = f"{'category':<16} {'n':>3} {'auto tok/s':>10} {'vs vanilla':>10} {'best single':<48} {'tok/s':>7} {'share':>6}"
        print(head + (f" {'before (vs vanilla)':>20}" if before else ""))
        for category in sorted(rows, key=lambda c: (c == "overall", c)):
            r = rows[category]
            line = (f"{category:<16} {r['prompts']:>3} {r['auto']:>10.2f} {r['auto_vs_vanilla']:>9.2f}x {r['best']:<48} "
                    f"{r['best_tokens_per_s']:>7.2f} {r['share']:>6.0%}")
            if before and category in before:
                line += f" {before[category]['auto_vs_vanilla']:>19.2f}x"
            print(line)


if __name__ == "__main__":
    main()
