"""Machine facts: the CPU class whose kernels a machine-dependent action's outputs depend on.

onnxruntime picks CPU kernels by instruction set (AVX2, AVX-512 VNNI, AMX, NEON dot
product, ...), and float results differ between them in the last bits, so calibration
statistics, sensitivity rankings, bias corrections and latencies computed on one machine
class are not another's. A rule that declares ``machine_dependent = True`` gets these
facts in its action key (as ``machine.*`` environment facts, which ``qbuild explain``
names when they change); pure graph transforms leave them out and stay shareable across
machines through a remote cache.

The instruction-set list is the subset of the CPU's flags that selects different kernels,
so a microcode or unrelated flag change does not split caches. ``QBUILD_MACHINE_CLASS``
replaces the detected facts with a name the user chooses (for fleets whose CPUs differ
only in ways that do not matter, or on systems where the flags cannot be read).
"""

from __future__ import annotations

import functools
import os
from typing import Any

# Flags that select kernels in onnxruntime / MLAS (x86: /proc/cpuinfo "flags";
# ARM: "Features").
_X86 = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
        "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
        "amx_bf16")
_ARM = ("asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2", "fphp")


@functools.lru_cache(maxsize=1)
def machine_facts() -> dict[str, str]:
    """``{"machine.arch": ..., "machine.isa": ...}`` for this machine (cached)."""
    chosen = os.environ.get("QBUILD_MACHINE_CLASS")
    if chosen:
        return {"machine.class": chosen}
    # (os.uname is platform.machine's own source; importing platform costs the fast path)
    arch = (os.uname().machine if hasattr(os, "uname") else _platform().machine()).lower()
    arch = arch or "unknown"
    return {"machine.arch": arch, "machine.isa": ",".join(_isa_flags()) or "unknown"}


def _isa_flags() -> list[str]:
    # Read up to the first core's flags line only: the no-op fast path derives these
    # facts on every run, and the kernel makes /proc/cpuinfo's text as it is read.
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            while len(text) < 1 << 20:
                chunk = f.read(4096)
                text += chunk
                if not chunk or any(line.split(":", 1)[0].strip() in ("flags", "Features")
                                    for line in text.splitlines()[:-1]):
                    break
    except OSError:
        processor = _platform().processor()
        return [processor] if processor else []
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
            break  # every core lists the same flags
    return [f for f in (*_X86, *_ARM) if f in flags]


def _platform() -> Any:
    import platform

    return platform
