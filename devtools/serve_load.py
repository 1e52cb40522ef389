"""Time to first token and throughput of a running `pardec serve`, measured from clients.

    python -m devtools.serve_load --url http://127.0.0.1:8000 [--ttft 10] [--clients 16]
        [--requests 2] [-n 16] [--prompt TEXT]

1. Time to first token on the warm server: `--ttft` streamed requests one after the
   other; each one's client-side time from sending the request to the first text,
   against the prefill time the server measured for it (usage.pardec.stats.ttft_s: the
   prefill and the first token's choice). The difference is what the server adds
   (HTTP, parsing, queue, planning, tokenising, the hand-over to the event loop).
2. Load: `--clients` threads, each streaming `--requests` requests one after the
   other; requests/s over the whole run, and the p50/p99 of the request latency (send to
   [DONE]) and of the time to first token, plus the statuses seen. Every request must
   end with exactly one finish chunk.

Only for loopback servers you started; it sends greedy requests with few tokens.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from pardec_cli.serve.client import ServerClient

PROMPT = "Write a Python function that checks whether a number is prime."


def one_request(client: ServerClient, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Stream one chat completion; return client-side timings and the server's statistics."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    start = time.perf_counter()
    first = None
    finishes = 0
    pardec: dict[str, Any] = {}
    for event in client.stream("/chat/completions", body):
        for choice in event.get("choices") or []:
            if first is None and (choice.get("delta") or {}).get("content"):
                first = time.perf_counter() - start
            if choice.get("finish_reason"):
                finishes += 1
        pardec = event.get("pardec", pardec)
    return {"ttft_s": first, "latency_s": time.perf_counter() - start, "finishes": finishes, "pardec": pardec}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--ttft", type=int, default=10, help="sequential requests for the time to first token")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("-n", "--max-tokens", type=int, default=16)
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args(argv)
    client = ServerClient(args.url)
    model = client.model()

    if args.ttft:
        one_request(client, model, args.prompt, args.max_tokens)  # warm
        rows = [one_request(client, model, args.prompt, args.max_tokens) for _ in range(args.ttft)]
        client_ms = [r["ttft_s"] * 1000 for r in rows]
        prefill_ms = [r["pardec"]["stats"]["ttft_s"] * 1000 for r in rows]
        extra = [c - p for c, p in zip(client_ms, prefill_ms)]
        print(f"time to first token, {args.ttft} sequential requests ({rows[0]['pardec'].get('method')}):")
        print(f"  client       median {statistics.median(client_ms):.1f} ms")
        print(f"  prefill      median {statistics.median(prefill_ms):.1f} ms (server's ttft_s)")
        print(f"  added        median {statistics.median(extra):.1f} ms, max {max(extra):.1f} ms")

    if args.clients:
        results: list[dict[str, Any]] = []
        errors: list[str] = []
        lock = threading.Lock()

        def run() -> None:
            for _ in range(args.requests):
                try:
                    result = one_request(ServerClient(args.url), model, args.prompt, args.max_tokens)
                except Exception as exc:  # noqa: BLE001 - counted and printed
                    with lock:
                        errors.append(str(exc))
                    continue
                with lock:
                    results.append(result)

        threads = [threading.Thread(target=run) for _ in range(args.clients)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        latency = [r["latency_s"] for r in results]
        ttft = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
        tokens = sum(r["pardec"]["stats"]["generated_tokens"] for r in results if r["pardec"])
        total = args.clients * args.requests
        print(f"load: {args.clients} streaming clients x {args.requests} requests, -n {args.max_tokens}, "
              f"{wall:.1f} s")
        print(f"  completed    {len(results)} of {total}, exactly one finish each: "
              f"{all(r['finishes'] == 1 for r in results)}; errors {len(errors)} {errors[:2]}")
        print(f"  throughput   {len(results) / wall:.2f} requests/s, {tokens / wall:.1f} tokens/s")
        if latency:
            print(f"  latency      p50 {percentile(latency, 50):.2f} s, p99 {percentile(latency, 99):.2f} s")
        if ttft:
            print(f"  first token  p50 {percentile(ttft, 50):.2f} s, p99 {percentile(ttft, 99):.2f} s")


if __name__ == "__main__":
    main()
