"""Chip names as jobs and workers give them (``mi300x``, ``mi355x``, ``h100``, ``cpu``): which are AMD."""

from __future__ import annotations

from fnmatch import fnmatch

# AMD Instinct families (gfx942: MI300X/MI300A/MI308X/MI325X; gfx950: MI350X/MI355X) and ROCm hosts.
AMD_CHIPS: tuple[str, ...] = ("*mi300*", "*mi308*", "*mi325*", "*mi350*", "*mi355*", "rocm*")
GFX950_CHIPS: tuple[str, ...] = ("*mi350*", "*mi355*")


def is_amd(hardware: str) -> bool:
    """Whether ``hardware`` names an AMD Instinct chip (or a ROCm host)."""
    return any(fnmatch(hardware.lower(), pattern) for pattern in AMD_CHIPS)


def is_gfx950(hardware: str) -> bool:
    return any(fnmatch(hardware.lower(), pattern) for pattern in GFX950_CHIPS)
