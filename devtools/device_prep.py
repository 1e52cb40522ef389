"""Prepare what a lent GPU machine needs for pardec's CUDA checks and the embedded model's
bench, as two calls of the device tool (docs/testing.md, "On a GPU").

The device machine has torch but not transformers' version pardec is tested with, nor gguf,
starlette or uvicorn (carried as wheels), nor the shared bench data or the embedded model.
A call carries at most 64 MiB and the model's store folder is 96.6 MB, so it travels in two
parts; a path one call carries is gone at the next, so the first call moves what it brought
under /tmp (kept while the machine stays warm, 30 s between calls), and the second call,
carrying the other part, joins them and runs the benches.

    python -m devtools.device_prep [--model-dir DIR] [--bench-dir ../shared/bench]

writes `.devcarry/` and `.whl/` (both git-ignored through .git/info/exclude; transient copies
for the device, never committed) and prints the two calls to make, back to back.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".devcarry"
WHEELS = ROOT / ".whl"
#: What a call may carry, with the working tree, in bytes (64 MiB), less a margin.
CALL_BYTES = 64 * 2**20 - 2 * 2**20
#: Pure-Python packages the device's image lacks or has in another version.
PACKAGES = ("gguf", "starlette", "uvicorn")
BENCH_FILES = ("spec_bench_dev.jsonl", "code_edit_dev.jsonl")

CALL1 = """set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/m && cp -r .devcarry/smol .devcarry/bench .devcarry/part1/* /tmp/m/ || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv
timeout ${T1:-420} python3 -m devtools.cuda_check --parts ${PARTS:-env,exact,cli} --budget ${B1:-330} \\
  --tokenizer-from /tmp/m/smol --json $OUT/check.json > $OUT/check.txt 2>&1
echo "rc=$?"
grep -v -E "^(Traceback|  File|    |Writing model)" $OUT/check.txt | cut -c1-400 | tail -c 11000
"""

CALL2 = """set -o pipefail
test -d /tmp/site/transformers && test -d /tmp/m/smol || { echo "the first call's files are gone (the machine was not kept warm)"; exit 5; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
H=/tmp/pardec-home; D=$H/models/smollm2-135m; mkdir -p $D
cat /tmp/m/q.0 .devcarry/part2/q.1 > $D/pardec-quant.safetensors && cp /tmp/m/smol/* $D/ || exit 4
sha256sum $D/pardec-quant.safetensors | cut -c1-16
export PARDEC_HOME=$H HF_HUB_OFFLINE=1
timeout ${T2:-330} python3 -m pardec_cli bench --device cuda --prompts /tmp/m/bench/spec_bench_dev.jsonl --limit-per-category 1 \\
  -n 128 --rounds 1 --methods auto,vanilla,suffix --baseline hf --json $OUT/bench_spec.json > $OUT/bench_spec.txt 2>&1
echo "rc=$?"; tail -c 5000 $OUT/bench_spec.txt
timeout ${T3:-100} python3 -m pardec_cli bench --device cuda --prompts /tmp/m/bench/code_edit_dev.jsonl --limit-per-category 6 \\
  -n 128 --rounds 1 --methods auto,vanilla,suffix --json $OUT/bench_code.json > $OUT/bench_code.txt 2>&1
echo "rc=$?"; tail -c 2500 $OUT/bench_code.txt
"""


def tree_bytes() -> int:
    """Bytes of the working tree that every call sends (tracked files)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def ignore(*names: str) -> None:
    exclude = ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    present = exclude.read_text().splitlines() if exclude.exists() else []
    with exclude.open("a") as out:
        for name in names:
            if f"/{name}/" not in present:
                out.write(f"/{name}/\n")


def wheels() -> None:
    import transformers

    WHEELS.mkdir(exist_ok=True)
    versions = [f"transformers=={transformers.__version__}"]
    for name in PACKAGES:
        from importlib.metadata import version

        versions.append(f"{name}=={version(name)}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64", "-d", str(WHEELS), *versions],
                   check=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".local/share/pardec/models/smollm2-135m")
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    args = parser.parse_args()
    weights = args.model_dir / "pardec-quant.safetensors"
    if not weights.exists():
        sys.exit(f"{weights} is not there: run `pardec gen hi` once (the embedded model's conversion)")
    ignore(".devcarry", ".whl")
    shutil.rmtree(CARRY, ignore_errors=True)
    (CARRY / "smol").mkdir(parents=True)
    (CARRY / "bench").mkdir()
    for file in args.model_dir.iterdir():
        if file.is_file() and file != weights:
            shutil.copy(file, CARRY / "smol" / file.name)
    for name in BENCH_FILES:
        shutil.copy(args.bench_dir / name, CARRY / "bench" / name)
    wheels()
    (CARRY / "call1.sh").write_text(CALL1)
    (CARRY / "call2.sh").write_text(CALL2)
    others = sum(f.stat().st_size for d in (WHEELS, CARRY) for f in d.rglob("*") if f.is_file())
    room = CALL_BYTES - tree_bytes() - others
    data = weights.read_bytes()
    if room <= 0 or len(data) - room > CALL_BYTES - tree_bytes():
        sys.exit("the model does not fit in two calls beside the wheels")
    (CARRY / "part1").mkdir()
    (CARRY / "part2").mkdir()
    (CARRY / "part1" / "q.0").write_bytes(data[:room])
    (CARRY / "part2" / "q.1").write_bytes(data[room:])
    print("first call:  run command='bash .devcarry/call1.sh' carry=['.whl', '.devcarry/smol', '.devcarry/bench', "
          "'.devcarry/part1', '.devcarry/call1.sh'] timeout_s=480")
    print("second call, at once: run command='bash .devcarry/call2.sh' carry=['.devcarry/part2', '.devcarry/call2.sh'] "
          "timeout_s=480")


if __name__ == "__main__":
    main()
