"""Task-detection accuracy on labelled prompt sets (the mapping is the one tests/test_tasks.py uses).

    python -m devtools.task_accuracy [../shared/bench/spec_bench_dev.jsonl ...] [--show-errors]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from pardec_cli.selection.tasks import detect_task

CATEGORY_PROFILE = {
    "coding": "code", "code_edit": "code", "humaneval": "code",
    "translation": "extraction", "summarization": "extraction", "rag": "extraction", "extraction": "extraction",
}  # every other category: chat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The benchmark sets sit in ../shared/bench next to a checkout of this repository.
    bench = Path(__file__).resolve().parents[2] / "shared" / "bench"
    parser.add_argument("files", nargs="*", default=[
        str(bench / name) for name in ("spec_bench_dev.jsonl", "code_edit_dev.jsonl", "humaneval_dev.jsonl")])
    parser.add_argument("--show-errors", action="store_true")
    args = parser.parse_args()
    total, right = Counter(), Counter()
    for path in args.files:
        for line in open(path, encoding="utf-8"):
            record = json.loads(line)
            category = record.get("category", "humaneval")
            text = record["turns"][0] if "turns" in record else record["prompt"]
            want = CATEGORY_PROFILE.get(category, "chat")
            guess = detect_task(text)
            total[category] += 1
            right[category] += guess.profile == want
            if args.show_errors and guess.profile != want:
                print(f"  {category} -> {guess.explain()}: {text[:100]!r}")
    for category in sorted(total):
        print(f"{category:<16} {CATEGORY_PROFILE.get(category, 'chat'):<11} {right[category]:>4}/{total[category]:<4} "
              f"{right[category] / total[category]:.0%}")
    print(f"{'overall':<28} {sum(right.values()):>4}/{sum(total.values()):<4} {sum(right.values()) / sum(total.values()):.1%}")


if __name__ == "__main__":
    main()
