"""Kernels pardec builds itself: products of 4-bit, 8-bit and bfloat16 weights for CPUs with
AVX512, and of float32 and 8-bit weights by float32 activations for CPUs with AVX2.

torch's CPU int4 kernel dequantizes every weight to float and tiles rows by 4, and its
int8 one streams the weights at 25-30 GB/s for a few rows, short of the memory's rate on a
few cores (docs/weights.md, "pardec's own int4 kernels"). ``data/int4_kernels.cpp`` holds
four products, two over one int4 layout (`quant.Int4Records`) and two over one layout of
int8 or bfloat16 weights (`quant.Int8Records`, `quant.BF16Records`), and an attention:

- ``pardec_q4::q4bf16_mm``: bfloat16 activations, AVX512-BF16 dot products; torch's
  kernel's arithmetic, what int4 layers use in bfloat16;
- ``pardec_q4::q4q8_mm``: int8 activations in groups of 32 (llama.cpp's Q8_1),
  AVX512-VNNI; ``--weights q4q8`` only there, being further from the full model;
- ``pardec_q4::q8bf16_mm``: int8 weights by bfloat16 activations (AVX512-BF16), what
  ``--weights int8`` layers use in bfloat16;
- ``pardec_q4::bf16_mm``: bfloat16 weights and activations, what dense layers use in
  bfloat16 on a CPU with AVX512-BF16 and no AMX (oneDNN's packing read them slower);
- ``pardec_q4::attention``: a few query rows' attention over a bfloat16 cache, each row
  alone, what the runner's steps use wherever the layers run on these kernels
  (``engine.attention``, "pardec_kernel").

``data/avx2_kernels.cpp`` (the `AVX2` library) holds ``pardec_avx2::f32_mm`` and
``pardec_avx2::q8f32_mm``: float32 and int8 weights by float32 activations, each row
computed alone, what float32 layers use on a CPU whose torch runs AVX2 kernels (no
AVX512), where MKL's float32 products of a few rows read the weights at a third of the
memory's rate (docs/runner.md, "float32 on AVX2"); and ``pardec_avx2::q4q8_mm``, the
records of ``q4q8_mm`` above by int8 activation groups with AVX2's byte products, what
``--weights q4q8`` (and auto, for GGUF 4-bit models in float32) uses there;
``pardec_avx2::q8q8_mm``, the int8 head's codes by int8 activation groups (the head of
such models: ``quant.Int8F32Head``); ``pardec_avx2::q8q8_blocks_mm``, Q8_0 weights (a
scale per group of 32) by the same groups (``--weights q8q8``, and auto's for dense and
Q8_0 models in float32: ``quant.Q8Records``); and ``pardec_avx2::attention``, each query row's
attention over a float32 or float16 cache alone, what float32 models on this library
attend with (``engine.attention``).
It also holds ``pardec_avx2::llama_step``, a Llama decoder's whole step on those ops in one
call (``engine.native``): what the runner runs instead of its compiled graphs where a model
is exactly that (q4q8 or q8q8 layers in float32); and ``pardec_avx2::llama_head``, that
step's head for rows it returned without (what verification reads: ``engine.verify.HeadRows``).

Each library is compiled once per machine with torch's C++ extension builder into pardec's
store. The first load that could use one starts a detached build at the lowest CPU
priority (``python -m pardec_cli.kernels BUILD_DIR``) and goes on with torch's kernels, so
no run waits; later loads take the library in milliseconds. ``--weights q4q8`` builds at
once. A failed build leaves a ``failed`` file with its reason (`status`; `pardec doctor`)
and is not retried in the background. ``PARDEC_KERNELS=0`` keeps pardec to torch's
kernels. This module imports torch only inside its functions.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class Library:
    """One of pardec's kernel libraries: its source, compiler flags and ops' namespace."""

    name: str  # the shared library's file name, without .so
    source: str  # under pardec_cli/
    prefix: str  # of its build directories
    namespace: str  # torch.ops.<namespace>
    probe: str  # an op whose presence says the library is loaded
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...] = ("-fopenmp",)


#: Instructions (lscpu's names) every op needs, and each op's own.
BASE_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c", "fma")
OP_FLAGS = {"bfloat16": "avx512_bf16", "int8": "avx512_vnni"}
#: The whole library's compiler flags; each op's own instructions are target attributes
#: of its functions, so the library loads on any AVX512 CPU. Without -fopenmp,
#: `at::parallel_for` (a header template) compiles to a serial loop: the ops ran on one
#: core (docs/weights.md, "one core").
CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mf16c", "-mfma", "-fopenmp")
LDFLAGS = ("-fopenmp",)
AVX512 = Library("pardec_int4", "data/int4_kernels.cpp", "int4", "pardec_q4", "q4bf16_mm", CFLAGS, LDFLAGS)
#: float32 activations on AVX2 (every op of it needs these).
AVX2_FLAGS = ("avx2", "fma", "f16c")
AVX2 = Library("pardec_avx2", "data/avx2_kernels.cpp", "avx2", "pardec_avx2", "f32_mm", ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"))
#: The same library for a CPU with AVX512-VNNI: its byte products on VPDPBUSD, its 4-bit
#: blocks' products on 512-bit registers, 8 rows a pass (same bits).
AVX2_VNNI_FLAGS = ("avx512_vnni", "avx512vl", "avx512bw")
AVX2_VNNI = Library("pardec_avx2", "data/avx2_kernels.cpp", "avx2vnni", "pardec_avx2", "f32_mm",
                    (*AVX2.cflags, "-mavx512vnni", "-mavx512vl", "-mavx512bw"))  # fmt: skip
LIBRARY = AVX512.name
FAILED = "failed"


def enabled() -> bool:
    """False when ``PARDEC_KERNELS`` is 0/false/no/off: torch's kernels only."""
    return os.environ.get("PARDEC_KERNELS", "").strip().lower() not in ("0", "false", "no", "off")


def source(library: Library = AVX512) -> bytes:
    """The C++ source of the library's ops."""
    return resources.files("pardec_cli").joinpath(library.source).read_bytes()


@functools.cache
def source_digest(library: Library = AVX512) -> str:
    """What identifies the library's code (saved compiled steps that call it name it)."""
    return hashlib.sha256(source(library)).hexdigest()[:12]


def cpu_supported(flags: frozenset[str] | set[str], activations: str) -> bool:
    """Whether a CPU with these flags (``/proc/cpuinfo``'s) runs the op for `activations`
    ("bfloat16" or "int8"), and torch's kernels are not capped below AVX512 there
    (``ATEN_CPU_CAPABILITY``). Imports nothing: `pardec doctor` asks without torch."""
    if not all(flag in flags for flag in (*BASE_FLAGS, OP_FLAGS[activations])):
        return False
    capped = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return not capped or capped.startswith("avx512")


def avx2_runs(flags: frozenset[str] | set[str]) -> bool:
    """Whether a CPU with these flags runs the `AVX2` library (AVX2, FMA and F16C), and so
    whether float32 layers go to it: its products beat torch's on AVX512 CPUs too (q4q8 in
    the native step; dense 1.6-2.0x and int8 4-24x at 1-32 rows on a Zen 5, docs/weights.md)."""
    return all(flag in flags for flag in AVX2_FLAGS)


def avx2_library(flags: frozenset[str] | set[str]) -> Library:
    """The build of the `AVX2` library for a CPU with these flags: `AVX2_VNNI` where it has
    AVX512-VNNI, VL and BW (its q4q8 and head products in fewer instructions), else `AVX2`."""
    return AVX2_VNNI if all(flag in flags for flag in AVX2_VNNI_FLAGS) else AVX2


def torch_version() -> str:
    """The installed torch's version, read from its metadata (torch is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def build_dir(root: Path, library: Library = AVX512) -> Path:
    """Where the library for this source, torch and Python is built under `root`."""
    facts = f"{torch_version()}|{sys.version_info[:2]}|{library.cflags}|{library.ldflags}"
    digest = hashlib.sha256(source(library) + facts.encode()).hexdigest()[:12]
    return root / f"{library.prefix}-{digest}"


def library_of(directory: Path) -> Library:
    """The library a build directory (`build_dir`) holds."""
    for library in (AVX2, AVX2_VNNI):
        if directory.name.startswith(f"{library.prefix}-"):
            return library
    return AVX512


def loaded(library: Library = AVX512) -> bool:
    """Whether the library's ops are registered in this process."""
    import torch

    return hasattr(getattr(torch.ops, library.namespace), library.probe)


def load(directory: Path) -> bool:
    """Load the library built in `directory` (`build_dir`) into this process; False where
    it is not built there (yet) or does not load (then it is removed, to be built again).
    (A library another store built and this process loaded counts only for that store:
    what a load uses follows its own store.)"""
    lib = library_of(directory)
    library = directory / f"{lib.name}.so"
    if not library.is_file():
        return False
    if loaded(lib):
        return True
    import torch

    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError):
        # A library that does not load (truncated, built for another system) is a cache
        # entry gone bad: removed, so that the next build replaces it.
        library.unlink(missing_ok=True)
        return False
    _register_fakes(lib)
    return loaded(lib)


def status(directory: Path) -> str:
    """"built", "building", "failed: REASON" or "not built", for `pardec doctor`."""
    if (directory / f"{library_of(directory).name}.so").is_file():
        return "built"
    failed = directory / FAILED
    if failed.is_file():
        return "failed: " + (failed.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["?"])[-1]
    if _build_running(directory):
        return "building"
    return "not built"


def build(directory: Path) -> None:
    """Compile the library into `directory` and load it (blocking; one builder at a time:
    a process that waited for another's build loads that one; a build that failed before
    is tried again). A failure writes its reason to ``directory/failed`` and raises."""
    from filelock import FileLock

    import torch.utils.cpp_extension as cpp

    lib = library_of(directory)
    if loaded(lib):
        return
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory / ".build.lock")):
        if load(directory):  # built meanwhile by another process
            return
        (directory / FAILED).unlink(missing_ok=True)
        src = directory / Path(lib.source).name
        src.write_bytes(source(lib))
        try:
            cpp.load(name=lib.name, sources=[str(src)], build_directory=str(directory), extra_cflags=list(lib.cflags),
                     extra_ldflags=list(lib.ldflags), is_python_module=False, verbose=False)  # fmt: skip
        except Exception as exc:
            (directory / FAILED).write_text(f"{type(exc).__name__}: {exc}".strip() + "\n", encoding="utf-8")
            raise
    _register_fakes(lib)


def build_in_background(directory: Path) -> bool:
    """Start a detached build of the library unless it is built, failed or being built,
    or `enabled` says no; True when one was started. It outlives this process, so a
    short run still leaves the library for the next one."""
    if not enabled() or (directory / f"{library_of(directory).name}.so").is_file() or (directory / FAILED).is_file():
        return False
    if _build_running(directory):
        return False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "build.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "pardec_cli.kernels", str(directory)], stdin=subprocess.DEVNULL,
                             stdout=log, stderr=log, start_new_session=True, env={**os.environ, "MAX_JOBS": "1"})  # fmt: skip
    except OSError:  # a read-only or full store: this run and later ones keep torch's kernel
        return False
    return True


def ready(directory: Path) -> bool:
    """Load the library built in `directory`; where it is not built, start its detached
    build (`build_in_background`) for later runs and say False: this run keeps torch's kernels."""
    if load(directory):
        return True
    build_in_background(directory)
    return False


def wait_for_build(directory: Path, timeout_s: float, *, poll_s: float = 0.2) -> bool:
    """Wait up to `timeout_s` seconds for the library in `directory` to be built by another
    process (a detached build); True when it is built by then, False at once when the
    build failed. A build that is still running goes on (`build_in_background`'s)."""
    deadline = time.monotonic() + timeout_s
    library = directory / f"{library_of(directory).name}.so"
    while True:
        # The linker writes the file before the build lets go of its lock: both are needed.
        if library.is_file() and not _build_running(directory):
            return True
        if (directory / FAILED).is_file() or time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def _build_running(directory: Path) -> bool:
    from filelock import FileLock, Timeout

    lock = directory / ".build.lock"
    if not lock.exists():
        return False
    try:
        with FileLock(str(lock), timeout=0):
            return False
    except Timeout:
        return True


def _register_fakes(library: Library = AVX512) -> None:
    """The library's ops' shape functions, for torch.compile's tracing: [M, n], bfloat16
    for bfloat16 x, else float32. Called once per process, where the library enters it
    (`load`, `build`)."""
    import torch

    if library.namespace == AVX2.namespace:  # x [M, K] by w [N, K] -> [M, N] float32
        torch.library.register_fake("pardec_avx2::f32_mm", lambda x, w: x.new_empty((x.shape[0], w.shape[0])))
        torch.library.register_fake("pardec_avx2::q8f32_mm", lambda x, q, scales: x.new_empty((x.shape[0], q.shape[0])))
        # x [M, K] by packed codes (`quant.pack_head`) and scales [N] -> [M, N]
        torch.library.register_fake("pardec_avx2::q8q8_mm", lambda x, q, scales: x.new_empty((x.shape[0], scales.shape[0])))
        # x [M, K] by int8 codes [N/16, K/32, 512] and scales [N/16, K/32, 16] -> [M, N] float32
        torch.library.register_fake("pardec_avx2::q8q8_blocks_mm", lambda x, q, scales: x.new_empty((x.shape[0], 16 * q.shape[0]), dtype=torch.float32))
        # x [M, K] by records w [N/16, K/32, 320] -> [M, n] float32
        torch.library.register_fake("pardec_avx2::q4q8_mm", lambda x, w, n: x.new_empty((x.shape[0], n), dtype=torch.float32))
        # query [B, H, R, D] -> output [B, R, H, D]
        torch.library.register_fake("pardec_avx2::attention", lambda q, k, v, mask, scaling: q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3])))
        return

    def out(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
        return x.new_empty((x.shape[0], n), dtype=x.dtype if x.dtype == torch.bfloat16 else torch.float32)

    torch.library.register_fake("pardec_q4::q4q8_mm", out)
    torch.library.register_fake("pardec_q4::q4bf16_mm", out)
    torch.library.register_fake("pardec_q4::q8bf16_mm", lambda x, w, scales, n: x.new_empty((x.shape[0], n)))
    torch.library.register_fake("pardec_q4::bf16_mm", lambda x, w, n: x.new_empty((x.shape[0], n)))
    # query [B, H, R, D] -> output [B, R, H, D]
    torch.library.register_fake("pardec_q4::attention", lambda q, k, v, mask, scaling: q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3])))


def background_main(argv: list[str]) -> None:
    """The detached builder (``python -m pardec_cli.kernels BUILD_DIR``): `build` at the
    lowest CPU priority, so the run that started it keeps its cores (docs/weights.md, "Building")."""
    if hasattr(os, "nice"):  # not on Windows
        os.nice(19)  # the compiler processes inherit it
    # Linux schedules each session as a group of its own, whose weight is the group's nice
    # value: without this the line above does nothing. Only as the session's leader
    # (`start_new_session`): run from a shell, it would slow the whole terminal.
    if hasattr(os, "getsid") and os.getsid(0) == os.getpid():
        try:
            Path("/proc/self/autogroup").write_text("19", encoding="ascii")
        except OSError:  # no autogroups (not Linux, or turned off)
            pass
    build(Path(argv[0]))


if __name__ == "__main__":
    background_main(sys.argv[1:])
