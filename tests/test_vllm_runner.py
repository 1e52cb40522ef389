"""Reading vLLM's speculative decoding counters (the records `LLMEngine.get_metrics()` returns)."""

from __future__ import annotations

from dataclasses import dataclass

from pardec_cli.vllm_engine.runner import SpecCounters, VllmStats, read_counters


@dataclass
class Counter:  # as vllm.v1.metrics.reader.Counter
    name: str
    labels: dict
    value: int


@dataclass
class Vector:  # as vllm.v1.metrics.reader.Vector
    name: str
    labels: dict
    values: list


def snapshot(drafts: int, tokens: int, accepted: int, per_position: list[int]) -> list:
    labels = {"model_name": "m", "engine": "0"}
    return [
        Counter("vllm:num_requests_running", labels, 1),
        Counter("vllm:spec_decode_num_drafts", labels, drafts),
        Counter("vllm:spec_decode_num_draft_tokens", labels, tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_position),
    ]


def test_the_speculative_counters_are_read_by_their_vllm_names():
    assert read_counters(snapshot(7, 55, 9, [5, 2, 2, 0])) == SpecCounters(7, 55, 9, (5, 2, 2, 0))


def test_counters_of_several_engines_add_up():
    both = snapshot(1, 4, 2, [1, 1]) + snapshot(2, 8, 3, [2, 1, 0])
    assert read_counters(both) == SpecCounters(3, 12, 5, (3, 2, 0))


def test_no_speculation_reads_as_zero():
    assert read_counters([Counter("vllm:prompt_tokens", {}, 40)]) == SpecCounters()


def test_one_requests_share_is_the_difference_of_two_snapshots():
    before, after = SpecCounters(7, 55, 9, (5, 2)), SpecCounters(10, 85, 15, (8, 4, 1))
    assert after.minus(before) == SpecCounters(3, 30, 6, (3, 2, 1))


def test_stats_give_acceptance_overall_and_per_position():
    stats = VllmStats(prompt_tokens=10, generated_tokens=9, steps=4, ttft_s=0.5, total_s=1.5,
                      spec=SpecCounters(4, 16, 4, (3, 1, 0, 0)))
    assert stats.acceptance_rate == 0.25 and stats.mean_tokens_per_step == 2.0
    assert stats.acceptance_per_position == [0.75, 0.25, 0.0, 0.0]
    assert stats.to_dict()["decode_tokens_per_s"] == 8.0
