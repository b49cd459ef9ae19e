"""A dataset's digest: over what was read, stable, sensitive to one byte, and cached."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import TypeAdapter

from tests.training.test_datasets import _write_cifar, _write_mnist
from training.data import LoadedDataset
from training.datasets import archives, digest, load_dataset
from training.specs import DatasetSpec


def _load(root: Path, **fields: object) -> LoadedDataset:
    spec: DatasetSpec = TypeAdapter(DatasetSpec).validate_python(fields)
    return load_dataset(spec, data_root=root)


def _digest_of(root: Path, **fields: object) -> str:
    provenance = _load(root, **fields).provenance
    assert provenance is not None
    return provenance.digest


def _tree(folder: Path) -> None:
    """Two classes of three 6x6 BMPs each (uncompressed: any pixel byte may change)."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / label / f"{i}.bmp")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the digests and the unpacking hash, as they hash it."""
    hashed: list[Path] = []

    def spy(original: Callable[[Path], str]) -> Callable[[Path], str]:
        def counted(path: Path) -> str:
            hashed.append(path)
            return original(path)

        return counted

    monkeypatch.setattr(digest, "sha256_of", spy(archives.sha256_of))
    monkeypatch.setattr(archives, "sha256_of", spy(archives.sha256_of))
    return hashed


def _flip_one_byte(path: Path, offset: int) -> None:
    """Change one byte of a file, keeping its size, and give it a later modification time."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))


def test_tree_digest_is_over_paths_and_contents(root: Path, reads: list[Path]) -> None:
    _tree(root / "pets")
    first = _digest_of(root, name="imagefolder", path="pets", split_seed=3)
    assert first.startswith("sha256:")
    assert len(first) == 7 + 64
    assert len(reads) == 6
    shutil.copytree(root / "pets", root / "copy")
    assert _digest_of(root, name="imagefolder", path="copy") == first  # same tree elsewhere
    (root / "copy" / "b" / "2.bmp").rename(root / "copy" / "b" / "9.bmp")
    assert _digest_of(root, name="imagefolder", path="copy") != first  # a path changed


def test_one_changed_byte_changes_the_digest(root: Path) -> None:
    _tree(root / "pets")
    before = _load(root, name="imagefolder", path="pets", validation=0)
    _flip_one_byte(root / "pets" / "a" / "1.bmp", -1)  # the last pixel's last byte
    after = _load(root, name="imagefolder", path="pets", validation=0)
    assert before.provenance is not None
    assert after.provenance is not None
    assert after.provenance.digest != before.provenance.digest
    assert after.provenance.splits == before.provenance.splits  # the same files, one byte off


def test_a_touched_identical_file_is_read_again_to_the_same_digest(
    root: Path, reads: list[Path]
) -> None:
    _tree(root / "pets")
    before = _digest_of(root, name="imagefolder", path="pets")
    path = root / "pets" / "b" / "0.bmp"
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))
    reads.clear()
    assert _digest_of(root, name="imagefolder", path="pets") == before
    assert len(reads) == 6  # the listing changed: read again
    assert len(list((root / ".digests").glob("*.json"))) == 2  # one per listing


def test_a_cached_digest_is_not_recomputed(root: Path, reads: list[Path]) -> None:
    _tree(root / "pets")
    first = _digest_of(root, name="imagefolder", path="pets")
    (cached,) = (root / ".digests").glob("*.json")
    assert first in cached.read_text()
    assert not list((root / ".digests").glob(".partial-*"))  # written atomically
    reads.clear()
    assert _digest_of(root, name="imagefolder", path="pets", in_memory=False) == first
    assert reads == []


def test_an_archive_digest_is_its_sha256_and_read_once(
    root: Path, tmp_path: Path, reads: list[Path]
) -> None:
    _tree(tmp_path / "tree")
    archive = root / "pets.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "tree", arcname="pets")
    expected = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    data = _load(root, name="imagefolder", path="pets.tar")
    assert data.provenance is not None
    assert (data.provenance.digest, data.provenance.source) == (expected, "pets.tar")
    assert reads == [archive]  # unpacking's hash, kept as the digest
    reads.clear()
    assert _digest_of(root, name="imagefolder", path="pets.tar") == expected
    assert reads == []  # neither the digest nor the unpacked folder's name read it again


def test_cifar_archive_digest_is_its_sha256(root: Path) -> None:
    _write_cifar(root, "cifar10", archive=True)
    provenance = _load(root, name="cifar10").provenance
    archive = root / "cifar-10-python.tar.gz"
    assert provenance is not None
    assert provenance.source == "cifar-10-python.tar.gz"
    assert provenance.digest == "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()


def test_cifar_folder_digest_covers_the_files_read(root: Path) -> None:
    _write_cifar(root / "cifar10", "cifar10", archive=False)
    provenance = _load(root, name="cifar10").provenance
    assert provenance is not None
    assert provenance.source == "cifar10/cifar-10-batches-py"
    (root / "cifar10" / "cifar-10-batches-py" / "readme.html").write_text("not read")
    assert _digest_of(root, name="cifar10") == provenance.digest
    batch = root / "cifar10" / "cifar-10-batches-py" / "test_batch"
    _flip_one_byte(batch, len(batch.read_bytes()) // 2)  # a pixel: the pickle still loads
    assert _digest_of(root, name="cifar10") != provenance.digest


def test_idx_digest_covers_the_four_files(root: Path) -> None:
    _write_mnist(root / "mnist", gz=False)
    first = _digest_of(root, name="mnist")
    _flip_one_byte(root / "mnist" / "t10k-images-idx3-ubyte", -1)
    assert _digest_of(root, name="mnist") != first


def test_generated_data_is_digested_by_its_description(tmp_path: Path) -> None:
    digits = {_digest_of(tmp_path, name="digits", split_seed=seed) for seed in (0, 1)}
    assert len(digits) == 1  # the same data, split otherwise
    synthetic = _digest_of(tmp_path, name="synthetic")
    assert _digest_of(tmp_path, name="synthetic") == synthetic
    assert _digest_of(tmp_path, name="synthetic", split_seed=1) != synthetic
    assert _digest_of(tmp_path, name="synthetic", num_classes=3) != synthetic
    assert not (tmp_path / ".digests").exists()  # nothing read, nothing cached
