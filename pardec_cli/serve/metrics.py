"""`GET /metrics`: the server's counters in Prometheus text format (prometheus_client).

One registry per server (no global state): requests, tokens, tokens per decoding step
and acceptance per method and task profile (histograms, so a scrape shows the spread,
not only the mean), time to first token, time waiting in the queue, queue length.
Labels are the method name (not its knobs) and the profile: a handful of values each.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A step emits its accepted drafted tokens plus one: 1 for plain decoding, up to the
# deepest tree level plus one for tree methods.
TOKENS_PER_STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    """The server's metrics; thread-safe (the decoding worker records, the event loop renders)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        by_method = ["method", "profile"]
        self.requests = Counter("pardec_requests", "Generations ended, by method, profile and finish reason "
                                "(eos, stop, length, cancelled)", [*by_method, "finish_reason"], registry=r)
        self.responses = Counter("pardec_http_responses", "HTTP responses by path and status code",
                                 ["path", "status"], registry=r)
        self.prompt_tokens = Counter("pardec_prompt_tokens", "Prompt tokens prefilled", by_method, registry=r)
        self.generated_tokens = Counter("pardec_generated_tokens", "Tokens generated", by_method, registry=r)
        self.steps = Counter("pardec_decoding_steps", "Decoding steps after the prefill (one target forward each)",
                             by_method, registry=r)
        self.drafted_tokens = Counter("pardec_drafted_tokens", "Drafted tokens verified", by_method, registry=r)
        self.accepted_tokens = Counter("pardec_accepted_tokens", "Drafted tokens accepted", by_method, registry=r)
        self.tokens_per_step = Histogram("pardec_tokens_per_step", "Tokens emitted per decoding step "
                                         "(accepted drafted tokens plus the target's own)", by_method,
                                         buckets=TOKENS_PER_STEP_BUCKETS, registry=r)
        self.acceptance = Histogram("pardec_acceptance_ratio", "Share of drafted tokens accepted, per generation "
                                    "that drafted any", by_method, buckets=RATIO_BUCKETS, registry=r)
        self.ttft = Histogram("pardec_time_to_first_token_seconds", "Prefill and first token, from the start of "
                              "decoding (queue wait excluded)", buckets=SECONDS_BUCKETS, registry=r)
        self.queue_wait = Histogram("pardec_queue_wait_seconds", "Time a request waited for the decoding worker",
                                    buckets=SECONDS_BUCKETS, registry=r)
        self.duration = Histogram("pardec_generation_seconds", "Time from the start of decoding to the end",
                                  by_method, buckets=SECONDS_BUCKETS, registry=r)
        self.queue_length = Gauge("pardec_queue_length", "Requests waiting for the decoding worker", registry=r)
        self.running = Gauge("pardec_running", "Generations being decoded (the worker runs one at a time)",
                             registry=r)

    def watch_queue(self, length: Callable[[], int]) -> None:
        """Read the queue length at scrape time."""
        self.queue_length.set_function(length)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
