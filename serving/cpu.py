"""What the CPU can do: the ISA class that decides which model variant and precision run fastest.

One owner for CPU detection, used by serving (which variant a bundle loads), training
(``mixed_precision: auto``) and the benchmarks (every timing names its CPU and ISA class).
Detection reads the flags the kernel reports; every decision takes a :class:`CpuInfo`, so tests
and users can feed one instead of the machine's.

>>> info = CpuInfo.from_flags("Some CPU", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})
>>> info.isa_class, info.bf16
('AVX-512 VNNI', True)
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import lru_cache

# ISA classes, fastest first: what int8 and bf16 kernels the CPU has.
AMX = "AMX"                  # Sapphire Rapids and later: bf16/int8 tile matrix units (+ AVX-512 VNNI)
AVX512_VNNI = "AVX-512 VNNI"  # int8 dot products in AVX-512 (Cascade Lake, Ice Lake, Zen 4)
AVX2 = "AVX2"                # no VNNI: int8 weights need reduce_range, no bf16 units
BASELINE = "baseline"        # older x86 or a non-x86 CPU
ISA_CLASSES = (AMX, AVX512_VNNI, AVX2, BASELINE)


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's model name and the instruction-set flags that matter for inference and training."""

    model: str
    flags: frozenset = field(default_factory=frozenset)
    cores: int = 1

    @classmethod
    def from_flags(cls, model: str, flags, cores: int = 1) -> "CpuInfo":
        return cls(model=model, flags=frozenset(str(f).lower() for f in flags), cores=cores)

    @property
    def isa_class(self) -> str:
        if "amx_tile" in self.flags and ("amx_bf16" in self.flags or "amx_int8" in self.flags):
            return AMX
        if "avx512_vnni" in self.flags:
            return AVX512_VNNI
        if "avx2" in self.flags:
            return AVX2
        return BASELINE

    @property
    def vnni(self) -> bool:
        """int8 dot-product instructions (full-range s8 weights are safe to use)."""
        return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & self.flags)

    @property
    def bf16(self) -> bool:
        """Native bf16 arithmetic (AMX tiles or AVX-512 BF16): bf16 autocast pays off here."""
        return bool({"amx_bf16", "avx512_bf16"} & self.flags)

    def describe(self) -> str:
        extra = ", bf16" if self.bf16 else ""
        return f"{self.model} ({self.cores} cores, {self.isa_class}{extra})"

    def as_dict(self) -> dict:
        return {"cpu_model": self.model, "isa_class": self.isa_class, "bf16": self.bf16, "vnni": self.vnni, "cores": self.cores}


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """(model name, flags) from the text of ``/proc/cpuinfo`` (the first processor's entries).

    >>> parse_cpuinfo("model name\\t: AMD EPYC\\nflags\\t\\t: fpu avx2 avx512_vnni\\n")
    ('AMD EPYC', {'avx2', 'avx512_vnni', 'fpu'})
    """
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if model and flags:
            break
    return model, flags


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else every core).

    >>> usable_cores() >= 1
    True
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@lru_cache(maxsize=1)
def detect() -> CpuInfo:
    """This machine's :class:`CpuInfo` (Linux reads /proc/cpuinfo; elsewhere the ISA class is ``baseline``)."""
    cores = usable_cores()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model, flags = parse_cpuinfo(f.read())
    except OSError:
        model, flags = "", set()
    return CpuInfo.from_flags(model or platform.processor() or platform.machine() or "unknown CPU", flags, cores)
