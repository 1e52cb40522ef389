"""Long jobs are never silent on a terminal, and never noisy in a pipe.

The live display (rich) is drawn only when stderr is a terminal and no --quiet/--json
asked for clean output; these tests drive it directly where they need it on, and run
the commands through Click's CliRunner (not a terminal) to check that pipes stay clean.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from pardec_cli.progress import ProgressDisplay, progress_wanted
from pardec_cli.store import pull as pull_module
from tests.cli_helpers import invoke
from tests.fake_hub import FakeHub, fake_hub, tiny_repos  # noqa: F401 (fixtures)

ANSI = re.compile(r"\x1b\[")


def test_no_display_off_a_terminal_or_when_asked_for_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert progress_wanted() is False
    with ProgressDisplay(False) as display:
        task = display.task("nothing", 3)
        task.advance()
        task.update(description="still nothing")
        display.stages()("a stage", 1, 2)
    assert display._progress is None

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    assert progress_wanted() is True and progress_wanted(quiet=True) is False


def test_stages_become_one_line_each_the_previous_one_ended() -> None:
    with ProgressDisplay(True) as display:
        report = display.stages()
        report("reading model.gguf", 0, None)
        report("converting tensors", 0, 3)
        for done in (1, 2, 3):
            report("converting tensors", done, 3)
        tasks = display._progress.tasks
        assert [(t.description, t.completed, t.total) for t in tasks] == [("converting tensors", 3, 3)]


def test_pull_draws_one_overall_bar_across_every_file(fake_hub: FakeHub, tiny_repos) -> None:  # noqa: F811
    with ProgressDisplay(True, transfer=True) as display:
        overall = display.task("all files", 0)
        fetched = pull_module.fetch_repo("test-org/tiny-target", progress=True, display=display, overall=overall)
        (task,) = display._progress.tasks  # the file bars are gone once their file is in
        expected = sum(len(data) for name, data in tiny_repos["test-org/tiny-target"].items()
                       if name in fetched.downloaded and name != "config.json")
        assert task.total == expected and task.completed == expected


def test_a_piped_pull_prints_lines_and_no_bars(fake_hub: FakeHub) -> None:  # noqa: F811
    result = invoke(["pull", "tiny"])
    assert result.exit_code == 0, result.stderr
    assert not ANSI.search(result.stderr) and "\r" not in result.stderr
    assert "pardec: pulling tiny" in result.stderr


def test_a_piped_import_prints_its_line_and_no_display(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pardec_cli.store import gguf_import
    from tests.test_store_cli import fake_convert, write_gguf_header

    seen: list[object] = []

    def convert(gguf_path: Path, out_dir: Path, **kwargs: object) -> None:
        seen.append(kwargs.get("report"))
        fake_convert(gguf_path, out_dir)

    monkeypatch.setattr(gguf_import, "_convert", convert)
    gguf = write_gguf_header(tmp_path / "m.gguf", "llama")
    result = invoke(["import", str(gguf)])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.startswith("pardec: converting m.gguf") and not ANSI.search(result.stderr)
    assert callable(seen[0])  # the conversion reports its stages; nothing draws them here
    quiet = invoke(["import", str(gguf), "--name", "m2", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_the_conversion_reports_reading_each_tensor_and_writing(tmp_path: Path) -> None:
    from pardec_cli.store.gguf_import import import_gguf
    from tests.test_quant import write_tiny_gguf

    gguf = tmp_path / "tiny.Q4_1.gguf"
    tensors = len(write_tiny_gguf(gguf, layers=3))  # the embedded model's conversion, with 3 layers
    reports: list[tuple[str, int, int | None]] = []
    import_gguf(gguf, "converted", report=lambda stage, done, total: reports.append((stage, done, total)))
    stages = list(dict.fromkeys(stage for stage, _, _ in reports))
    assert stages[0].startswith("reading ") and stages[-1] == "writing the model"
    counted = [(done, total) for stage, done, total in reports if stage == "converting tensors"]
    assert counted == [(done, tensors) for done in range(tensors)]


def test_a_piped_bench_shows_no_display_and_its_json_stays_clean(tiny_cli_model: Path) -> None:
    result = invoke(["bench", "-m", str(tiny_cli_model), "--methods", "vanilla,pld", "-n", "4",
                     "--limit-per-category", "1", "--compile", "off", "--dtype", "float32", "--json", "-"])
    assert result.exit_code == 0, result.stderr
    assert not ANSI.search(result.stderr) and "\r" not in result.stderr
    document = json.loads(result.stdout)
    assert document["config"]["prompts"] == "built-in"
    assert set(document["summary"]) == {"code", "chat", "extraction", "overall"}
    assert "vs_vanilla" in document["summary"]["overall"]["pld"]["spread"]


def test_bench_plot_prints_the_picture_after_the_tables(tiny_cli_model: Path) -> None:
    result = invoke(["bench", "-m", str(tiny_cli_model), "--methods", "vanilla", "-n", "4",
                     "--limit-per-category", "1", "--compile", "off", "--plot", "-q"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.index("== overall") < result.stdout.index("tokens/s per prompt")
    assert "code vanilla" in result.stdout and not ANSI.search(result.stdout)
    assert "[1/3]" not in result.stderr  # --quiet: no progress lines either
