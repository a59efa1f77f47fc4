"""Hardware detection on recorded outputs of amd-smi, rocm-smi and nvidia-smi.

The outputs follow the tools' documented shapes: amd-smi ``static --json`` as a list (ROCm 6.2/6.3) and as
``{"gpu_data": [...]}`` (ROCm 6.4+), rocm-smi ``--showproductname --showid --json`` keyed by card, and
nvidia-smi's CSV query with ``pci.device_id`` as device << 16 | 0x10de.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tuner.workers import hardware as hw


def _amd_smi_record(gpu: int, market: str, device_id: str, gfx: str, mib: int) -> dict:
    return {
        "gpu": gpu,
        "asic": {
            "market_name": market,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": device_id,
            "subsystem_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": "0x4E9F5C2A1B3D6E70",
            "oam_id": gpu,
            "num_compute_units": 304,
            "target_graphics_version": gfx,
        },
        "vram": {"type": "HBM", "vendor": "HYNIX", "size": {"value": mib, "unit": "MB"}, "bit_width": 8192},
    }


MI300X_AMD_SMI_LIST = json.dumps(
    [_amd_smi_record(i, "AMD Instinct MI300X", "0x74a1", "gfx942", 196592) for i in range(8)]
)
MI325X_AMD_SMI_GPU_DATA = json.dumps(
    {"gpu_data": [_amd_smi_record(i, "AMD Instinct MI325X", "0x74a5", "gfx942", 262128) for i in range(2)]}
)
# gfx950 is shared by MI350X and MI355X: only the device id tells them apart.
MI355X_AMD_SMI = json.dumps(
    {"gpu_data": [_amd_smi_record(i, "AMD Instinct MI355X", "0x75a3", "gfx950", 294896) for i in range(8)]}
)
MI300X_VF_AMD_SMI = json.dumps({"gpu_data": [_amd_smi_record(0, "AMD Instinct MI300X VF", "0x74b5", "gfx942", 196592)]})
AMD_SMI_VERSION = json.dumps(
    [
        {
            "tool": "AMDSMI Tool",
            "version": "25.4.2+aca1101",
            "amdsmi_library_version": "25.4.2",
            "rocm_version": "6.4.1",
            "amdgpu_version": "6.12.12",
        }
    ]
)
ROCM_SMI_PRODUCT = json.dumps(
    {
        f"card{i}": {
            "Device Name": "Aqua Vanjaram [Instinct MI300X]",
            "Device ID": "0x74a1",
            "Device Rev": "0x00",
            "Subsystem ID": "0x74a1",
            "GUID": f"{28851 + i}",
            "Card Series": "AMD Instinct MI300X OAM",
            "Card Model": "0x74a1",
            "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Card SKU": "M3000100",
            "Node ID": f"{i + 2}",
            "GFX Version": "gfx942",
        }
        for i in range(2)
    }
)
ROCM_SMI_VRAM = json.dumps(
    {f"card{i}": {"VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "297619456"} for i in range(2)}
)
NVIDIA_H100 = (
    "0, NVIDIA H100 80GB HBM3, 0x233010DE, 81559 MiB, 570.124.06\n"
    "1, NVIDIA H100 80GB HBM3, 0x233010DE, 81559 MiB, 570.124.06\n"
)
NVIDIA_HEADER = (
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 570.124.06             Driver Version: 570.124.06     CUDA Version: 12.8     |\n"
)


class FakeRun:
    """Replays recorded outputs by command prefix; anything else behaves as a missing tool."""

    def __init__(self, outputs: dict[tuple[str, ...], str]):
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        for prefix, out in self.outputs.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return subprocess.CompletedProcess(argv, 0, out, "")
        raise FileNotFoundError(argv[0])


def test_amd_smi_list_format_mi300x():
    gpus = hw.detect_gpus(FakeRun({("amd-smi", "static"): MI300X_AMD_SMI_LIST}))
    assert len(gpus) == 8
    g = gpus[3]
    assert (g.index, g.vendor, g.family, g.pci_device_id, g.gfx) == (3, "amd", "mi300x", "0x74a1", "gfx942")
    assert g.memory_mib == 196592 and g.product == "AMD Instinct MI300X"


def test_amd_smi_gpu_data_format_mi325x_is_not_mi300x_despite_gfx942():
    gpus = hw.detect_gpus(FakeRun({("amd-smi", "static"): MI325X_AMD_SMI_GPU_DATA}))
    assert [g.family for g in gpus] == ["mi325x", "mi325x"]
    assert gpus[0].gfx == "gfx942"


def test_gfx950_told_apart_by_pci_id():
    gpus = hw.parse_amd_smi_static(MI355X_AMD_SMI)
    assert {g.family for g in gpus} == {"mi355x"}
    # The same gfx target with MI350X's id is an MI350X, whatever the name says.
    assert hw.amd_family("AMD Instinct", "0x75a0") == "mi350x"


def test_virtual_function_id_maps_to_its_chip():
    (g,) = hw.parse_amd_smi_static(MI300X_VF_AMD_SMI)
    assert g.family == "mi300x" and g.pci_device_id == "0x74b5"


def test_rocm_smi_fallback_when_amd_smi_missing():
    run = FakeRun({("rocm-smi", "--showproductname"): ROCM_SMI_PRODUCT, ("rocm-smi", "--showmeminfo"): ROCM_SMI_VRAM})
    gpus = hw.detect_gpus(run)
    assert [(g.index, g.family, g.gfx) for g in gpus] == [(0, "mi300x", "gfx942"), (1, "mi300x", "gfx942")]
    assert gpus[0].memory_mib == 206141652992 // (1024 * 1024)
    assert gpus[0].product == "AMD Instinct MI300X OAM"


def test_nvidia_smi_csv():
    gpus = hw.detect_gpus(FakeRun({("nvidia-smi", hw.NVIDIA_QUERY): NVIDIA_H100}))
    assert [(g.index, g.family, g.pci_device_id, g.memory_mib) for g in gpus] == [
        (0, "h100", "0x2330", 81559),
        (1, "h100", "0x2330", 81559),
    ]


@pytest.mark.parametrize(
    "name,family",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100"),
    ],
)
def test_nvidia_families_follow_rays_rule(name, family):
    assert hw.nvidia_family(name) == family


def test_no_tool_no_gpus():
    assert hw.detect_gpus(FakeRun({})) == ()


def test_host_report_amd():
    run = FakeRun({("amd-smi", "static"): MI300X_AMD_SMI_LIST, ("amd-smi", "version"): AMD_SMI_VERSION})
    report = hw.host_report(vllm_version_probe=lambda: "0.34.0", run=run)
    assert report.driver == "rocm 6.4.1" and report.kernel_driver == "6.12.12"
    assert report.family() == "mi300x" and report.vllm_version == "0.34.0"
    d = report.to_dict()
    assert d["gpu_count"] == 8 and d["family"] == "mi300x" and d["gpus"][0]["pci_device_id"] == "0x74a1"
    json.dumps(d)


def test_host_report_nvidia_and_cpu():
    run = FakeRun(
        {
            ("nvidia-smi", hw.NVIDIA_QUERY): NVIDIA_H100,
            ("nvidia-smi", "--query-gpu=driver_version"): "570.124.06\n570.124.06\n",
            ("nvidia-smi",): NVIDIA_HEADER,
        }
    )
    report = hw.host_report(vllm_version_probe=lambda: None, run=run)
    assert report.driver == "cuda 12.8" and report.kernel_driver == "570.124.06"
    assert report.family() == "h100"
    cpu = hw.host_report(vllm_version_probe=lambda: None, run=FakeRun({}))
    assert cpu.family() == "cpu" and cpu.driver is None


def test_mixed_host_has_no_single_family():
    a = hw.parse_amd_smi_static(MI300X_AMD_SMI_LIST)[:1]
    b = hw.parse_amd_smi_static(MI355X_AMD_SMI)[:1]
    assert hw.HostReport(gpus=a + b, driver=None, vllm_version=None, hostname="h").family() is None


def test_ray_accelerator_types():
    assert hw.ray_accelerator_types("mi300x") == ("AMD-Instinct-MI300X-OAM", "AMD-Instinct-MI300X-HF")
    assert hw.ray_accelerator_types("MI355X") == ("AMD-Instinct-MI355X-OAM",)
    assert set(hw.ray_accelerator_types("mi308x")) == {"AMD-Instinct-MI308X-OAM", "AMD-Instinct-MI308X"}
    assert hw.ray_accelerator_types("h100") == ("H100",)
    assert hw.ray_accelerator_types("a100") == ("A100", "A100-40G", "A100-80G")
    assert hw.ray_accelerator_types("auto") == ()


def test_every_ray_type_maps_back_to_its_family():
    # How a Ray runner names the chips of its cluster from the nodes' accelerator_type:<name> resources.
    for family in [*hw.AMD_RAY_TYPES, "h100", "a100", "l40s"]:
        for name in hw.ray_accelerator_types(family):
            assert hw.family_of_ray_type(name) == family, (name, family)


def test_ray_tables_agree_with_installed_ray():
    amd_gpu = pytest.importorskip("ray._private.accelerators.amd_gpu")
    for pci_id, ray_name in amd_gpu.amd_product_dict.items():
        fam = hw.AMD_FAMILY_BY_PCI_ID.get(pci_id.lower())
        if fam is None:
            assert "Radeon" in ray_name
            continue
        assert ray_name in hw.ray_accelerator_types(fam), (pci_id, ray_name, fam)
        assert hw.family_of_ray_type(ray_name) == fam


@pytest.mark.parametrize(
    "requested,family,ok",
    [
        ("auto", "mi300x", True),
        ("auto", None, True),
        ("mi300x", "mi300x", True),
        ("MI300X", "mi300x", True),
        ("AMD-Instinct-MI300X-HF", "mi300x", True),
        ("AMD Instinct MI300X OAM", "mi300x", True),
        ("mi300x", "mi325x", False),
        ("mi355x", "mi350x", False),
        ("h100", "h200", False),
        ("mi300x", None, False),
        ("cpu", "cpu", True),
    ],
)
def test_hardware_matches(requested, family, ok):
    assert hw.hardware_matches(requested, family) is ok
