"""Tokens/s of `pardec chat` (the real app, in a tmux terminal) against `pardec gen`, same settings.

    python -m devtools.chat_overhead [--pairs 20] [--method pld] [-n 128] [--prompt TEXT]

Each pair runs `pardec gen --json` and one chat reply, in alternating order, each in a
fresh process. Both sides report the engine's own statistics: gen prints them, and the
chat saves them with the reply in its conversation file, which this tool reads and then
deletes. Needs tmux; takes about 35 s a pair on 2 cores. Prints every run, the per-pair
ratios chat/gen with their mean and a 95% interval, and the UI thread's CPU from Enter to
the saved reply (read from /proc, so Linux only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pardec_cli.tui.conversation import chats_dir

PROMPT = "Write a Python function that checks whether a number is prime, with a docstring and tests."
SESSION = "pardec-chat-overhead"
TIMEOUT_S = 300


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True).stdout


def thread_cpu_s(pid: int) -> float:
    """CPU seconds of a process's main thread (for the chat: the UI thread)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_gen(args: argparse.Namespace) -> dict:
    out = subprocess.run([sys.executable, "-m", "pardec_cli", "gen", "--json", "--dtype", args.dtype, "--method",
                          args.method, "-n", str(args.n), args.prompt], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["stats"]


def run_chat(args: argparse.Namespace) -> tuple[dict, float, float]:
    """One reply in a fresh chat: (its stats, UI thread CPU s, wall s from Enter to the saved reply)."""
    chats = chats_dir()
    before = set(chats.glob("*.json"))
    tmux("kill-session", "-t", SESSION)
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40",
         f"exec {sys.executable} -m pardec_cli chat --dtype {args.dtype} --method {args.method} -n {args.n}")
    deadline = time.monotonic() + TIMEOUT_S
    while f"({args.dtype}, cpu)" not in tmux("capture-pane", "-t", SESSION, "-p"):  # the model is loaded
        if time.monotonic() > deadline:
            sys.exit("the chat did not load its model in time: " + tmux("capture-pane", "-t", SESSION, "-p"))
        time.sleep(0.5)
    time.sleep(1.0)
    tmux("send-keys", "-t", SESSION, "-l", args.prompt)
    time.sleep(0.5)
    pid = int(tmux("list-panes", "-t", SESSION, "-F", "#{pane_pid}").strip())
    ui_start, wall_start = thread_cpu_s(pid), time.monotonic()
    tmux("send-keys", "-t", SESSION, "Enter")
    while time.monotonic() < deadline:
        for path in set(chats.glob("*.json")) - before:
            replies = [m for m in json.loads(path.read_text())["messages"] if m["role"] == "assistant"]
            if replies:
                ui, wall = thread_cpu_s(pid) - ui_start, time.monotonic() - wall_start
                tmux("kill-session", "-t", SESSION)
                path.unlink()
                return replies[-1]["stats"], ui, wall
        time.sleep(0.2)
    sys.exit("the chat did not reply in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--method", default="pld")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("chat_overhead drives the chat in tmux: install tmux first")
    ratios, ui_cpu, ui_wall = [], 0.0, 0.0
    for pair in range(args.pairs):
        rates = {}
        for side in ("gen", "chat") if pair % 2 == 0 else ("chat", "gen"):
            if side == "gen":
                stats, extra = run_gen(args), ""
            else:
                stats, ui, wall = run_chat(args)
                ui_cpu, ui_wall = ui_cpu + ui, ui_wall + wall
                extra = f"  UI thread {ui * 1000:.0f} ms CPU in {wall:.1f} s"
            rates[side] = stats["tokens_per_s"]
            print(f"pair {pair:2d} {side:4s} {stats['tokens_per_s']:6.2f} tok/s  {stats['generated_tokens']} tokens  "
                  f"{stats['mean_tokens_per_step']:.2f} tok/step  TTFT {stats['ttft_s'] * 1000:.0f} ms{extra}", flush=True)
        ratios.append(rates["chat"] / rates["gen"])
    print("chat/gen per pair:", " ".join(f"{r:.3f}" for r in ratios))
    if len(ratios) > 1:
        half_width = 2 * statistics.stdev(ratios) / len(ratios) ** 0.5
        print(f"mean {statistics.mean(ratios):.3f} ± {half_width:.3f} (95%), median {statistics.median(ratios):.3f}")
    print(f"UI thread CPU from Enter to the saved reply: {100 * ui_cpu / ui_wall:.1f}% of the time")


if __name__ == "__main__":
    main()
