"""The decoding worker: one thread that owns the Session and decodes one request at a time.

Why one at a time: a forward pass of the model already uses every core (torch's
intra-op threads; on the 2-core CPUs pardec is measured on, both), so two generations
side by side would each run at about half speed: no more tokens per second in total,
and every reply later. Batching requests into one forward would need one batched
decoding loop with a draft tree per request, which pardec's loop (one sequence, one
tree) does not do. And a `Session` has one current method and one KV cache per
generation: it is not meant for two threads. So requests wait in a bounded FIFO queue
and the worker takes them in order; a full queue is answered with 429 and an estimate
of the wait (`retry_after_s`).

The event loop talks to the worker through a `Job`: the worker posts `Started`, then
`Delta`s (streamed requests only), then exactly one `Finished` or `Failed`, each with
`loop.call_soon_threadsafe` onto the job's asyncio queue. `Job.cancel()` (the client
went away, the server stops) ends the generation after the current decoding step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from pardec_cli.errors import PardecError
from pardec_cli.planning import plan_reply
from pardec_cli.serve.metrics import ServerMetrics
from pardec_cli.serve.protocol import ApiError, GenerationRequest, usage

log = logging.getLogger("pardec.serve")


@dataclass(frozen=True)
class Started:
    """The prompt was prefilled and the first token chosen: the reply begins."""

    method: str
    knobs: dict[str, Any]
    profile: str


@dataclass(frozen=True)
class Delta:
    """New text (streamed requests only)."""

    text: str


@dataclass(frozen=True)
class Finished:
    """The generation ended; `usage` is the response's usage object."""

    text: str
    finish_reason: str
    usage: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """The generation could not start (bad method for this model, prompt too long...)."""

    error: ApiError


@dataclass
class Job:
    """One request on its way through the worker."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=perf_counter)

    def post(self, item: Any) -> None:
        """Hand `item` to the event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server has stopped, nobody is listening
            pass

    def cancel(self) -> None:
        """Stop after the current step (or skip the job if it has not started)."""
        self.cancelled.set()


class DecodingWorker:
    """A thread that takes jobs from a bounded queue and decodes them on `session`."""

    def __init__(self, session: Any, *, max_queue: int, metrics: ServerMetrics) -> None:
        from pardec_cli.selection.profiles import load_profiles

        self.session = session
        self.metrics = metrics
        self.profiles = load_profiles()
        # Built now, so the first request with method auto does not pay for it.
        self.selector = session.auto_selector()
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="pardec-decoder", daemon=True)
        self._current: Job | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._mean_s = 1.0  # moving average of a generation's duration, for Retry-After
        metrics.watch_queue(self._queue.qsize)

    # -- the event loop's side --------------------------------------------------------

    def start(self) -> None:
        if not self._thread.is_alive() and not self._stopping.is_set():
            self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise ApiError 429 (queue full) / 503 (stopping)."""
        if self._stopping.is_set():
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            wait = self.retry_after_s()
            raise ApiError(429, f"the server is busy: {self._queue.maxsize} requests are waiting; "
                           f"retry in about {wait} s", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(wait)}) from None

    def retry_after_s(self) -> int:
        """Seconds until the queue has room, estimated from recent generations (at least 1)."""
        return max(1, math.ceil(self._mean_s * (self._queue.qsize() + 1) / max(1, self._queue.maxsize)))

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is queued and running, and wait for the thread (idempotent)."""
        with self._lock:
            if self._stopping.is_set() and not self._thread.is_alive():
                return
            self._stopping.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(Failed(ApiError(503, "the server is shutting down", type="server_error",
                                         code="shutting_down")))
        current = self._current
        if current is not None:
            current.cancel()
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    # -- the worker thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._current = job
            try:
                self._decode(job)
            except Exception:  # a bug: answer the request, keep serving the others
                log.exception("generation failed")
                job.post(Failed(ApiError(500, "internal error while generating (see the server's log)",
                                         type="server_error")))
            finally:
                self._current = None

    def _decode(self, job: Job) -> None:
        request = job.request
        started = perf_counter()
        self.metrics.queue_wait.observe(started - job.enqueued_at)
        if job.cancelled.is_set():
            self.metrics.requests.labels(request.method, request.profile, "cancelled").inc()
            job.post(Failed(ApiError(499, "cancelled before it started")))
            return
        session = self.session
        try:
            plan = plan_reply(request.plan_text, method=request.method, options=request.knobs,
                              profile=request.profile, settings=request.settings, user_set=request.user_set,
                              profiles=self.profiles, selector=self.selector)
            sampling = plan.settings.sampling
            if sampling.seed is not None and not sampling.greedy:
                # Methods that learn across replies (suffix, recycling) draft differently
                # after each one; under sampling other drafts draw other random numbers.
                # A fresh proposer makes a seed give the same text every time, as
                # `pardec gen --seed` does. Greedy text never depends on the drafts.
                proposer = session.build_proposer(plan.method, plan.knobs)
            else:
                session.set_method(plan.method, plan.knobs)
                proposer = session.proposer
            prompt_ids = session.encode(request.prompt, raw=plan.settings.raw)
            stream = session.stream(prompt_ids, max_new_tokens=plan.settings.max_tokens, sampling=sampling,
                                    stop=plan.settings.stop, proposer=proposer)
            chunks = iter(stream)
            first = next(chunks)  # the prefill: a prompt too long for the context fails here
        except PardecError as exc:
            job.post(Failed(ApiError.from_pardec(exc)))
            return
        labels = (plan.method, plan.profile)
        self.metrics.running.inc()
        try:
            self.metrics.ttft.observe(perf_counter() - started)
            job.post(Started(plan.method, proposer.knobs(), plan.profile))
            wants_text = request.stream
            if wants_text and first.text:
                job.post(Delta(first.text))
            tokens_per_step = self.metrics.tokens_per_step.labels(*labels)
            try:
                for chunk in chunks:
                    tokens_per_step.observe(len(chunk.event.tokens))
                    if wants_text and chunk.text:
                        job.post(Delta(chunk.text))
                    if job.cancelled.is_set():
                        break
            except PardecError as exc:  # a method that fails mid-reply: answered, and the server goes on
                self.metrics.requests.labels(*labels, "error").inc()
                job.post(Failed(ApiError.from_pardec(exc)))
                return
            tail = stream.finish() if stream.finish_reason is None else ""
            if wants_text and tail:
                job.post(Delta(tail))
        finally:
            self.metrics.running.dec()
        elapsed = perf_counter() - started
        self._mean_s = 0.8 * self._mean_s + 0.2 * elapsed
        stats = stream.stats
        self._record(labels, stream.finish_reason or "", stats, elapsed)
        extension = {
            "method": plan.method, "knobs": proposer.knobs(), "profile": plan.profile,
            "dtype": session.dtype, "device": session.device,
            "finish_reason": stream.finish_reason, "tokens_per_step": round(stats.mean_tokens_per_step, 4),
            "queued_s": round(started - job.enqueued_at, 5), "stats": stats.to_dict(),
        }
        job.post(Finished(stream.text, stream.finish_reason or "",
                          usage(stats.prompt_tokens, stats.generated_tokens, extension)))

    def _record(self, labels: tuple[str, str], finish_reason: str, stats: Any, elapsed: float) -> None:
        m = self.metrics
        m.requests.labels(*labels, finish_reason).inc()
        m.prompt_tokens.labels(*labels).inc(stats.prompt_tokens)
        m.generated_tokens.labels(*labels).inc(stats.generated_tokens)
        m.steps.labels(*labels).inc(stats.steps)
        m.drafted_tokens.labels(*labels).inc(stats.drafted_tokens)
        m.accepted_tokens.labels(*labels).inc(stats.accepted_tokens)
        if stats.drafted_tokens:
            m.acceptance.labels(*labels).observe(stats.acceptance_rate)
        m.duration.labels(*labels).observe(elapsed)
