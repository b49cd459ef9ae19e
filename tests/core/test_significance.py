"""Significance of a study's seeds: intervals, tests against scipy, Holm by hand, verdicts,
the seed planner, and the presets' claims naming cells their grids have."""

from __future__ import annotations

import pytest
from scipy import stats  # type: ignore[import-untyped]

from core.studies import grid, presets, significance
from core.studies.significance import Claim

LOW, HIGH = [0.10, 0.11, 0.12], [0.20, 0.21, 0.22]
CLAIM = Claim({"model.name": "resnet56"}, "<", {"model.name": "plain56"}, "final_train_error")


def test_an_interval_is_seeded_holds_the_statistic_and_needs_two_values() -> None:
    values = [0.31, 0.29, 0.35, 0.30]
    first = significance.interval(values, "median", seed=3)
    assert first == significance.interval(values, "median", seed=3)
    assert first is not None
    assert first[0] <= 0.305 <= first[1]
    mean = significance.interval(values, "mean")
    assert mean is not None
    assert min(values) <= mean[0] < mean[1] <= max(values)
    assert significance.interval([0.3]) is None
    assert significance.interval([0.3, 0.3, 0.3]) == (0.3, 0.3)


def test_welch_and_mann_whitney_p_values_are_scipys() -> None:
    a, b = [0.30, 0.33, 0.29, 0.35], [0.36, 0.34, 0.40]
    welch = significance.compare(a, b, "welch")
    assert welch.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    less = stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue
    assert welch.p_less == pytest.approx(less)
    assert welch.p_greater == pytest.approx(1 - less)
    u = significance.compare(a, b, "mannwhitney")
    assert u.p == pytest.approx(stats.mannwhitneyu(a, b).pvalue)
    assert u.p_less == pytest.approx(stats.mannwhitneyu(a, b, alternative="less").pvalue)


def test_at_three_seeds_the_u_test_cannot_pass_05_but_welch_can() -> None:
    u = significance.compare(LOW, HIGH, "mannwhitney")
    assert (u.p, u.p_less) == pytest.approx((0.10, 0.05))  # the exact test's smallest p
    assert u.effect == -1  # every a below every b
    welch = significance.compare(LOW, HIGH, "welch")
    assert welch.p is not None
    assert welch.p < 0.001


def test_hedges_g_is_the_pooled_standardised_difference_corrected() -> None:
    a, b = [1.0, 2.0, 3.0], [3.0, 4.0, 5.0]  # sds 1, pooled 1, means 2 apart
    assert significance.hedges_g(a, b) == pytest.approx(-2 * (1 - 3 / (4 * 6 - 9)))
    assert significance.hedges_g([1.0], b) is None


def test_holm_matches_a_worked_example() -> None:
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06
    assert significance.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert significance.holm([0.5, 0.6]) == [1.0, 1.0]
    assert significance.holm([]) == []


def test_verdicts_for_separated_reversed_and_overlapping_seeds() -> None:
    assert significance.judge(CLAIM, LOW, HIGH)["verdict"] == "reproduced"
    reversed_ = significance.judge(CLAIM, HIGH, LOW)
    assert reversed_["verdict"] == "contradicted"
    assert reversed_["p_opposite"] < 0.05 < reversed_["p"]
    overlapping = significance.judge(CLAIM, [0.10, 0.20, 0.15], [0.12, 0.19, 0.16])
    assert overlapping["verdict"] == "inconclusive"
    assert overlapping["n"] == [3, 3]
    assert overlapping["test"] == "Welch's t-test"
    assert significance.judge(CLAIM, [0.1], HIGH)["verdict"] == "inconclusive"


def test_claims_are_holm_adjusted_together() -> None:
    pairs = [(CLAIM, LOW, HIGH), (CLAIM, [0.10, 0.13, 0.12], [0.12, 0.16, 0.15])]
    judged = significance.judge_all(pairs)
    raw = [significance.compare(a, b).p_less or 1.0 for _, a, b in pairs]
    assert [found["p"] for found in judged] == pytest.approx(significance.holm(raw))


def test_the_planner_asks_more_seeds_of_a_wider_spread_and_none_of_no_gap() -> None:
    found = [
        significance.seeds_needed([0.10 - s, 0.10, 0.10 + s], [0.12 - s, 0.12, 0.12 + s])
        for s in (0.002, 0.005, 0.01)
    ]
    needed = [n for n in found if n is not None]
    assert len(needed) == 3
    assert needed == sorted(needed)
    assert needed[0] < needed[-1]
    assert significance.seeds_needed([0.1, 0.2, 0.15], [0.1, 0.2, 0.15]) is None
    assert significance.seeds_needed([0.1], [0.2, 0.3]) is None


@pytest.mark.parametrize("preset", list(presets.PRESETS.values()), ids=lambda p: p.name)
def test_every_claim_names_two_cells_of_a_scale_it_holds_at(preset: presets.Preset) -> None:
    for claim in preset.claims:
        found = False
        for scale in claim.scales:
            cells = grid.cells(preset.layout(scale).grid)  # type: ignore[arg-type]
            named = [any(_has(cell, side) for cell in cells) for side in (claim.a, claim.b)]
            found = found or all(named)
        assert found, claim.label()


def _has(cell: dict[str, object], named: object) -> bool:
    assert isinstance(named, dict)
    return all(cell.get(axis) == value for axis, value in named.items())


def test_the_papers_orderings_are_declared() -> None:
    labels = {c.label() for name in presets.PRESETS for c in presets.get(name).claims}
    assert "plain56 > plain44 in final train error" in labels
    assert "resnet56 < plain56 in final train error" in labels
    assert "full_preact < bn_after_add in final test error" in labels
    assert "bn_after_add > original in final test error" in labels
    dropout = "shortcut_variant=identity < shortcut_variant=dropout shortcut_dropout=0.5"
    assert f"{dropout} in final test error" in labels
