"""The benches' served model: `bench@production` in databases of its own, gone afterwards."""

from __future__ import annotations

from pathlib import Path

from bench.predict_load import bench_model
from training import checkpoints


def test_the_bench_model_resolves_its_checkpoint_and_removes_its_folder() -> None:
    with bench_model("resnet-bench-test-") as bench:
        target = bench.target
        assert (target.ref, target.model, target.version) == ("bench@production", "bench", 1)
        assert checkpoints.sha256_of(Path(target.path)) == target.sha256
        assert Path(target.path).is_relative_to(bench.artifacts)
        env = bench.env(auth=True)
        assert env["DATABASE_URL"] == bench.url
        assert env["BROKER_URL"] == bench.broker
        assert env["AUTH_ENABLED"] == "true"
        assert env["ARTIFACT_DIR"] == str(bench.folder / "artifacts")
        assert bench.env()["AUTH_ENABLED"] == "false"
        assert bench.bearer().startswith("Bearer ")
        folder = bench.folder
    assert not folder.exists()
