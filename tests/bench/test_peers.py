"""The peers bench's report: ratios of our req/s over each peer's, in the forms set
against each other, and the table that prints them beside the bare forward."""

from __future__ import annotations

import math

from bench.peers import Figure, ratios, table


def figures() -> list[Figure]:
    return [
        Figure("ours", "raw", 1, 700.0, 1.4, 2.0),
        Figure("ours", "raw", 64, 1200.0, 50.0, 80.0),
        Figure("ours", "v2", 1, 600.0, 1.6, 2.2),
        Figure("torchserve", "torchserve", 1, 200.0, 5.0, 9.0),
        Figure("torchserve", "torchserve", 64, 1000.0, 60.0, 90.0),
        Figure("triton", "triton", 1, 300.0, 3.0, 4.0),
        Figure("triton", "triton", 8, 500.0, 15.0, 20.0),  # ours has no v2 c8: no ratio
        Figure("triton", "triton", 64, 0.0, 0.0, 0.0, failed=10),
    ]


def test_each_peer_is_set_against_our_form_for_it() -> None:
    found = ratios(figures())
    assert found[:2] == [("torchserve", 1, 3.5), ("torchserve", 64, 1.2)]
    assert found[2] == ("triton", 1, 2.0)
    assert [(peer, c) for peer, c, _ in found] == [
        ("torchserve", 1),
        ("torchserve", 64),
        ("triton", 1),
    ]


def test_a_peer_that_served_nothing_has_no_ratio_rather_than_an_error() -> None:
    runs = [Figure("ours", "v2", 64, 900.0, 1.0, 1.0), Figure("triton", "triton", 64, 0.0, 0, 0)]
    [(peer, concurrency, ratio)] = ratios(runs)
    assert (peer, concurrency) == ("triton", 64)
    assert math.isnan(ratio)


def test_the_table_prints_runs_ratios_and_the_bare_forward() -> None:
    text = table(figures(), {1: (731.0, 1.37), 64: (2100.0, 30.5)})
    lines = text.splitlines()
    ratio_line = next(line for line in lines if line.startswith("raw vs torchserve"))
    assert ratio_line.split()[3:] == ["3.50", "nan", "1.20"]  # c1, c8 (not run), c64
    assert any(line.startswith("v2 vs triton") for line in lines)
    assert "batch   1:      731 images/s, 1.37 ms per forward" in lines
    assert "batch  64:     2100 images/s, 30.50 ms per forward" in lines
    assert sum(line.startswith("torchserve") for line in lines) == 2
