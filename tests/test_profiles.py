"""Task profiles: the shipped files, user overrides and additions, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardec_cli.errors import PardecUsageError
from pardec_cli.hardware import CpuInfo, GpuInfo, describe
from pardec_cli.selection.profiles import (
    BUILTIN_PROFILES, builtin_profiles_dir, get_profile, load_profiles, profile_names, user_profiles_dir,
)
from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
THIS_CPU = describe("cpu", "float32", CpuInfo("cpu", 2, frozenset({"avx2"})))
H100 = describe("cuda:0", "bfloat16", THIS_CPU.cpu, [GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 << 30, (9, 0))])


def write_user_profile(name: str, text: str) -> Path:
    folder = user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the shipped profiles -------------------------------------------------------------


def test_builtin_profiles_are_the_repository_files_in_a_checkout() -> None:
    assert Path(str(builtin_profiles_dir())) == ROOT / "profiles"
    assert sorted(p.stem for p in (ROOT / "profiles").glob("*.toml")) == sorted(BUILTIN_PROFILES)


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_each_builtin_profile_has_sampling_defaults_and_candidates_for_cpus_and_gpus(name: str) -> None:
    profile = get_profile(name)
    assert profile.description
    assert profile.sampling.get("temperature") == 0.0  # greedy by default: exact, like plain decoding
    assert profile.sampling.get("max_tokens", 0) >= 128
    for hardware in (THIS_CPU, H100):
        methods = [c.method for c in profile.candidates_for(hardware)]
        assert len(methods) >= 4 and "pld" in methods


def test_candidates_fall_back_from_class_to_family_to_default() -> None:
    profile = get_profile("code")
    apple = describe("mps", "float16", THIS_CPU.cpu)
    assert profile.group_for(THIS_CPU) == "cpu"
    assert profile.group_for(H100) == "gpu"  # no gpu-datacenter list: the family's
    assert profile.group_for(apple) == "gpu"


# -- user files -----------------------------------------------------------------------


def test_a_user_file_named_like_a_builtin_one_is_laid_over_it() -> None:
    builtin = get_profile("chat")
    path = write_user_profile("chat", '[sampling]\ntemperature = 0.7\n\n[[candidates.cpu]]\nmethod = "pld"\ntokens_per_step = 1.5\n')
    chat = get_profile("chat")
    assert chat.sampling["temperature"] == 0.7
    assert chat.sampling["max_tokens"] == builtin.sampling["max_tokens"]  # keys not in the user file stay
    assert [c.method for c in chat.candidates_for(THIS_CPU)] == ["pld"]  # the cpu list is replaced...
    assert len(chat.candidates_for(H100)) > 1  # ...the others are kept
    assert chat.sources[-1] == str(path)


def test_a_user_file_with_a_new_name_adds_a_profile() -> None:
    write_user_profile("math", 'description = "maths"\n[[candidates.default]]\nmethod = "jacobi"\ntokens_per_step = 1.1\n')
    assert profile_names() == [*BUILTIN_PROFILES, "math"]
    math = load_profiles()["math"]
    assert math.description == "maths" and math.sampling == {}
    assert [c.method for c in math.candidates_for(H100)] == ["jacobi"]


def test_methods_this_pardec_does_not_have_are_accepted_for_later() -> None:
    write_user_profile("later", '[[candidates.cpu]]\nmethod = "some-future-method"\nknobs = { x = 1 }\ntokens_per_step = 2.0\n')
    assert get_profile("later").candidates["cpu"][0].method == "some-future-method"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('description = "x"\n[sampling]\ntemperature = "hot"\n', 3, "sampling.temperature: must be a number"),
        ('[sampling]\ntop_p = 2.0\n', 2, "sampling.top_p"),
        ('[sampling]\nmax_tokens = 1.5\n', 2, "must be an integer"),
        ('[sampling]\nseed = 3\n', 2, "sampling.seed: is not a sampling default"),
        ('colour = "red"\n', 1, "colour: is not a profile key"),
        ('[[candidates.tpu]]\nmethod = "pld"\ntokens_per_step = 2.0\n', 1, "candidates.tpu: is not a hardware class"),
        ('[[candidates.cpu]]\nmethod = "pld"\ntokens_per_step = 2.0\n\n[[candidates.cpu]]\nmethod = "suffix"\n',
         5, "candidates.cpu[1].tokens_per_step: is required"),
        ('[[candidates.cpu]]\nmethod = "pld"\ntokens_per_step = 0.5\n', 3, "must be a number >= 1"),
        ('[[candidates.cpu]]\nmethod = "pld"\nknobs = { num_draftt = 4 }\ntokens_per_step = 2.0\n', 3,
         "candidates.cpu[0].knobs: method 'pld' has no option 'num_draftt'"),
        ('[[candidates.cpu]]\nmethod = "pld"\nknobs = { num_draft = "many" }\ntokens_per_step = 2.0\n', 3, "expects int"),
        ('[[candidates.cpu]]\nmethod = "pld"\ntokens_per_step = 2.0\nspeed = 3\n', 4, "candidates.cpu[0].speed: is not a candidate key"),
        ('[sampling\ntemperature = 1\n', 1, "line 1"),
    ],
)  # fmt: skip
def test_a_bad_profile_is_one_error_naming_file_line_and_key(text: str, line: int, fragment: str) -> None:
    path = write_user_profile("code", text)
    with pytest.raises(PardecUsageError) as info:
        load_profiles()
    message = info.value.message
    assert message.startswith(f"{path}:{line}: ") or (fragment == "line 1" and str(path) in message)
    assert fragment in message


def test_a_bad_profile_file_name_is_an_error() -> None:
    write_user_profile("Bad Name", "")
    with pytest.raises(PardecUsageError, match="profile name"):
        load_profiles()


def test_unknown_profile_name() -> None:
    with pytest.raises(PardecUsageError, match="unknown profile 'poetry'; choose from: auto, code, chat, extraction"):
        get_profile("poetry")


# -- through the CLI (errors come before any model is loaded) ---------------------------


def test_gen_with_an_unknown_profile_is_a_usage_error() -> None:
    result = invoke(["gen", "-P", "poetry", "hi"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[0] == (
        "pardec: error: unknown profile 'poetry'; choose from: auto, code, chat, extraction"
    )


def test_gen_with_a_broken_user_profile_names_it() -> None:
    path = write_user_profile("chat", "[sampling]\ntop_k = -1\n")
    result = invoke(["gen", "hi"])
    assert result.exit_code == 2
    assert f"pardec: error: {path}:2: sampling.top_k: must be an integer >= 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_auto_with_knobs_is_a_usage_error() -> None:
    result = invoke(["gen", "--method", "auto", "-O", "k=4", "hi"])
    assert result.exit_code == 2
    assert "with --method auto the knobs are chosen too" in result.stderr


@pytest.mark.slow  # builds a wheel in a subprocess
def test_a_wheel_ships_the_profiles_and_the_tuning_prompts(tmp_path: Path) -> None:
    """A non-editable install finds them: built from a copy of the sources, as pip would."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("pardec_cli", "profiles"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", str(source), "-w", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )
    if done.returncode != 0 and "No module named pip" in done.stderr:
        pytest.skip("pip is not available")
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "out").glob("pardec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for profile in BUILTIN_PROFILES:
        assert f"pardec_cli/profile_data/{profile}.toml" in names
        assert f"pardec_cli/data/tune_prompts/{profile}.jsonl" in names
    assert "pardec_cli/data/catalog.toml" in names
    assert "pardec_cli/data/train_prompts.jsonl" in names
    # Every module of the source tree is in the wheel (the package list is written out).
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pardec_cli").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= names, sorted(modules - names)
