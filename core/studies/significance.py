"""What a study's seeds say with confidence: intervals, comparisons, the papers' claims.

Pure functions of per-seed values (no database):

- `interval`: a bootstrap confidence interval of a cell's median or mean.
- `compare`: two cells' values, by Welch's t-test or the Mann-Whitney U test, with p-values
  (two-sided and one-sided each way) and an effect size.
- `holm`: Holm's step-down adjustment of a family of p-values.
- `judge_all` / `judge`: whether a claimed ordering of two cells (`a < b` on a metric) is
  reproduced, contradicted, or left open by the seeds, Holm-adjusted across the claims.
- `seeds_needed`: how many seeds per cell would settle an open claim.

Welch's t-test is the default. A study runs few seeds (the quick scale 3 per cell), and at 3
against 3 seeds the exact Mann-Whitney U test cannot reach p < 0.05: its smallest p is 0.10
two-sided and 0.05 one-sided (1 of the 20 ways to split 6 ranks), so it could never find an
ordering at the usual level, and after a Holm adjustment over several claims never at all.
Welch's t assumes roughly normal seed-to-seed noise, not equal variances, and resolves an
ordering from 3 seeds when the gap is large against the spread. The U test stays available
(`test="mannwhitney"`) for studies with more seeds, and the claims report its p beside.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats  # type: ignore[import-untyped]

Test = Literal["welch", "mannwhitney"]
Statistic = Literal["median", "mean"]
Relation = Literal["<", ">"]
Verdict = Literal["reproduced", "contradicted", "inconclusive"]
Values = Sequence[float] | np.ndarray

TESTS: tuple[Test, ...] = ("welch", "mannwhitney")
TEST_NAMES: dict[Test, str] = {"welch": "Welch's t-test", "mannwhitney": "Mann-Whitney U test"}
EFFECT_NAMES: dict[Test, str] = {"welch": "Hedges' g", "mannwhitney": "rank-biserial r"}
RESAMPLES = 9_999
MAX_SEEDS = 50  # the planner looks no further: a gap that needs more is no gap to chase
# The bootstrap's percentile interval: at 3 seeds BCa's jackknife acceleration is
# unstable (and undefined when two seeds tie), where the percentile interval is not.
METHOD = "percentile"


def interval(
    values: Sequence[float], stat: Statistic = "median", level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """A `level` bootstrap confidence interval (percentile method, `RESAMPLES` resamples,
    seeded: the same values give the same interval) of the values' median or mean; None
    under 2 values."""
    return _interval(tuple(float(v) for v in values), stat, level, seed)


# A study's page polls its results while its jobs run; a finished cell's values do not
# change, so neither does its (seeded) interval.
@functools.lru_cache(maxsize=4096)
def _interval(
    values: tuple[float, ...], stat: Statistic, level: float, seed: int
) -> tuple[float, float] | None:
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    if np.all(data == data[0]):  # every resample is the same: the interval is the value
        return float(data[0]), float(data[0])
    found = stats.bootstrap(
        (data,),
        _STATISTICS[stat],
        confidence_level=level,
        n_resamples=RESAMPLES,
        method=METHOD,
        random_state=np.random.default_rng(seed),
    )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def _median(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.median(sample, axis=axis))


def _mean(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.mean(sample, axis=axis))


_STATISTICS: dict[Statistic, Callable[..., np.ndarray]] = {"median": _median, "mean": _mean}


@dataclass(frozen=True)
class Comparison:
    """Two samples compared: p-values two-sided and one-sided each way (None when a sample
    has under 2 values), an effect size (positive when `a` tends higher), the test."""

    test: Test
    n: tuple[int, int]
    p: float | None  # two-sided
    p_less: float | None  # one-sided, the alternative: a < b
    p_greater: float | None  # one-sided, the alternative: a > b
    effect: float | None
    difference: float | None  # mean(a) - mean(b)

    @property
    def name(self) -> str:
        """The test's name in words."""
        return TEST_NAMES[self.test]

    @property
    def effect_name(self) -> str:
        """What `effect` measures."""
        return EFFECT_NAMES[self.test]

    def one_sided(self, relation: Relation) -> float | None:
        """The p-value of the alternative `a <relation> b`."""
        return self.p_less if relation == "<" else self.p_greater


def compare(a: Sequence[float], b: Sequence[float], test: Test = "welch") -> Comparison:
    """`a` against `b` by Welch's t-test (effect: Hedges' g) or the Mann-Whitney U test
    (exact where scipy can; effect: the rank-biserial correlation, 2 P(a > b) - 1)."""
    if test not in TESTS:
        raise ValueError(f"test {test!r} is unknown; tests are {', '.join(TESTS)}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = (int(x.size), int(y.size))
    difference = float(x.mean() - y.mean()) if x.size and y.size else None
    if min(n) < 2:
        return Comparison(test, n, None, None, None, None, difference)
    run = _welch if test == "welch" else _mann_whitney
    p, p_less, p_greater, effect = run(x, y)
    return Comparison(test, n, p, p_less, p_greater, effect, difference)


def _welch(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float | None]:
    with warnings.catch_warnings():  # seeds that agree exactly: scipy warns, p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        p = [
            _p(stats.ttest_ind(x, y, equal_var=False, alternative=side).pvalue)
            for side in ("two-sided", "less", "greater")
        ]
    return p[0], p[1], p[2], hedges_g(x, y)


def _mann_whitney(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float | None]:
    found = {
        side: stats.mannwhitneyu(x, y, alternative=side)
        for side in ("two-sided", "less", "greater")
    }
    u = float(found["two-sided"].statistic)  # U of `a`: pairs where a wins, ties half
    effect = 2 * u / (x.size * y.size) - 1
    p = [_p(found[side].pvalue) for side in ("two-sided", "less", "greater")]
    return p[0], p[1], p[2], effect


def _p(value: float) -> float:
    """A p-value; 1 where the test is undefined (two samples, each without spread, equal)."""
    return 1.0 if math.isnan(value) else float(value)


def hedges_g(a: Values, b: Values) -> float | None:
    """(mean a - mean b) over the pooled sample sd, with Hedges' small-sample correction;
    None under 2 values a sample or without spread."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    spread = pooled_sd(x, y)
    if spread is None or spread == 0:
        return None
    correction = 1 - 3 / (4 * (x.size + y.size) - 9)
    return float(correction * (x.mean() - y.mean()) / spread)


def pooled_sd(a: Values, b: Values) -> float | None:
    """The two samples' pooled standard deviation; None under 2 values a sample."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if min(x.size, y.size) < 2:
        return None
    pooled = ((x.size - 1) * x.var(ddof=1) + (y.size - 1) * y.var(ddof=1)) / (x.size + y.size - 2)
    return float(math.sqrt(pooled))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the k-th smallest p times (m - k + 1), kept monotone and
    at most 1; in the order given."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Claim:
    """An ordering the papers state: cell `a` below (`<`) or above (`>`) cell `b` in
    `metric`. A cell is named by some of its axis values; `scales` are the preset scales it
    holds at."""

    a: Mapping[str, Any]
    relation: Relation
    b: Mapping[str, Any]
    metric: str
    text: str = ""  # the papers' words; by default the ordering itself
    scales: tuple[str, ...] = ("quick", "paper")
    where: Mapping[str, Any] = field(default_factory=dict)  # the other axes' values, if any

    def label(self) -> str:
        """The claim in words: its text, or `plain56 > plain44 in final train error`."""
        ordering = f"{_named(self.a)} {self.relation} {_named(self.b)}"
        words = self.text or f"{ordering} in {self.metric.replace('_', ' ')}"
        return words + (f" (at {_named(self.where, keys=True)})" if self.where else "")


def _named(values: Mapping[str, Any], *, keys: bool = False) -> str:
    def shown(value: Any) -> str:
        if isinstance(value, dict):
            return " ".join(f"{k}={v}" for k, v in value.items())
        return str(value)

    if keys:
        return ", ".join(f"{axis}={shown(value)}" for axis, value in values.items())
    return ", ".join(shown(value) for value in values.values())


def judge_all(
    claims: Sequence[tuple[Claim, Sequence[float], Sequence[float]]],
    *,
    level: float = 0.05,
    test: Test = "welch",
) -> list[dict[str, Any]]:
    """Each claim's verdict from its two cells' values: reproduced where the one-sided test
    in the claimed direction, Holm-adjusted across the claims, is at most `level`;
    contradicted where the test the other way is; else inconclusive. A claim with under 2
    values in a cell is inconclusive and left out of the adjustment."""
    compared = [compare(a, b, test) for _, a, b in claims]
    tested = [i for i, found in enumerate(compared) if found.p is not None]
    claimed = _adjusted(compared, tested, [claims[i][0].relation for i in range(len(claims))])
    opposite = _adjusted(compared, tested, [_reverse(c.relation) for c, _, _ in claims])
    others = [compare(a, b, _other(test)) for _, a, b in claims]
    also = _adjusted(others, tested, [c.relation for c, _, _ in claims])
    return [
        _verdict(claim, compared[i], claimed.get(i), opposite.get(i), also.get(i), level)
        for i, (claim, _, _) in enumerate(claims)
    ]


def judge(
    claim: Claim,
    a_values: Sequence[float],
    b_values: Sequence[float],
    level: float = 0.05,
    test: Test = "welch",
) -> dict[str, Any]:
    """One claim's verdict (a family of one: nothing to adjust for); see `judge_all`."""
    return judge_all([(claim, a_values, b_values)], level=level, test=test)[0]


def _adjusted(
    compared: Sequence[Comparison], tested: Sequence[int], relations: Sequence[Relation]
) -> dict[int, float]:
    """Holm-adjusted one-sided p-values of the tested claims, by claim index."""
    raw = [compared[i].one_sided(relations[i]) for i in tested]
    return dict(zip(tested, holm([p for p in raw if p is not None]), strict=True))


def _reverse(relation: Relation) -> Relation:
    return ">" if relation == "<" else "<"


def _other(test: Test) -> Test:
    return "mannwhitney" if test == "welch" else "welch"


def _verdict(
    claim: Claim,
    found: Comparison,
    p: float | None,
    p_opposite: float | None,
    p_other: float | None,
    level: float,
) -> dict[str, Any]:
    verdict: Verdict = "inconclusive"
    if p is not None and p <= level:
        verdict = "reproduced"
    elif p_opposite is not None and p_opposite <= level:
        verdict = "contradicted"
    return {
        "claim": claim.label(),
        "verdict": verdict,
        "p": p,
        "p_opposite": p_opposite,
        "effect": found.effect,
        "effect_name": found.effect_name,
        "difference": found.difference,
        "n": list(found.n),
        "test": found.name,
        "other_test": TEST_NAMES[_other(found.test)],
        "p_other": p_other,
    }


def seeds_needed(
    a_values: Sequence[float],
    b_values: Sequence[float],
    level: float = 0.05,
    power: float = 0.8,
    cap: int = MAX_SEEDS,
) -> int | None:
    """Seeds per cell at which a one-sided Welch t-test at `level` finds the observed
    ordering (either way) with probability `power`, taking the observed means and pooled sd
    as the truth: the first n whose noncentral-t power reaches it (equal n per cell, df
    2n - 2). None under 2 values a cell, or when no n up to `cap` does: the gap is too small
    against the spread (`cap` seeds cannot settle it)."""
    spread = pooled_sd(a_values, b_values)
    if spread is None:
        return None
    gap = abs(float(np.mean(a_values)) - float(np.mean(b_values)))
    if spread == 0:
        return 2 if gap > 0 else None
    seeds = np.arange(2, cap + 1)
    reached = np.flatnonzero(t_power(gap / spread, seeds, level) >= power)
    return int(seeds[reached[0]]) if reached.size else None


def t_power(effect: float, n: np.ndarray, level: float) -> np.ndarray:
    """The power of a one-sided two-sample t-test at `level` with n per group (each of an
    array of n), for a standardised effect `effect` (Cohen's d)."""
    df = 2 * n - 2
    critical = stats.t.ppf(1 - level, df)
    return np.asarray(stats.nct.sf(critical, df, effect * np.sqrt(n / 2)))
