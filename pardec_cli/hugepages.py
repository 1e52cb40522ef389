"""A loaded model's weights moved onto 2 MB pages (Linux's transparent huge pages).

A decoding step on a CPU reads every weight once. On 4 KB pages that is a TLB miss every
4 KB and a restart of the hardware prefetchers, which stop at each page's end. Linux backs
anonymous memory with 2 MB pages where a program asks for them (``madvise(MADV_HUGEPAGE)``,
when ``/sys/kernel/mm/transparent_hugepage/enabled`` says ``madvise`` or ``always``), but
only for 2 MB-aligned ranges: a model's hundreds of separate tensors, most under 2 MB, get
none. `move_to_huge_pages` copies them into a few large aligned buffers so advised and
points every tensor at its copy (measured in docs/runner.md, "Weights on 2 MB pages").
``PARDEC_HUGE_PAGES=0`` keeps 4 KB pages. Imports torch only inside its functions.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path
from typing import Any, Iterable

HUGE_PAGE = 2 << 20
#: Weights move into buffers of at most this size, one buffer at a time: a load holds at
#: most one buffer of copies beside the weights themselves.
CHUNK_BYTES = 64 << 20
_MADV_HUGEPAGE = 14  # <linux/mman.h>
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def offered(setting: str | None) -> bool:
    """Whether weights go on huge pages under the kernel's `setting` (`thp_setting`): on
    Linux with "madvise" or "always", unless ``PARDEC_HUGE_PAGES`` is 0/false/no/off."""
    wanted = os.environ.get("PARDEC_HUGE_PAGES", "").strip().lower() not in ("0", "false", "no", "off")
    return wanted and setting in ("madvise", "always") and sys.platform.startswith("linux")


def thp_setting(path: Path = THP_SETTING) -> str | None:
    """The kernel's transparent-huge-page mode ("always", "madvise" or "never"; the bracketed
    word of `path`), or None where there is no such setting (not Linux)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _madvise() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _movable(t: Any) -> bool:
    import torch

    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.layout == torch.strided
            and not t.is_mkldnn and not t.is_quantized and t.untyped_storage().nbytes() > 0)  # fmt: skip


def _tensors(module: Any, skip: Iterable[Any] = ()) -> list[Any]:
    """Every CPU tensor `module`'s submodules hold: parameters, buffers and tensor attributes
    (e.g. a product's records shared by several layers), each once, in module order, but
    those in `skip` and any tensor sharing memory with one of them."""
    skipped = {t.untyped_storage().data_ptr() for t in skip if _movable(t)}
    seen: dict[int, Any] = {}
    for m in module.modules():
        for t in [*m._parameters.values(), *m._buffers.values(), *vars(m).values()]:
            if t is not None and id(t) not in seen and _movable(t) and t.untyped_storage().data_ptr() not in skipped:
                seen[id(t)] = t
    return list(seen.values())


def move_to_huge_pages(module: Any, *, skip: Iterable[Any] = (), chunk_bytes: int = CHUNK_BYTES,
                       setting: str | None = None) -> int:  # fmt: skip
    """Copy the CPU tensors of `module` (`_tensors`, but `skip`: tensors a step does not
    stream, such as an embedding table it only looks rows up in) into 2 MB-aligned buffers
    advised for huge pages (`offered`), storage by storage, and point each tensor at its
    copy (``tensor.data``: the same Python objects, the same values; tensors that shared
    memory still do). Returns the bytes moved: 0 where the kernel offers no huge pages or
    ``madvise`` fails; a buffer that cannot be allocated leaves the rest where it is.
    Tensors the module reaches only through lists or other containers keep their old
    memory (still correct, not moved)."""
    import torch

    if not offered(thp_setting() if setting is None else setting):
        return 0
    try:
        madvise = _madvise()
    except (OSError, AttributeError):
        return 0
    # storages in the order first met: [(storage, its tensors)]
    storages: dict[int, tuple[Any, list[Any]]] = {}
    for t in _tensors(module, skip):
        st = t.untyped_storage()
        storages.setdefault(st.data_ptr(), (st, []))[1].append(t)
    chunks: list[list[tuple[Any, list[Any]]]] = [[]]
    size = 0
    for entry in storages.values():
        nbytes = _aligned(entry[0].nbytes())
        if chunks[-1] and size + nbytes > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += nbytes
    moved = 0
    for chunk in chunks:
        if not chunk:
            continue
        try:
            advised = _advised(sum(_aligned(st.nbytes()) for st, _ in chunk), madvise)
        except (MemoryError, OSError, RuntimeError):  # no room for a copy: the rest stays where it is
            advised = None
        if advised is None:
            return moved
        raw, offset = advised
        with torch.no_grad():
            for st, tensors in chunk:
                nbytes = st.nbytes()
                raw[offset:offset + nbytes].copy_(torch.empty(0, dtype=torch.uint8).set_(st))
                for t in tensors:  # the same view of the copy as of the original
                    start = offset // t.element_size() + t.storage_offset()
                    t.data = raw.view(t.dtype).as_strided(t.size(), t.stride(), start)
                offset += _aligned(nbytes)
                moved += nbytes
    return moved


def _advised(nbytes: int, madvise: Any) -> tuple[Any, int] | None:
    """(raw, start): a uint8 tensor `raw` whose bytes from `start` on, at least `nbytes`,
    begin on a 2 MB boundary and are advised for huge pages; None if ``madvise`` fails.

    `raw` is a fresh anonymous mapping of its own (freed with the last tensor viewing it),
    not malloc's: malloc serves a request below its mmap threshold, which it raises to
    the largest block freed (up to 32 MB), from heap memory that earlier temporaries
    touched, and pages already there stay 4 KB whatever is advised. A q8q8 load's
    conversion left so much that its weights got 0-136 of 141 MB on huge pages."""
    import torch

    total = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    # Private: a shared anonymous mapping is shmem, whose huge pages `shmem_enabled` rules.
    region = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # room to start on a 2 MB boundary
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds `region` alive
    start = -raw.data_ptr() % HUGE_PAGE
    if madvise(ctypes.c_void_p(raw.data_ptr() + start), ctypes.c_size_t(total), _MADV_HUGEPAGE) != 0:
        return None
    return raw, start


def huge_page_tensor(numel: int, dtype: Any) -> Any | None:
    """An uninitialized CPU tensor of `numel` elements of `dtype` on memory advised for huge
    pages, as `move_to_huge_pages` puts weights (so a bandwidth test reads what a step
    reads); None where the kernel offers none."""
    if not offered(thp_setting()):
        return None
    import torch

    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    try:
        advised = _advised(nbytes, _madvise())
    except (OSError, AttributeError):
        return None
    if advised is None:
        return None
    raw, start = advised
    return raw[start:start + nbytes].view(dtype)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def huge_page_bytes() -> int | None:
    """This process's memory on transparent huge pages (``AnonHugePages`` of
    /proc/self/smaps_rollup), in bytes; None where the kernel does not say."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
