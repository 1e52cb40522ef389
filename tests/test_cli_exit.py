"""How the `pardec` process ends: after a command that loaded torch, without Python's
finalization (0.5-1.2 s of tearing down torch's and transformers' modules), but with
everything written and every atexit handler run; the usual exit wherever something else
still runs.

Each case runs the console entry point (`cli.main.main`) in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = """
import atexit, sys
import torch  # what a decoding command loads
atexit.register(print, "atexit ran", file=sys.stderr)

class TornDown:
    def __del__(self):
        print("module teardown ran", file=sys.stderr)

marker = TornDown()  # a module global: finalized only by Python's own teardown
"""


def run_main(body: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "entry.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + f"\nfrom pardec_cli.cli.main import main\nmain({args!r})\n")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={"PARDEC_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def test_a_command_that_loaded_torch_leaves_without_tearing_modules_down_and_loses_nothing(tmp_path) -> None:
    done = run_main("", ["methods"], tmp_path)
    assert done.returncode == 0
    assert "pld" in done.stdout and "recycling" in done.stdout  # the whole listing, flushed through a pipe
    assert "atexit ran" in done.stderr
    assert "module teardown ran" not in done.stderr


def test_the_exit_code_survives_the_quick_exit(tmp_path) -> None:
    done = run_main("", ["methods", "--no-such-flag"], tmp_path)
    assert done.returncode == 2 and "no-such-flag" in done.stderr
    assert "atexit ran" in done.stderr


def test_a_thread_still_running_gets_the_usual_exit_which_waits_for_it(tmp_path) -> None:
    out = tmp_path / "written-by-thread"
    body = f"""
    import threading, time
    threading.Thread(target=lambda: (time.sleep(0.5), open({str(out)!r}, "w").write("done"))).start()
    """
    done = run_main(body, ["methods"], tmp_path)
    assert done.returncode == 0 and out.read_text() == "done"
    assert "module teardown ran" in done.stderr


def test_without_torch_the_exit_is_python_s_own(tmp_path) -> None:
    script = tmp_path / "entry.py"
    script.write_text(PRELUDE.replace("import torch  # what a decoding command loads\n", "")
                      + "\nfrom pardec_cli.cli.main import main\nmain(['--version'])\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "module teardown ran" in done.stderr
