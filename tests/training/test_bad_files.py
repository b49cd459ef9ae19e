"""Unreadable image files are found before training: named in an error, or skipped."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import TypeAdapter

from training.data import FileSplit, TensorSplit
from training.datasets import load_dataset
from training.specs import DatasetSpec


def _spec(**fields: object) -> DatasetSpec:
    spec: DatasetSpec = TypeAdapter(DatasetSpec).validate_python({"name": "imagefolder", **fields})
    return spec


def _jpeg(seed: int) -> bytes:
    """A 40x48 noisy JPEG's bytes."""
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _tree(root: Path) -> dict[str, Path]:
    """train/ and test/ of classes a and b, 4 good JPEGs each, and three bad files in train/."""
    seed = 0
    for split, count in (("train", 4), ("test", 2)):
        for label in ("a", "b"):
            (root / "set" / split / label).mkdir(parents=True)
            for i in range(count):
                seed += 1
                (root / "set" / split / label / f"{i}.jpg").write_bytes(_jpeg(seed))
    bad = {
        "truncated": root / "set" / "train" / "a" / "truncated.jpg",
        "text": root / "set" / "train" / "b" / "notes.jpg",
        "empty": root / "set" / "train" / "b" / "zero.jpg",
    }
    full = _jpeg(7)
    bad["truncated"].write_bytes(full[: len(full) // 2])
    bad["text"].write_text("these are not the pixels you are looking for\n")
    bad["empty"].write_bytes(b"")
    return bad


@pytest.mark.parametrize("in_memory", [True, False])
def test_bad_files_fail_the_load_naming_each(root: Path, in_memory: bool) -> None:
    bad = _tree(root)
    with pytest.raises(ValueError, match=r"3 of 15 images under .* cannot be read") as caught:
        load_dataset(_spec(path="set", in_memory=in_memory), data_root=root)
    message = str(caught.value)
    for path in bad.values():
        assert f"cannot read image {path}" in message
    assert "truncated" in message  # Pillow's reason for the cut-off JPEG
    assert "bad_files 'skip'" in message


@pytest.mark.parametrize("in_memory", [True, False])
def test_skipped_bad_files_are_left_out_counted_and_named(root: Path, in_memory: bool) -> None:
    _tree(root)
    spec = _spec(path="set", in_memory=in_memory, bad_files="skip", validation=0)
    data = load_dataset(spec, data_root=root)
    assert isinstance(data.train, TensorSplit if in_memory else FileSplit)
    assert (len(data.train), len(data.test)) == (8, 4)
    assert data.provenance is not None
    record = data.provenance.to_record()
    assert record["skipped_count"] == 3
    assert sorted(item["file"] for item in record["skipped"]) == [
        "train/a/truncated.jpg",
        "train/b/notes.jpg",
        "train/b/zero.jpg",
    ]
    assert all(str(root) not in item["error"] for item in record["skipped"])
    assert record["splits"] == {"train": 8, "val": 0, "test": 4}
    if isinstance(data.train, FileSplit):
        assert all("notes" not in path.name for path in data.train.paths)


def test_a_class_with_only_bad_files_is_refused_when_skipping(root: Path) -> None:
    (root / "s" / "a").mkdir(parents=True)
    (root / "s" / "b").mkdir(parents=True)
    for i in range(5):
        (root / "s" / "a" / f"{i}.jpg").write_bytes(_jpeg(i))
        (root / "s" / "b" / f"{i}.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no training images in the class folders \['b'\]"):
        load_dataset(_spec(path="s", bad_files="skip"), data_root=root)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    return tmp_path / "data"
