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
import platform

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
    arch = platform.machine().lower() or "unknown"
    return {"machine.arch": arch, "machine.isa": ",".join(_isa_flags()) or "unknown"}


def _isa_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return [platform.processor()] if platform.processor() else []
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
            break  # every core lists the same flags
    return [f for f in (*_X86, *_ARM) if f in flags]
