"""`pardec serve`: the official `openai` client against a server on 127.0.0.1, raw HTTP
for the errors, a bounded load test, cancellation, metrics, the API key, shutdown.

The model is a tiny random Llama with the real SmolLM2 tokenizer (`tiny_cli_model`),
in float32, where greedy output is exact: the server's text must equal `pardec gen`'s
for the same prompt and method.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import invoke
from tests.serve_helpers import Served, metric_samples, raw_request, running_server, total

ROOT = Path(__file__).resolve().parents[1]
CODE_PROMPT = "Write a Python function that returns the squares of a list of numbers."
CHAT_PROMPT = "What should I cook tonight?"
PROMPTS = [CODE_PROMPT, CHAT_PROMPT, "Summarise the following text: the cat sat on the mat, then it slept.",
           "Tell me about the moon."]


@pytest.fixture(scope="module")
def served(tiny_cli_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the module, with its own empty pardec home (no tuned results)."""
    home = tmp_path_factory.mktemp("serve-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARDEC_HOME", str(home / "pardec"))
        mp.setenv("PARDEC_CONFIG_DIR", str(home / "config"))
        mp.setenv("HF_HOME", str(home / "hf"))
        # Built before any test's isolated home: without this the server's auto would
        # measure its own step-cost curve (timing) where gen, with learning off, estimates it.
        mp.setenv("PARDEC_LEARN", "0")
        with running_server(tiny_cli_model, max_tokens_limit=512, max_body_bytes=64 * 1024) as server:
            yield server


@pytest.fixture
def client(served: Served):
    from openai import OpenAI

    return OpenAI(base_url=served.v1, api_key="unused", max_retries=0)


_GEN_CACHE: dict[tuple, dict] = {}


def gen_record(model_dir: Path, prompt: str, *args: str) -> dict:
    """`pardec gen --json` for the same prompt (float32), cached per arguments."""
    key = (str(model_dir), prompt, args)
    if key not in _GEN_CACHE:
        result = invoke(["gen", "-m", str(model_dir), "--dtype", "float32", "--json", *args, prompt])
        assert result.exit_code == 0, result.stderr
        _GEN_CACHE[key] = json.loads(result.stdout)
    return _GEN_CACHE[key]


# -- the OpenAI client ----------------------------------------------------------------


def test_models_lists_the_one_served_model(client, served):
    assert [m.id for m in client.models.list().data] == [served.model]


def test_a_chat_completion_with_a_named_method_equals_gen(client, served, tiny_cli_model):
    reply = client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": CODE_PROMPT}], max_tokens=24,
        extra_body={"pardec": {"method": "pld", "knobs": {"num_draft": 4}}},
    )
    expected = gen_record(tiny_cli_model, CODE_PROMPT, "-n", "24", "--method", "pld", "-O", "num_draft=4")
    assert reply.choices[0].message.content == expected["text"]
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == expected["stats"]["generated_tokens"]
    assert reply.usage.prompt_tokens == expected["stats"]["prompt_tokens"]
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    pardec = reply.usage.model_extra["pardec"]
    assert pardec["method"] == "pld" and pardec["knobs"]["num_draft"] == 4
    assert pardec["profile"] == expected["profile"] == "code"
    assert pardec["tokens_per_step"] == expected["stats"]["mean_tokens_per_step"]
    assert pardec["stats"]["steps"] == expected["stats"]["steps"]


def test_a_streamed_chat_completion_with_auto_equals_gen(client, served, tiny_cli_model):
    stream = client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": CODE_PROMPT}], max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = gen_record(tiny_cli_model, CODE_PROMPT, "-n", "20")
    assert text == expected["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1
    pardec = finished[0].model_extra["pardec"]
    assert (pardec["method"], pardec["knobs"], pardec["profile"]) == (expected["method"], expected["knobs"], "code")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected["stats"]["generated_tokens"]
    assert len({c.id for c in chunks}) == 1


def test_a_completion_sends_the_prompt_raw_like_gen_raw(client, served, tiny_cli_model):
    prompt = "def fibonacci(n):"
    reply = client.completions.create(model=served.model, prompt=prompt, max_tokens=16)
    expected = gen_record(tiny_cli_model, prompt, "-n", "16", "--raw")
    assert reply.choices[0].text == expected["text"]
    assert reply.usage.prompt_tokens == expected["stats"]["prompt_tokens"]
    streamed = client.completions.create(model=served.model, prompt=prompt, max_tokens=16, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected["text"]


def test_sampling_with_a_seed_repeats_and_stop_strings_end_the_reply(client, served, tiny_cli_model):
    ask = dict(model=served.model, messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=24,
               temperature=0.9, top_p=0.9, seed=7)
    first, second = (client.chat.completions.create(**ask).choices[0].message.content for _ in range(2))
    assert first == second
    expected = gen_record(tiny_cli_model, CHAT_PROMPT, "-n", "24", "--temp", "0.9", "--top-p", "0.9", "--seed", "7")
    assert first == expected["text"]
    greedy = gen_record(tiny_cli_model, CHAT_PROMPT, "-n", "24", "--temp", "0")["text"]
    stop = greedy[len(greedy) // 2:][:3]
    assert stop
    reply = client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": CHAT_PROMPT}],
                                           max_tokens=24, stop=[stop], temperature=0)
    assert reply.choices[0].finish_reason == "stop"
    assert stop not in reply.choices[0].message.content
    assert greedy.startswith(reply.choices[0].message.content)


def test_a_request_without_sampling_settings_takes_the_profiles_defaults_like_gen(client, served, tiny_cli_model):
    from pardec_cli.selection.profiles import get_profile

    limit = get_profile("chat").sampling["max_tokens"]
    # The chat profile samples (temperature 0.8, top_p 0.95): with the same seed, the same text as gen.
    reply = client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": CHAT_PROMPT}],
                                           seed=7)
    assert reply.usage.completion_tokens <= limit
    assert reply.usage.model_extra["pardec"]["sampling"] == "T 0.8 p 0.95"
    expected = gen_record(tiny_cli_model, CHAT_PROMPT, "--seed", "7")
    assert reply.choices[0].message.content == expected["text"]


# -- errors: raw HTTP -----------------------------------------------------------------


def chat_body(served: Served, **fields) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


def assert_error(response, status: int, *, param: str | None = None, code: str | None = None) -> dict:
    assert response.status == status, response.body
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_malformed_json_is_a_400(served):
    assert_error(raw_request(served, "POST", "/v1/chat/completions", b'{"model": '), 400, code="invalid_json")
    assert_error(raw_request(served, "POST", "/v1/chat/completions", b"[1, 2]"), 400)


def test_an_unknown_model_is_a_404_that_names_the_served_one(served):
    error = assert_error(raw_request(served, "POST", "/v1/chat/completions", chat_body(served, model="gpt-4o")),
                         404, param="model", code="model_not_found")
    assert served.model in error["message"]


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),  # over --max-tokens-limit
    ({"max_tokens": "many"}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"logprobs": True}, "logprobs"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"bogus": 1}, "bogus"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages"),
    ({"pardec": {"method": "warp"}}, "pardec"),
    ({"pardec": {"method": "pld", "knobs": {"nope": 1}}}, "pardec"),
    ({"pardec": {"method": "pld", "knobs": {"num_draft": "eight"}}}, "pardec"),
    ({"pardec": {"knobs": {"num_draft": 8}}}, "pardec.knobs"),
    ({"pardec": {"profile": "poetry"}}, "pardec"),
    ({"pardec": {"speed": "max"}}, "pardec.speed"),
])
def test_bad_parameters_are_a_400_naming_the_parameter(served, fields, param):
    assert_error(raw_request(served, "POST", "/v1/chat/completions", chat_body(served, **fields)), 400, param=param)


def test_neutral_values_of_unsupported_parameters_are_accepted(served):
    body = chat_body(served, presence_penalty=0, frequency_penalty=0.0, logprobs=False, user="me", n=1,
                     response_format={"type": "text"})
    assert raw_request(served, "POST", "/v1/chat/completions", body).status == 200


def test_a_method_that_cannot_run_on_this_model_is_a_400_before_any_output(served):
    error = assert_error(raw_request(served, "POST", "/v1/chat/completions",
                                     chat_body(served, stream=True, pardec={"method": "medusa"})), 400)
    assert "Medusa heads" in error["message"]


def test_a_prompt_longer_than_the_context_is_a_400_context_length_exceeded(served):
    body = chat_body(served, messages=[{"role": "user", "content": "word " * 3000}])
    assert_error(raw_request(served, "POST", "/v1/chat/completions", body), 400, code="context_length_exceeded")


def test_a_body_over_the_limit_is_a_413(served):
    body = chat_body(served, messages=[{"role": "user", "content": "x" * 70_000}])
    assert_error(raw_request(served, "POST", "/v1/chat/completions", body), 413, code="request_too_large")


def test_unknown_routes_and_methods_get_openai_shaped_errors(served):
    assert_error(raw_request(served, "GET", "/v1/embeddings"), 404)
    assert_error(raw_request(served, "GET", "/v1/chat/completions"), 405)


def test_no_request_so_far_got_a_5xx(served):
    # One request of its own: under xdist this test may be the first to use this worker's server.
    assert raw_request(served, "GET", "/v1/models").status == 200
    samples = metric_samples(served)
    statuses = {dict(labels)["status"] for (name, labels) in samples if name == "pardec_http_responses_total"}
    assert statuses and not any(s.startswith("5") for s in statuses)


# -- API key --------------------------------------------------------------------------


def test_with_an_api_key_every_request_needs_it(tiny_cli_model):
    from openai import AuthenticationError, OpenAI

    with running_server(tiny_cli_model, api_key="s3cret") as served:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            assert_error(raw_request(served, "GET", "/v1/models", headers=headers), 401, code="invalid_api_key")
            assert raw_request(served, "GET", "/metrics", headers=headers).status == 401
        assert raw_request(served, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"}).status == 200
        assert OpenAI(base_url=served.v1, api_key="s3cret").models.list().data[0].id == served.model
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=served.v1, api_key="nope", max_retries=0).models.list()


# -- under load -----------------------------------------------------------------------


def stream_once(served: Served, prompt: str, max_tokens: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=served.v1, api_key="unused", max_retries=0)
    chunks = list(client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, temperature=0))
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    return {
        "prompt": prompt, "ids": {c.id for c in chunks}, "finished": len(finished),
        "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "pardec": finished[0].model_extra["pardec"] if finished else None,
        "usage": [c.usage for c in chunks if c.usage is not None],
    }


def test_sixteen_streaming_clients_get_every_reply_exactly_once_and_equal_to_gen(served, tiny_cli_model):
    clients, each, max_tokens = 16, 3, 16
    before = metric_samples(served)
    results: list[dict] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        for turn in range(each):
            try:
                result = stream_once(served, PROMPTS[(index + turn) % len(PROMPTS)], max_tokens)
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    failures.append(exc)
                continue
            with lock:
                results.append(result)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not failures, failures[:3]
    assert len(results) == clients * each
    assert all(r["finished"] == 1 and len(r["usage"]) == 1 and len(r["ids"]) == 1 for r in results)
    assert len({next(iter(r["ids"])) for r in results}) == clients * each, "every reply is its own"
    for result in results:
        expected = gen_record(tiny_cli_model, result["prompt"], "-n", str(max_tokens), "--temp", "0")
        assert result["pardec"]["method"] == expected["method"]
        assert result["pardec"]["knobs"] == expected["knobs"]
        assert result["text"] == expected["text"], result["prompt"]
    after = metric_samples(served)
    path = "/v1/chat/completions"
    answered = total(after, "pardec_http_responses_total", path=path) - total(before, "pardec_http_responses_total", path=path)
    ok = (total(after, "pardec_http_responses_total", path=path, status="200")
          - total(before, "pardec_http_responses_total", path=path, status="200"))
    assert answered == ok == clients * each
    assert total(after, "pardec_requests_total") - total(before, "pardec_requests_total") == clients * each
    assert after[("pardec_queue_length", ())] == 0 and after[("pardec_running", ())] == 0


def test_a_full_queue_is_answered_429_with_retry_after(tiny_cli_model):
    with running_server(tiny_cli_model, max_queue=1) as served:
        body = chat_body(served, max_tokens=600, messages=[{"role": "user", "content": "Tell me a long story."}])
        responses: list = []

        def post() -> None:
            responses.append(raw_request(served, "POST", "/v1/chat/completions", body))

        threads = [threading.Thread(target=post) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        statuses = sorted(r.status for r in responses)
        assert statuses.count(200) >= 2, statuses  # one decoding, one waiting
        assert statuses.count(429) >= 1 and set(statuses) <= {200, 429}, statuses
        busy = next(r for r in responses if r.status == 429)
        assert int(busy.headers["retry-after"]) >= 1
        assert busy.json()["error"]["type"] == "rate_limit_error"


def test_a_client_that_disconnects_cancels_its_generation(served):
    before = metric_samples(served)
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    body = chat_body(served, max_tokens=500, stream=True, messages=[{"role": "user", "content": "Count to a thousand."}])
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the reply has started
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 30
    while True:
        after = metric_samples(served)
        cancelled = (total(after, "pardec_requests_total", finish_reason="cancelled")
                     - total(before, "pardec_requests_total", finish_reason="cancelled"))
        if cancelled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert cancelled == 1
    generated = total(after, "pardec_generated_tokens_total") - total(before, "pardec_generated_tokens_total")
    assert generated < 500, "stopped at a step soon after the client left, not at max_tokens"


# -- metrics --------------------------------------------------------------------------


def test_metrics_have_tokens_per_step_and_acceptance_histograms_per_method_and_profile(served, client):
    client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": CODE_PROMPT}],
                                   max_tokens=12, extra_body={"pardec": {"method": "suffix"}})
    samples = metric_samples(served)
    buckets = {dict(labels)["le"]: value for (name, labels), value in samples.items()
               if name == "pardec_tokens_per_step_bucket" and ("method", "suffix") in labels
               and ("profile", "code") in labels}
    assert buckets["1.0"] <= buckets["+Inf"] and buckets["+Inf"] >= 11
    assert total(samples, "pardec_tokens_per_step_count", method="suffix") >= 11
    assert ("pardec_queue_length", ()) in samples
    assert total(samples, "pardec_generated_tokens_total", method="suffix", profile="code") >= 12
    assert total(samples, "pardec_time_to_first_token_seconds_count") >= 1


# -- gen --server ---------------------------------------------------------------------


def test_gen_with_server_prints_what_gen_prints_locally(served, tiny_cli_model):
    local = gen_record(tiny_cli_model, CODE_PROMPT, "-n", "16")
    remote = invoke(["gen", "--server", served.url, "--json", "-n", "16", CODE_PROMPT])
    assert remote.exit_code == 0, remote.stderr
    record = json.loads(remote.stdout)
    for key in ("text", "model", "method", "knobs", "profile", "dtype", "finish_reason"):
        assert record[key] == local[key], key
    assert record["stats"]["generated_tokens"] == local["stats"]["generated_tokens"]
    text = invoke(["gen", "--server", served.url, "-n", "16", "--stats", CODE_PROMPT])
    assert text.exit_code == 0, text.stderr
    assert text.stdout == local["text"] + ("" if local["text"].endswith("\n") else "\n")
    assert "tokens per step" in text.stderr and served.url in text.stderr


def test_gen_with_server_sends_the_method_and_its_knobs(served, tiny_cli_model):
    args = ("-n", "12", "--method", "pld", "-O", "num_draft=3", "--raw")
    remote = invoke(["gen", "--server", served.url, "--json", *args, "def add(a, b):"])
    assert remote.exit_code == 0, remote.stderr
    record = json.loads(remote.stdout)
    local = gen_record(tiny_cli_model, "def add(a, b):", *args)
    assert (record["text"], record["method"], record["knobs"]) == (local["text"], "pld", local["knobs"])


def test_gen_with_server_errors_are_one_clear_line(served):
    wrong_model = invoke(["gen", "--server", served.url, "-m", "nope", "Hi"])
    assert wrong_model.exit_code == 1
    assert wrong_model.stderr.startswith("pardec: error: the server answered 404") and "Traceback" not in wrong_model.stderr
    nobody = invoke(["gen", "--server", "http://127.0.0.1:9", "Hi"])
    assert nobody.exit_code == 1 and "cannot reach the server" in nobody.stderr
    batch = invoke(["gen", "--server", served.url, "--each-line"], input="a\nb\n")
    assert batch.exit_code == 2 and "--server" in batch.stderr


# -- the command ----------------------------------------------------------------------


HELP_IMPORTS = r"""
import json, sys
from pardec_cli.cli.main import run
codes = [run(["--help"]), run(["serve", "--help"])]
heavy = ("torch", "transformers", "starlette", "uvicorn", "prometheus_client", "openai")
print(json.dumps([codes, sorted(m for m in heavy if m in sys.modules)]))
"""


@pytest.mark.slow  # a subprocess
def test_help_imports_no_server_library_nor_torch():
    done = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[0, 0], []]
    assert "pardec serve" in done.stdout and "--api-key" in done.stdout


def test_a_port_in_use_is_one_clear_error(served):
    result = invoke(["serve", "--port", str(served.port)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"pardec: error: cannot listen on 127.0.0.1:{served.port}")
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # a server process and a signal
def test_sigterm_drains_a_running_reply_then_exits(tiny_cli_model, isolated_home):
    """The real command, in its own process, with its API key from the environment."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARDEC_SERVE_API_KEY": "k3y"}
    proc = subprocess.Popen([sys.executable, "-m", "pardec_cli", "serve", "-m", str(tiny_cli_model), "--port", "0",
                             "--dtype", "float32", "--compile", "off"], stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stderr.readline()
        assert " at http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        served = Served(f"http://127.0.0.1:{port}", port, "", None)
        key = {"Authorization": "Bearer k3y"}
        assert raw_request(served, "GET", "/v1/models").status == 401
        model = raw_request(served, "GET", "/v1/models", headers=key).json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 300, "stream": True,
                "messages": [{"role": "user", "content": "Tell me a story."}]}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", **key})
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        rest = response.read().decode()
        assert rest.rstrip().endswith("data: [DONE]"), "the running reply was finished, not cut"
        last = json.loads([e for e in rest.split("\n\n") if e.startswith("data: {")][-1][len("data: "):])
        assert last["choices"][0]["finish_reason"] in ("length", "stop")
        proc.wait(timeout=60)
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
        with pytest.raises(OSError):
            raw_request(served, "GET", "/health", headers=key)
    finally:
        proc.kill()
        proc.wait()


# -- the README -----------------------------------------------------------------------


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- serve-snippet:begin -->", 1)[1].split("<!-- serve-snippet:end -->", 1)[0]
    return block.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow  # a server process
@pytest.mark.real_model
def test_the_readme_client_snippet_works_as_written(embedded_pardec_home, monkeypatch):
    """The README's snippet, unchanged, against `pardec serve` (the embedded model on port 8000)."""
    monkeypatch.setenv("PARDEC_HOME", str(embedded_pardec_home))
    try:
        server = running_server(None, port=8000)
        served = server.__enter__()
    except OSError as exc:
        pytest.skip(f"port 8000, which the README's snippet uses, is taken here: {exc}")
    try:
        done = subprocess.run([sys.executable, "-c", readme_snippet()], capture_output=True, text=True, timeout=300)
    finally:
        server.__exit__(None, None, None)
    assert done.returncode == 0, done.stderr
    assert served.model == "smollm2-135m"
    reply, extension, streamed = done.stdout.partition("\n{'method': ")
    assert reply.strip(), "the first reply is printed"
    assert "'tokens_per_step'" in streamed.split("\n", 1)[0], "then usage.pardec"
    assert streamed.split("\n", 1)[1].strip(), "then the streamed reply"
