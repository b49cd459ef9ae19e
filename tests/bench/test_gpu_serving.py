"""The GPU serving bench's CPU path, tiny: every precision row measured and checked against
fp32, TensorRT said unavailable, `/v2` req/s at each concurrency, the JSON as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_serving


def test_the_cpu_path_measures_each_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "serving.json"
    result = gpu_serving.main(["--device", "cpu", "--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {row["serving"]: row for row in result["rows"]}
    assert set(rows) == {"fp32", "bf16", "tensorrt"}
    for name in ("fp32", "bf16"):
        assert set(rows[name]["images_per_s"]) == {"1", "8", "64"}
        assert min(rows[name]["images_per_s"].values()) > 0
    assert rows["fp32"]["max_abs_diff_vs_fp32"] == 0
    assert 0 < rows["bf16"]["max_abs_diff_vs_fp32"] <= 0.05
    assert rows["tensorrt"]["unavailable"] == "TensorRT runs on a GPU"
    (served,) = result["v2"]
    assert served["serving"] == "fp32"
    assert [load["concurrency"] for load in served["v2"]] == [1, 8, 64]
    assert all(load["requests_per_s"] > 0 for load in served["v2"])
    assert all(load["failed"] == 0 for load in served["v2"])
    assert all(0 < load["p50_ms"] <= load["p99_ms"] for load in served["v2"])
    printed = capsys.readouterr().out
    assert "bf16" in printed
    assert "behind /v2 on cpu" in printed
