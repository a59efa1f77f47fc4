"""The correctness gate on recorded outputs."""

from __future__ import annotations

from tuner.workers.correctness import common_prefix, compare

REFERENCE = ((5, 6, 7, 8, 9, 10, 11, 12), (1, 2, 3, 4), (40, 41, 42, 43, 44, 45))


def test_identical_outputs_pass() -> None:
    report = compare(REFERENCE, REFERENCE)
    assert report.passed
    assert report.identical_fraction == 1.0
    assert report.median_prefix_fraction == 1.0


def test_recorded_divergent_outputs_fail_the_gate_with_figures_kept() -> None:
    # Recorded from a drafter with a broken rejection sampler: diverges after 1-2 tokens.
    outputs = ((5, 6, 99, 98, 97, 96, 95, 94), (1, 77, 76, 75), (40, 41, 42, 43, 44, 45))
    report = compare(outputs, REFERENCE, threshold=0.5)
    assert not report.passed
    assert [c.common_prefix for c in report.comparisons] == [2, 1, 6]
    assert [c.identical for c in report.comparisons] == [False, False, True]
    assert report.median_prefix_fraction == 0.25
    assert report.identical_fraction == 1 / 3


def test_late_divergence_passes_but_is_not_identical() -> None:
    outputs = ((5, 6, 7, 8, 9, 10, 0, 0), (1, 2, 3, 4), (40, 41, 42, 43, 0, 0))
    report = compare(outputs, REFERENCE)
    assert report.passed
    assert report.identical_fraction == 1 / 3


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_nothing_to_compare_is_not_gated_rather_than_passed() -> None:
    report = compare((), REFERENCE)
    assert not report.gated and report.comparisons == () and report.not_gated == "no outputs to compare"
    assert compare(REFERENCE, REFERENCE).gated
