"""Check the runner's CUDA path on a GPU and time its steps against the bandwidth floor.

Parts, each independent (a failure is printed and the next part runs):

- env: torch, the GPU, the measured device-to-device copy bandwidth;
- exact: every method's greedy tokens on tiny float32 models, eagerly and through the
  compiled runner (torch.compile, CUDA graphs), against Hugging Face generate() on the
  same device; Medusa and EAGLE heads too;
- cli: `pardec` itself on the device, each command in its own process (import of a tiny
  GGUF, bench over every weight mode with each method's match against plain decoding, gen,
  doctor, serve answering one request), on tiny models over SmolLM2's real tokenizer
  (`--tokenizer-from`: a model folder with tokenizer files and config.json);
- loop: where a decoding step's time goes through the loop on the compiled runner
  (SmolLM2-135M's architecture, random bf16 weights, a repetitive prompt so that drafts
  are made): milliseconds per step, the step's graph alone (synchronized), the rest, and
  the Python functions that rest is spent in (cProfile);
- curve: one forward of k new tokens over a 300-token cache, eager (`LanguageModel`,
  dynamic cache) against compiled (`CompiledLanguageModel`), for SmolLM2-135M's and
  Llama-3-8B's architectures with random bf16 weights (dense, int8, int4),
  next to the bandwidth floor of the bytes one forward reads (weights, the output head,
  the cache).

`--variants` runs the compiled steps under several sets of inductor options side by side
(`VARIANTS`: the runner's own, CUDA graphs alone, with coordinate descent tuning), and
`--exact-variant` the exact part under one of them.

    python -m devtools.cuda_check [--parts env,exact,cli,loop,curve] [--device cuda] [--json FILE]
        [--shapes smollm2-135m,llama3-8b,llama3-8b-8l] [--weights full,int4] [--variants runner,graphs]

Random weights do not change a step's cost; they do change what drafts get accepted,
which is why exactness runs on tiny models and speed-ups end to end need a real model
(`pardec bench --device cuda`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import traceback
from pathlib import Path
from time import perf_counter, time
from typing import Any

#: Architectures timed by the curve part (Hugging Face LlamaConfig fields).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
    ),
    "llama3-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False,
    ),
}
#: Llama-3-8B's layers and head, 8 of its 32 layers: a quarter of the compile time, the
#: same kernels (4.5 GB a step in bf16, a quarter of it the output head).
SHAPES["llama3-8b-8l"] = {**SHAPES["llama3-8b"], "num_hidden_layers": 8}

#: Compile variants the curve and exact parts can run the runner's steps with: "runner"
#: is the runner's own `compile_options`; the others are inductor options passed instead
#: (mode "reduce-overhead" is {"triton.cudagraphs": True}).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "runner": None,
    "graphs": {"triton.cudagraphs": True},
    "graphs+cdt": {"triton.cudagraphs": True, "coordinate_descent_tuning": True},
}


def variant_compile(variant: str) -> Any:
    """The `compile_fn` a `CompiledLanguageModel` gets for `variant` (None: its own)."""
    options = VARIANTS[variant]
    if options is None:
        return None

    def compile_fn(fn: Any, **_: Any) -> Any:
        import torch

        return torch.compile(fn, fullgraph=True, options=dict(options))

    return compile_fn


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------ env


def part_env(device: str) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if torch.device(device).type != "cuda":
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count,
                capability=f"{props.major}.{props.minor}")  # fmt: skip
    # Device-to-device copy of 2 GiB, bytes read plus written, median of 10 after 3 warm-ups.
    src = torch.randn(2**29, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        sync(device)
        t0 = perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 3:
            times.append(perf_counter() - t0)
    info["copy_gb_s"] = round(2 * src.nbytes / statistics.median(times) / 1e9, 1)
    del src, dst
    torch.cuda.empty_cache()
    return info


# ------------------------------------------------------------------ exact


def part_exact(device: str, limit: int = 40, variant: str = "runner") -> dict[str, Any]:
    from pardec_cli.engine.loop import decode
    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.methods import registry
    from pardec_cli.methods.base import MethodEnv
    from tests.head_helpers import write_eagle1, write_eagle3, write_medusa
    from tests.test_exactness import METHOD_CASES, FakeTokenizer, hf_greedy, random_prompt
    from tests.test_methods_draftfree import TREE_CASES
    from tests.tiny_models import peaked, tiny_llama

    heads_dir = Path(tempfile.mkdtemp(prefix="pardec-heads-"))
    results: dict[str, Any] = {}
    for seed, sharp in ((0, True), (1, False)):
        model = tiny_llama(seed)
        model = (peaked(model) if sharp else model).to(device)
        drafter = peaked(tiny_llama(seed + 100, layers=2)).to(device)
        cases = list(METHOD_CASES) + list(TREE_CASES)
        folders: dict[str, Path] = {}
        if sharp:  # heads: written on the CPU copy of the weights, loaded by the method
            cpu_model = peaked(tiny_llama(seed))
            folders = {kind: heads_dir / f"{kind}-{seed}" for kind in ("medusa", "eagle", "eagle3")}
            write_medusa(folders["medusa"], cpu_model, seed=2)
            write_eagle1(folders["eagle"], cpu_model, seed=2)
            write_eagle3(folders["eagle3"], cpu_model, seed=2)
            cases += [("medusa", {}), ("eagle", {}), ("eagle3", {"topk": 3, "depth": 3, "nodes": 8})]
        prompt = random_prompt(seed)
        reference = hf_greedy(model, prompt, limit)
        notices: list[str] = []
        compiled = CompiledLanguageModel(model, on_notice=notices.append, compile_fn=variant_compile(variant))
        targets = {"eager": LanguageModel(model), "compiled": compiled}
        vocab = model.config.vocab_size

        def load(spec: str, drafter: Any = drafter, vocab: int = vocab) -> tuple[Any, Any]:
            return LanguageModel(drafter), FakeTokenizer(vocab)

        label = "peaked" if sharp else "flat"
        for method, options in cases:
            name = f"{label} {method}{json.dumps(options, separators=(',', ':')) if options else ''}"
            row: dict[str, Any] = {}
            for kind, target in targets.items():
                try:
                    env = MethodEnv(target, FakeTokenizer(vocab), load, folders.get, "tiny")
                    proposer = registry.create(method, options, env)
                    t0 = perf_counter()
                    events = list(decode(target, proposer, prompt, max_new_tokens=limit))
                    seconds = perf_counter() - t0
                    tokens = [t for e in events for t in e.tokens]
                    row[kind] = {"same": tokens == reference, "steps": len(events), "seconds": round(seconds, 2),
                                 "first_diff": next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)}  # fmt: skip
                except Exception as exc:
                    row[kind] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                    traceback.print_exc()
            results[name] = row
            cells = []
            for kind in targets:
                r = row[kind]
                cells.append(f"{kind}: " + (r["error"][:120] if "error" in r else ("same" if r["same"] else f"DIFF@{r['first_diff']}") + f" {r['steps']} steps {r['seconds']}s"))
            say(f"  {name:58s} " + " | ".join(cells))
        runner = targets["compiled"]
        results[f"{label} graphs"] = {k: {"failed": s.failed, "compile_s": s.compile_seconds} for k, s in runner.graph_states().items()}
        results[f"{label} notices"] = notices
        say(f"  {label} graphs: {results[f'{label} graphs']}")
        say(f"  {label} notices: {notices}")
    same = sum(1 for r in results.values() if isinstance(r, dict) and r.get("compiled", {}).get("same"))
    total = sum(1 for r in results.values() if isinstance(r, dict) and "compiled" in r)
    say(f"exact ({variant}): compiled runner equals HF generate() in {same} of {total} cases")
    return results


# ------------------------------------------------------------------ loop


def part_loop(device: str, methods: list[str], tokens: int) -> dict[str, Any]:
    import cProfile
    import io
    import pstats

    import torch

    from pardec_cli.engine.loop import decode
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.methods import registry
    from pardec_cli.methods.base import MethodEnv
    from tests.test_exactness import FakeTokenizer

    class Timed(CompiledLanguageModel):
        """The runner, timing its compiled steps (synchronized before and after) when asked."""

        timing = False
        graph_s = 0.0
        graphs = 0

        def _compiled_step(self, kind: str, hidden: bool, args: tuple[Any, ...]) -> Any:
            if not self.timing:
                return super()._compiled_step(kind, hidden, args)
            sync(device)
            t0 = perf_counter()
            out = super()._compiled_step(kind, hidden, args)
            sync(device)
            self.graph_s += perf_counter() - t0
            self.graphs += 1
            return out

    model = _random_model("smollm2-135m", device, torch.bfloat16)
    target = Timed(model)
    vocab = model.config.vocab_size
    prompt = [int(t) for t in torch.arange(100, 164)] * 4  # repeats: suffix and pld find matches

    def run(method: str) -> tuple[float, int, int]:
        env = MethodEnv(target, FakeTokenizer(vocab), model_name="smollm2-135m (random)")
        proposer = registry.create(method, {}, env)
        events = list(decode(target, proposer, prompt, max_new_tokens=tokens))
        sync(device)
        # After the (eager) prefill: events[0] is the first token.
        return events[-1].elapsed_s - events[0].elapsed_s, len(events) - 1, sum(len(e.tokens) for e in events[1:])

    results: dict[str, Any] = {}
    for method in methods:
        try:
            for _ in range(2):  # compile, record each CUDA graph
                run(method)
            seconds, steps, produced = run(method)
            target.timing, target.graph_s, target.graphs = True, 0.0, 0
            synced, _, _ = run(method)
            graph_ms = 1000 * target.graph_s / max(target.graphs, 1)
            target.timing = False
            profile = cProfile.Profile()
            profile.enable()
            run(method)
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
            row = {"ms_per_step": round(1000 * seconds / steps, 3), "tokens_per_step": round(produced / steps, 2),
                   "graph_ms_synced": round(graph_ms, 3), "synced_ms_per_step": round(1000 * synced / steps, 3),
                   "profile": text.getvalue()}  # fmt: skip
            results[method] = row
            say(f"  {method:18s} {row['ms_per_step']:.3f} ms/step ({row['tokens_per_step']} tokens/step); synced: "
                f"{row['synced_ms_per_step']:.3f} ms/step of which the graph {graph_ms:.3f} ms")
            say("\n".join(line[:180] for line in text.getvalue().splitlines()[:40]))
        except Exception as exc:
            traceback.print_exc()
            results[method] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


# ------------------------------------------------------------------ cli


def _pardec(args: list[str], env: dict[str, str], timeout: float = 600) -> dict[str, Any]:
    """One `pardec` command in its own process: exit code, seconds, stdout, stderr's tail,
    whether stderr holds a traceback."""
    import subprocess

    t0 = perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pardec_cli", *args], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"args": args, "rc": None, "seconds": round(perf_counter() - t0, 1), "stdout": "", "stderr": "timed out",
                "traceback": False}  # fmt: skip
    return {"args": args, "rc": done.returncode, "seconds": round(perf_counter() - t0, 1), "stdout": done.stdout,
            "stderr": done.stderr[-1500:], "traceback": "Traceback" in done.stderr}  # fmt: skip


def part_cli(device: str, tokenizer_dir: Path, deadline: float) -> dict[str, Any]:
    """`pardec` itself on the device, as a user runs it, each command in its own process:
    a GGUF import, bench over every weight mode (each method's match against plain decoding
    on the same weights), gen's JSON and plain text, doctor, serve answering one request.
    Tiny models (a peaked Llama over SmolLM2's real tokenizer, the test suite's tiny GGUF)."""
    import http.client
    import os
    import subprocess

    from tests.test_quant import write_tiny_gguf
    from tests.tiny_models import peaked, save_with_real_tokenizer, tiny_llama

    work = Path(tempfile.mkdtemp(prefix="pardec-cli-"))
    env = {**os.environ, "PARDEC_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    dense = work / "dense"
    dense.mkdir()
    save_with_real_tokenizer(lambda v: peaked(tiny_llama(vocab=v, layers=2, hidden=64, max_positions=1024)),
                             tokenizer_dir, dense)  # fmt: skip
    write_tiny_gguf(work / "tiny.Q4_1.gguf")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in enumerate([
        ("code", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nRewrite both with type hints."),
        ("chat", "Tell me a short story about a lighthouse keeper and a cat."),
    ])))  # fmt: skip
    results: dict[str, Any] = {}

    def record(name: str, run: dict[str, Any]) -> dict[str, Any]:
        results[name] = run
        state = "ok" if run["rc"] == 0 and not run["traceback"] else f"rc={run['rc']}{' TRACEBACK' if run['traceback'] else ''}"
        say(f"  {name:44s} {state:14s} {run['seconds']:6.1f} s")
        if state != "ok":
            say("    " + run["stderr"].strip().replace("\n", "\n    ")[-1200:])
        return run

    record("import tiny GGUF", _pardec(["import", str(work / "tiny.Q4_1.gguf"), "--name", "tinyq", "-q"], env))
    benches = [
        ("dense float32 eager", ["-m", str(dense), "--dtype", "float32", "--compile", "off",
                                 "--methods", "vanilla,pld,suffix,lookahead,recycling,suffix+recycling,auto", "--baseline", "hf"]),
        ("dense bfloat16", ["-m", str(dense), "--dtype", "bfloat16", "--compile", "off", "--methods", "vanilla,pld,auto"]),
        ("dense int8", ["-m", str(dense), "--weights", "int8", "--compile", "off", "--methods", "vanilla,pld"]),
        ("dense int4", ["-m", str(dense), "--weights", "int4", "--compile", "off", "--methods", "vanilla,pld"]),
        ("gguf auto", ["-m", "tinyq", "--compile", "off", "--methods", "vanilla,pld"]),
        ("gguf int4", ["-m", "tinyq", "--weights", "int4", "--compile", "off", "--methods", "vanilla,pld"]),
        ("gguf int8", ["-m", "tinyq", "--weights", "int8", "--compile", "off", "--methods", "vanilla,pld"]),
        ("gguf q4q8 (CPU kernels)", ["-m", "tinyq", "--weights", "q4q8", "--compile", "off", "--methods", "vanilla"]),
    ]  # fmt: skip
    for name, args in benches:
        if time() > deadline:
            say(f"  bench {name}: skipped (out of time)")
            continue
        out = work / f"{name.replace(' ', '_')}.json"
        run = record(f"bench {name}", _pardec(["bench", "--device", device, "--prompts", str(prompts), "-n", "48",
                                               "--rounds", "1", "-q", "--json", str(out), *args], env))  # fmt: skip
        if out.exists():
            report = json.loads(out.read_text())
            run["config"] = report["config"]
            run["overall"] = {m: {k: row.get(k) for k in ("tokens_per_s", "speedup_vs_vanilla", "mean_tokens_per_step", "match_rate")}
                              for m, row in report["summary"]["overall"].items()}  # fmt: skip
            say(f"    {report['config']['device']}: " + "; ".join(
                f"{m} {r['tokens_per_s']:.0f} tok/s, {r['mean_tokens_per_step']} tok/step, match {r['match_rate']:.0%}"
                for m, r in run["overall"].items() if r["tokens_per_s"] is not None))  # fmt: skip
    if time() < deadline:  # heads trained on the device, then decoding with them (float32: exact)
        record("train-heads medusa", _pardec(["train-heads", "--device", device, "-m", str(dense), "--kind", "medusa",
                                              "--steps", "20", "--heads", "2", "--samples", "4", "--reply-tokens", "16",
                                              "--dtype", "float32"], env))  # fmt: skip
        out = work / "medusa.json"
        run = record("bench medusa", _pardec(["bench", "--device", device, "--prompts", str(prompts), "-n", "32",
                                              "--rounds", "1", "-q", "--json", str(out), "-m", str(dense), "--dtype",
                                              "float32", "--compile", "off", "--methods", "vanilla,medusa"], env))  # fmt: skip
        if out.exists():
            medusa = json.loads(out.read_text())["summary"]["overall"]["medusa"]
            run["overall"] = medusa
            say(f"    medusa: {medusa['mean_tokens_per_step']} tok/step, match {medusa['match_rate']:.0%}")
        record("tune --budget 1", _pardec(["tune", "--device", device, "-m", str(dense), "--budget", "1", "--methods",
                                           "pld", "-n", "16", "--compile", "off"], env))  # fmt: skip
    if time() < deadline:
        gen = record("gen --json", _pardec(["gen", "--device", device, "-m", str(dense), "-n", "24", "--json",
                                            "--method", "pld[num_draft=4]", "def f(x):\n    return x"], env))  # fmt: skip
        if gen["rc"] == 0:
            reply = json.loads(gen["stdout"])
            say(f"    {reply['device']} {reply['dtype']} {reply['weights']} runner {reply['runner']} compiled {reply['compiled']}: "
                f"{reply['stats']['generated_tokens']} tokens, {reply['stats']['mean_tokens_per_step']} a step")  # fmt: skip
        plain = record("gen (text to stdout)", _pardec(["gen", "--device", device, "-m", "tinyq", "-n", "12", "hello"], env))
        say(f"    stdout: {plain['stdout'][:200]!r}")
        doctor = record("doctor --json", _pardec(["doctor", "--device", device, "-m", str(dense), "--json"], env))
        if doctor["rc"] == 0:
            facts = json.loads(doctor["stdout"])
            say(f"    gpus {facts['machine']['gpus']}; device {facts['machine']['device']} {facts['machine']['dtype']}")
            say(f"    floor {json.dumps(facts.get('floor'))}")
            say(f"    auto {json.dumps({p: a.get('label') for p, a in facts['model'].get('auto', {}).items()})}")
    if time() < deadline:  # serve: one chat completion
        t0 = perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pardec_cli", "serve", "--device", device, "-m", str(dense),
                                 "--port", "0", "--compile", "off"], stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        try:
            line = ""
            for _ in range(20):  # notices may come first (the cost curve being measured)
                line = proc.stderr.readline()
                if "127.0.0.1:" in line or not line:
                    break
            port = int(line.split("127.0.0.1:")[1].split("/")[0])
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            body = {"model": str(dense), "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            results["serve"] = {"status": response.status, "reply": answer, "first_line": line.strip()}
            say(f"  serve: {line.strip()[:160]}; HTTP {response.status}: {json.dumps(answer)[:300]} ({perf_counter() - t0:.1f} s)")
        except Exception as exc:
            results["serve"] = {"error": f"{type(exc).__name__}: {exc}"}
            say(f"  serve FAILED: {exc}; stderr: {proc.stderr.read()[-1500:] if proc.poll() is not None else ''}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    failed = [n for n, r in results.items() if isinstance(r, dict) and (r.get("rc") not in (0, None) or r.get("traceback"))]
    say(f"cli: {len(results)} commands, failed: {failed or 'none'}")
    return results


# ------------------------------------------------------------------ curve


def _random_model(shape: str, device: str, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.requires_grad_(False)
    return model


def _bytes_read(model: Any, context: int) -> int:
    """Bytes one forward must read: every weight once (the embedding table only through a
    tied head), plus the KV cache of `context` positions."""
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embed
    total = sum(p.nbytes for p in model.parameters()) + sum(b.nbytes for n, b in model.named_buffers() if "inv_freq" not in n)
    if not tied:
        total -= embed.nbytes
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    total += 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * context * embed.element_size()
    return total


def part_curve(device: str, shapes: list[str], weights: list[str], ks: list[int], context: int, repeats: int,
               bandwidth: float | None, deadline: float, variants: list[str]) -> dict[str, Any]:  # fmt: skip
    """Per shape and weight mode ("full", "int8", "int4"): the eager step
    and the compiled one under each compile variant, interleaved k by k."""
    import torch

    from devtools.runner_speed import time_steps
    from pardec_cli.engine.model import LanguageModel
    from pardec_cli.engine.runner import CompiledLanguageModel
    from pardec_cli.quant import quantize_linears

    results: dict[str, Any] = {}
    for shape in shapes:
        for mode in weights:
            if time() > deadline:
                say(f"  {shape} {mode}: skipped (out of time)")
                continue
            if mode == "int4" and not shape.startswith("llama3-8b"):
                continue  # SmolLM2's 576-wide layers miss the CUDA int4 kernel's tile multiples
            key = f"{shape} bf16 {mode}"
            say(f"  {key}")
            try:
                began = perf_counter()
                model = _random_model(shape, device, torch.bfloat16)
                replaced = quantize_linears(model, mode) if mode != "full" else 0
                notices: list[str] = []
                lms: dict[str, Any] = {"eager": LanguageModel(model)}
                for variant in variants:
                    lms[variant] = CompiledLanguageModel(model, on_notice=notices.append, compile_fn=variant_compile(variant))

                def show(row: dict[str, Any], names: tuple[str, ...] = tuple(lms)) -> None:
                    say(f"    k={row['k']:3d}  " + "  ".join(f"{n} {row[n][1]:8.3f} ms ({row[n][0]:.3f}-{row[n][2]:.3f})" for n in names))

                # Each graph compiles in its kind's first untimed round; CUDA graph trees warm
                # up, record, then replay (4 untimed rounds).
                rows = time_steps(lms, context, ks, repeats, warmup=4, sync=lambda: sync(device), on_row=show)
                read = _bytes_read(model, context)
                floor_ms = read / (bandwidth * 1e9) * 1000 if bandwidth else None
                one = {v: round(rows[0][v][1], 3) for v in variants} if rows and rows[0]["k"] == 1 else {}
                results[key] = {
                    "rows": rows, "bytes_read": read, "floor_ms": floor_ms, "quantized_layers": replaced,
                    "seconds": round(perf_counter() - began, 1), "notices": notices,
                    "graphs": {v: {k: (s.failed, s.compile_seconds and round(s.compile_seconds, 1))
                                   for k, s in lms[v].graph_states().items()} for v in variants},
                }  # fmt: skip
                say(f"    bytes read {read / 1e6:.0f} MB; floor {floor_ms and round(floor_ms, 3)} ms; one-token "
                    + ", ".join(f"{v} {ms} ms = {floor_ms and round(ms / floor_ms, 2)}x floor" for v, ms in one.items())
                    + f"; {results[key]['seconds']} s; graphs {results[key]['graphs']}; notices {notices}")
                del model, lms
            except Exception as exc:
                traceback.print_exc()
                results[key] = {"error": f"{type(exc).__name__}: {exc}"}
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="env,exact,curve")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", default="vanilla,pld,suffix,suffix+recycling", help="methods the loop part runs")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per generation in the loop part")
    parser.add_argument("--shapes", default="smollm2-135m,llama3-8b")
    parser.add_argument("--weights", default="full,int4", help="full, int8, int4")
    parser.add_argument("--variants", default="runner", help="compile variants: " + ", ".join(VARIANTS))
    parser.add_argument("--exact-variant", default="runner", help="the compile variant of the exact part")
    parser.add_argument("--ks", default="1,2,4,8,16,32")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--budget", type=float, default=420, help="seconds after which no new curve starts")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tokenizer-from", default=str(Path.home() / ".local/share/pardec/models/smollm2-135m"),
                        help="a model folder whose tokenizer the cli part's tiny model takes (SmolLM2's)")
    args = parser.parse_args()
    deadline = time() + args.budget
    parts = args.parts.split(",")
    report: dict[str, Any] = {}
    if "env" in parts:
        report["env"] = part_env(args.device)
        say("env:", json.dumps(report["env"]))
    if "exact" in parts:
        say("exact:")
        try:
            report["exact"] = part_exact(args.device, variant=args.exact_variant)
        except Exception as exc:
            traceback.print_exc()
            report["exact"] = {"error": str(exc)}
    if "cli" in parts:
        say("cli:")
        report["cli"] = part_cli(args.device, Path(args.tokenizer_from), deadline)
    if "loop" in parts:
        say("loop:")
        report["loop"] = part_loop(args.device, args.methods.split(","), args.tokens)
    if "curve" in parts:
        say("curve:")
        bandwidth = report.get("env", {}).get("copy_gb_s")
        report["curve"] = part_curve(args.device, args.shapes.split(","), args.weights.split(","),
                                     [int(k) for k in args.ks.split(",")], args.context, args.repeats, bandwidth, deadline,
                                     args.variants.split(","))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    sys.exit(0)


if __name__ == "__main__":
    main()
