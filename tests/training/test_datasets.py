"""Dataset readers on tiny files written here: exact pixels, labels, splits and safety."""

from __future__ import annotations

import builtins
import gzip
import io
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
import torchvision
from PIL import Image
from pydantic import TypeAdapter, ValidationError
from sklearn.datasets import load_digits

from tests import images
from training.data import DatasetInfo, FileSplit, LoadedDataset, Split, TensorSplit
from training.datasets import (
    DatasetNotFound,
    available_datasets,
    idx,
    imagefolder,
    load_dataset,
    read_idx,
    unpack_archive,
)
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.preprocess import preprocessing_for
from training.specs import DatasetSpec, TrainSpec

U8 = npt.NDArray[np.uint8]
Written = tuple[U8, list[int], U8, list[int]]  # train rows, labels, test rows, labels
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer"]
CIFAR10_NAMES += ["dog", "frog", "horse", "ship", "truck"]


def _spec(**fields: Any) -> DatasetSpec:
    """A dataset spec validated as the service validates it."""
    spec: DatasetSpec = TypeAdapter(DatasetSpec).validate_python(fields)
    return spec


def _images(split: Split) -> U8:
    """The uint8 images of an in-memory split as numpy."""
    assert isinstance(split, TensorSplit)
    images: U8 = split.images.numpy()
    return images


def _numpy_stats(images: U8) -> tuple[list[float], list[float]]:
    """Per-channel mean and std on the [0, 1] scale, computed plainly."""
    scaled = images.astype(np.float64) / 255
    return list(scaled.mean(axis=(0, 2, 3))), list(scaled.std(axis=(0, 2, 3)))


def _assert_stats(data: LoadedDataset, images: U8) -> None:
    """The dataset's normalisation equals numpy's on `images`."""
    mean, std = _numpy_stats(images)
    assert data.info.mean == pytest.approx(mean, abs=1e-12)
    assert data.info.std == pytest.approx(std, abs=1e-12)


# --- CIFAR ------------------------------------------------------------------------------


def _pickle(obj: object) -> bytes:
    """Protocol 2, as the Python 2 pickles of the real release."""
    return pickle.dumps(obj, protocol=2)


def _python2_pickle(rows: U8, labels: list[int]) -> bytes:
    """A batch as Python 2's cPickle wrote the real release: byte strings, numpy globals."""
    dtype = b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xff"
    dtype += b"J\xff\xff\xff\xffK\x00tb"
    shape = b"M" + struct.pack("<H", rows.shape[0]) + b"M" + struct.pack("<H", rows.shape[1])
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
    array += b"(K\x01" + shape + b"\x86" + dtype + b"\x89T" + struct.pack("<i", rows.size)
    array += rows.tobytes() + b"tb"
    label_ops = b"".join(b"K" + bytes([label]) for label in labels)
    return b"\x80\x02}(U\x04data" + array + b"U\x06labels](" + label_ops + b"eu."


def _cifar_rows(rng: np.random.Generator, count: int, start: int) -> U8:
    """Random CIFAR rows (N, 3072) whose first byte is a unique key."""
    rows: U8 = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
    rows[:, 0] = np.arange(start, start + count)
    return rows


def _cifar_files(name: str, per_batch: int) -> tuple[dict[str, bytes], Written]:
    """The pickles of a tiny CIFAR-10 or -100 release, and what they hold."""
    rng = np.random.default_rng(0)
    classes = 10 if name == "cifar10" else 100
    batches = [f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"]
    key = b"labels" if name == "cifar10" else b"fine_labels"
    files: dict[str, bytes] = {}
    train_rows, train_labels = [], []
    for number, batch in enumerate(batches):
        rows = _cifar_rows(rng, per_batch, number * per_batch)
        labels = rng.integers(0, classes, per_batch).tolist()
        files[batch] = _pickle({b"data": rows, key: labels})
        train_rows.append(rows)
        train_labels += labels
    test_rows = _cifar_rows(rng, per_batch, 200)
    test_labels = rng.integers(0, classes, per_batch).tolist()
    files["test_batch" if name == "cifar10" else "test"] = _pickle(
        {b"data": test_rows, key: test_labels}
    )
    if name == "cifar10":
        files["batches.meta"] = _pickle({b"label_names": [n.encode() for n in CIFAR10_NAMES]})
    else:
        fine = [f"fine{i:02d}".encode() for i in range(100)]
        files["meta"] = _pickle({b"fine_label_names": fine, b"coarse_label_names": [b"c"]})
    return files, (np.concatenate(train_rows), train_labels, test_rows, test_labels)


def _write_cifar(place: Path, name: str, *, archive: bool, per_batch: int = 4) -> Written:
    """A tiny CIFAR release in `place`, as the tar.gz or as its unpacked folder."""
    files, written = _cifar_files(name, per_batch)
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    place.mkdir(parents=True, exist_ok=True)
    if archive:
        tar_name = "cifar-10-python.tar.gz" if name == "cifar10" else "cifar-100-python.tar.gz"
        with tarfile.open(place / tar_name, "w:gz") as tar:
            for member, data in {**files, "readme.html": b"<html>"}.items():
                _add_bytes(tar, f"{folder}/{member}", data)
    else:
        (place / folder).mkdir()
        for member, data in files.items():
            (place / folder / member).write_bytes(data)
    return written


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a regular file member holding `data`."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty data root, with room beside it to check that nothing escapes."""
    data_root = tmp_path / "data"
    data_root.mkdir()
    return data_root


def test_cifar10_archive_reads_exact_pixels_labels_and_names(root: Path) -> None:
    train_rows, train_labels, test_rows, test_labels = _write_cifar(root, "cifar10", archive=True)
    data = load_dataset(_spec(name="cifar10", validation=0), data_root=root)
    test = _images(data.test)
    # Row layout: 1024 red, then green, then blue values, each row-major 32x32.
    for image, (c, y, x) in [(0, (0, 0, 5)), (1, (1, 7, 3)), (3, (2, 31, 31))]:
        assert test[image, c, y, x] == test_rows[image, c * 1024 + y * 32 + x]
    assert np.array_equal(test, test_rows.reshape(-1, 3, 32, 32))
    assert data.test.labels.tolist() == test_labels
    # The training part is shuffled by the split; the first pixel is each image's key.
    order = _images(data.train)[:, 0, 0, 0].argsort()
    assert np.array_equal(_images(data.train)[order], train_rows.reshape(-1, 3, 32, 32))
    assert data.train.labels.numpy()[order].tolist() == train_labels
    assert data.info.classes == tuple(CIFAR10_NAMES)
    assert (data.info.channels, data.info.image_size, len(data.val)) == (3, (32, 32), 0)
    _assert_stats(data, train_rows.reshape(-1, 3, 32, 32))


def test_cifar10_folder_in_a_subfolder_holds_out_a_seeded_validation(root: Path) -> None:
    _write_cifar(root / "cifar10", "cifar10", archive=False, per_batch=10)
    data = load_dataset(_spec(name="cifar10", validation=0.1, split_seed=3), data_root=root)
    assert (len(data.train), len(data.val), len(data.test)) == (45, 5, 10)
    keys = np.concatenate([_images(data.train), _images(data.val)])[:, 0, 0, 0]
    assert sorted(keys.tolist()) == list(range(50))
    _assert_stats(data, _images(data.train))
    again = load_dataset(_spec(name="cifar10", validation=0.1, split_seed=3), data_root=root)
    other = load_dataset(_spec(name="cifar10", validation=0.1, split_seed=4), data_root=root)
    assert np.array_equal(_images(again.val), _images(data.val))
    assert not np.array_equal(_images(other.val), _images(data.val))
    assert data.info.mean != other.info.mean


def test_train_limit_keeps_the_first_of_the_shuffled_training_part(root: Path) -> None:
    _write_cifar(root, "cifar10", archive=False)
    whole = load_dataset(_spec(name="cifar10", validation=0.25), data_root=root)
    limited = load_dataset(_spec(name="cifar10", validation=0.25, train_limit=6), data_root=root)
    assert np.array_equal(_images(limited.train), _images(whole.train)[:6])
    assert np.array_equal(_images(limited.val), _images(whole.val))
    _assert_stats(limited, _images(limited.train))


def test_cifar100_reads_fine_labels_and_names(root: Path) -> None:
    _, train_labels, test_rows, test_labels = _write_cifar(root, "cifar100", archive=True)
    data = load_dataset(_spec(name="cifar100", validation=0), data_root=root)
    assert np.array_equal(_images(data.test), test_rows.reshape(-1, 3, 32, 32))
    assert data.test.labels.tolist() == test_labels
    assert sorted(data.train.labels.tolist()) == sorted(train_labels)
    assert data.info.classes[:2] == ("fine00", "fine01")
    assert data.info.num_classes == 100


def test_cifar_reads_a_python2_pickle_like_the_real_release(root: Path) -> None:
    _, _, test_rows, test_labels = _write_cifar(root, "cifar10", archive=False)
    python2 = _python2_pickle(test_rows, test_labels)
    assert pickle.loads(python2, encoding="bytes")[b"labels"] == test_labels  # well formed
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(python2)
    data = load_dataset(_spec(name="cifar10"), data_root=root)
    assert np.array_equal(_images(data.test), test_rows.reshape(-1, 3, 32, 32))
    assert data.test.labels.tolist() == test_labels


def test_labels_outside_the_classes_are_refused(root: Path) -> None:
    _write_cifar(root, "cifar10", archive=False)
    bad = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(_pickle(bad))
    with pytest.raises(ValueError, match=r"'cifar10' has labels outside 0\.\.9"):
        load_dataset(_spec(name="cifar10"), data_root=root)


def test_cifar_pickle_with_code_is_refused(root: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (builtins.eval, ("1",))

    _write_cifar(root, "cifar10", archive=False)
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(_pickle({b"data": Payload()}))
    with pytest.raises(ValueError, match=r"test_batch: refusing to unpickle __builtin__\.eval"):
        load_dataset(_spec(name="cifar10"), data_root=root)


def test_cifar_batch_of_the_wrong_shape_is_a_clear_error(root: Path) -> None:
    _write_cifar(root, "cifar10", archive=False)
    bad = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    (root / "cifar-10-batches-py" / "data_batch_2").write_bytes(_pickle(bad))
    with pytest.raises(ValueError, match=r"data_batch_2 holds data \(2, 100\)"):
        load_dataset(_spec(name="cifar10"), data_root=root)


# --- Missing data and downloads ---------------------------------------------------------


def test_missing_cifar_names_every_place_looked_in(root: Path) -> None:
    with pytest.raises(DatasetNotFound) as caught:
        load_dataset(_spec(name="cifar10"), data_root=root)
    message = str(caught.value)
    for place in (
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
        "cifar10/cifar-10-python.tar.gz",
    ):
        assert str(root / place) in message
    assert "enable downloads" in message
    assert isinstance(caught.value, ValueError)


def test_missing_fashion_mnist_names_the_debian_folder(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    debian = root.parent / "debian"
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", debian)
    with pytest.raises(DatasetNotFound) as caught:
        load_dataset(_spec(name="fashion_mnist"), data_root=root)
    for place in (root / "FashionMNIST/raw", root / "fashion-mnist", debian):
        assert str(place) in str(caught.value)


def test_download_calls_torchvision_then_reads_the_files(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, bool]] = []

    class FakeCifar10:
        def __init__(self, root: str, download: bool) -> None:
            calls.append((root, download))
            _write_cifar(Path(root), "cifar10", archive=True)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCifar10)
    with pytest.raises(DatasetNotFound):
        load_dataset(_spec(name="cifar10"), data_root=root)
    assert calls == []
    data = load_dataset(_spec(name="cifar10", validation=0), data_root=root, download=True)
    assert calls == [(str(root), True)]
    assert len(data.train) == 20
    load_dataset(_spec(name="cifar10"), data_root=root, download=True)
    assert len(calls) == 1  # found on disk now: no second download


def test_failed_download_says_so(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(root: str, download: bool) -> None:
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(DatasetNotFound, match=r"downloading MNIST .* network unreachable"):
        load_dataset(_spec(name="mnist"), data_root=root, download=True)


def test_available_datasets_checks_files_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", root / "absent")
    _write_cifar(root, "cifar10", archive=True)
    _write_mnist(root / "MNIST" / "raw", gz=True)
    found = {entry["name"]: entry for entry in available_datasets(root)}
    assert set(found) == {
        "cifar10", "cifar100", "mnist", "fashion_mnist", "digits", "imagefolder", "synthetic"
    }  # fmt: skip
    assert found["cifar10"]["location"] == str(root / "cifar-10-python.tar.gz")
    assert found["mnist"]["location"] == str(root / "MNIST" / "raw")
    assert not found["cifar100"]["available"]
    assert "cifar-100-python.tar.gz" in found["cifar100"]["needs"]
    assert not found["fashion_mnist"]["available"]
    assert found["digits"]["available"]
    assert not found["digits"]["downloadable"]


# --- IDX: MNIST and Fashion-MNIST -------------------------------------------------------


def _write_idx(path: Path, array: U8, magic: bytes = b"\0\0\x08") -> None:
    """An IDX file of uint8 `array`, gzipped when the name ends in .gz."""
    data = magic + bytes([array.ndim]) + np.array(array.shape, ">u4").tobytes() + array.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def _write_mnist(folder: Path, *, gz: bool) -> tuple[U8, U8, U8, U8]:
    """Four tiny IDX files in `folder`; returns train images, labels, test images, labels."""
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = (
        rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 6, dtype=np.uint8),
        rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 4, dtype=np.uint8),
    )
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    names += ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    for name, array in zip(names, arrays, strict=True):
        _write_idx(folder / (name + (".gz" if gz else "")), array)
    return arrays


@pytest.mark.parametrize(
    ("name", "folder", "gz"),
    [
        ("mnist", "MNIST/raw", True),
        ("mnist", "mnist", False),
        ("fashion_mnist", "FashionMNIST/raw", False),
        ("fashion_mnist", "fashion-mnist", True),
        ("fashion_mnist", "fashion_mnist", False),
    ],
)
def test_idx_layouts_read_exact_pixels_and_labels(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str, folder: str, gz: bool
) -> None:
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", root / "absent")
    train_images, train_labels, test_images, test_labels = _write_mnist(root / folder, gz=gz)
    data = load_dataset(_spec(name=name, validation=0), data_root=root)
    assert np.array_equal(_images(data.test)[:, 0], test_images)
    assert data.test.labels.tolist() == test_labels.tolist()
    # The training part is shuffled by the split: compare image -> label maps.
    loaded = zip(_images(data.train)[:, 0], data.train.labels.tolist(), strict=True)
    written = zip(train_images, train_labels.tolist(), strict=True)
    assert {image.tobytes(): label for image, label in loaded} == {
        image.tobytes(): label for image, label in written
    }
    assert (data.info.channels, data.info.image_size) == (1, (28, 28))
    _assert_stats(data, train_images[:, None])
    expected = ("0", "1") if name == "mnist" else ("T-shirt/top", "Trouser")
    assert data.info.classes[:2] == expected
    assert data.info.num_classes == 10


def test_fashion_mnist_falls_back_to_the_debian_folder(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    debian = root.parent / "usr-share-datasets-fashion-mnist"
    monkeypatch.setattr(idx, "DEBIAN_FASHION_MNIST", debian)
    _, _, test_images, _ = _write_mnist(debian, gz=True)
    data = load_dataset(_spec(name="fashion_mnist"), data_root=root)
    assert np.array_equal(_images(data.test)[:, 0], test_images)
    assert data.info.classes[-1] == "Ankle boot"


def test_read_idx_of_plain_and_gzipped_files_agree(tmp_path: Path) -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a-idx3-ubyte", array)
    _write_idx(tmp_path / "a-idx3-ubyte.gz", array)
    assert np.array_equal(read_idx(tmp_path / "a-idx3-ubyte"), array)
    assert np.array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), array)
    wide = tmp_path / "wide-idx1"
    wide.write_bytes(
        b"\0\0\x0c\x01" + np.array([2], ">u4").tobytes() + np.array([1, -2], ">i4").tobytes()
    )
    assert read_idx(wide).tolist() == [1, -2]  # big-endian int32 read as such


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x08\x03\0\0" + bytes(12), "bad magic number"),
        (b"\0\0\x08\x03\0\0", "truncated inside its header"),
        (b"\0\0\x08\x01" + np.array([5], ">u4").tobytes() + bytes(3), "holds 3 data bytes"),
    ],
)
def test_malformed_idx_is_a_clear_error_naming_the_file(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "broken-idx1-ubyte"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        read_idx(path)
    assert str(path) in str(caught.value)


def test_bad_idx_magic_fails_the_load_naming_the_file(root: Path) -> None:
    _write_mnist(root / "mnist", gz=True)
    bad = root / "mnist" / "t10k-labels-idx1-ubyte.gz"
    _write_idx(bad, np.zeros(4, np.uint8), magic=b"\0\x01\x08")
    with pytest.raises(ValueError, match="bad magic") as caught:
        load_dataset(_spec(name="mnist"), data_root=root)
    assert str(bad) in str(caught.value)


def test_corrupt_gzip_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=f"cannot read IDX file {path}"):
        read_idx(path)


# --- digits and synthetic ---------------------------------------------------------------


def test_digits_are_scaled_and_split_by_seed(tmp_path: Path) -> None:
    data = load_dataset(_spec(name="digits", validation=0.1, split_seed=1), data_root=tmp_path)
    sizes = (len(data.train), len(data.val), len(data.test))
    assert sum(sizes) == 1797
    assert data.info.num_classes == 10
    assert len(data.test) == pytest.approx(0.2 * 1797, abs=10)
    assert len(data.val) == round(0.1 * (1797 - len(data.test)))
    assert (data.info.channels, data.info.image_size) == (1, (8, 8))
    raw = load_digits()
    expected = np.rint(raw.images * 255 / 16).astype(np.uint8)
    everything = np.concatenate([_images(data.train), _images(data.val), _images(data.test)])
    assert sorted(map(bytes, everything[:, 0])) == sorted(map(bytes, expected))
    assert set(everything.flatten().tolist()) <= {round(v * 255 / 16) for v in range(17)}
    # Stratified: every class is in the test split in about its share.
    assert torch.bincount(data.test.labels).min() >= 30
    again = load_dataset(_spec(name="digits", validation=0.1, split_seed=1), data_root=tmp_path)
    other = load_dataset(_spec(name="digits", validation=0.1, split_seed=2), data_root=tmp_path)
    assert np.array_equal(_images(again.test), _images(data.test))
    assert not np.array_equal(_images(other.test), _images(data.test))
    _assert_stats(data, _images(data.train))


def test_synthetic_is_seeded_and_learnable(tmp_path: Path) -> None:
    fields = {"name": "synthetic", "num_classes": 4, "image_size": 8, "channels": 1}
    data = load_dataset(_spec(**fields, train_size=200, test_size=40), data_root=tmp_path)
    assert (len(data.train), len(data.val), len(data.test)) == (180, 20, 40)
    assert _images(data.train).shape[1:] == (1, 8, 8)
    assert data.info.classes == ("class_0", "class_1", "class_2", "class_3")
    again = load_dataset(_spec(**fields, train_size=200, test_size=40), data_root=tmp_path)
    assert np.array_equal(_images(again.test), _images(data.test))
    # Nearest class mean of the training images classifies the test images well.
    train, test = _images(data.train).reshape(180, -1), _images(data.test).reshape(40, -1)
    labels = data.train.labels.numpy()
    means = np.stack([train[labels == c].mean(0) for c in range(4)])
    guesses = ((test[:, None] - means[None]) ** 2).sum(-1).argmin(1)
    assert (guesses == data.test.labels.numpy()).mean() > 0.9


# --- ImageFolder ------------------------------------------------------------------------


def _write_tree(
    folder: Path, classes: tuple[str, ...] = ("cat", "dog", "frog"), *, per_class: int = 4,
    start: int = 0, size: tuple[int, int] = (5, 7), gray: bool = False,
) -> dict[int, tuple[U8, int]]:  # fmt: skip
    """PNGs folder/<class>/<i>.png of height x width `size`; key pixel -> (pixels CHW, label)."""
    rng = np.random.default_rng(start)
    written = {}
    for label, name in enumerate(classes):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            key = start + label * per_class + i
            pixels = rng.integers(0, 256, (1 if gray else 3, *size), dtype=np.uint8)
            pixels[0, 0, 0] = key
            Image.fromarray(pixels[0] if gray else pixels.transpose(1, 2, 0)).save(
                folder / name / f"{i}.png"
            )
            written[key] = (pixels, label)
    return written


def _by_key(split: Split) -> dict[int, tuple[U8, int]]:
    """Loaded images and labels by their key pixel."""
    images = _images(split)
    return {
        int(image[0, 0, 0]): (image, int(label))
        for image, label in zip(images, split.labels, strict=True)
    }


def _assert_read_back(data: LoadedDataset, written: dict[int, tuple[U8, int]]) -> None:
    """Every loaded image and label equals the one written under its key."""
    loaded = {**_by_key(data.train), **_by_key(data.val), **_by_key(data.test)}
    assert loaded.keys() == written.keys()
    for key, (pixels, label) in written.items():
        assert np.array_equal(loaded[key][0], pixels)
        assert loaded[key][1] == label


def test_imagefolder_without_test_tree_splits_each_class_by_seed(root: Path) -> None:
    written = _write_tree(root / "pets", per_class=5)
    (root / "pets" / "cat" / "notes.txt").write_text("not an image")
    data = load_dataset(_spec(name="imagefolder", path="pets", validation=0), data_root=root)
    _assert_read_back(data, written)
    assert data.info.classes == ("cat", "dog", "frog")
    assert (data.info.channels, data.info.image_size) == (3, (5, 7))
    assert torch.bincount(data.test.labels).tolist() == [1, 1, 1]  # 0.2 of 5 per class
    _assert_stats(data, _images(data.train))
    other = load_dataset(
        _spec(name="imagefolder", path="pets", validation=0, split_seed=5), data_root=root
    )
    assert set(_by_key(other.test)) != set(_by_key(data.test))


def test_imagefolder_uses_train_and_test_trees(root: Path) -> None:
    train = _write_tree(root / "set" / "train", ("a", "b"))
    test = _write_tree(root / "set" / "test", ("a", "b"), per_class=2, start=100)
    data = load_dataset(_spec(name="imagefolder", path="set", validation=0.25), data_root=root)
    assert set(_by_key(data.test)) == set(test)
    assert set(_by_key(data.train)) | set(_by_key(data.val)) == set(train)
    assert (len(data.train), len(data.val), data.info.classes) == (6, 2, ("a", "b"))
    _assert_read_back(data, {**train, **test})


def test_a_run_records_its_training_splits_class_counts(root: Path, tmp_path: Path) -> None:
    for start, (name, count) in enumerate({"a": 6, "b": 3, "c": 1}.items()):
        _write_tree(root / "odd" / "train", (name,), per_class=count, start=start * 10, size=(8, 8))
        _write_tree(root / "odd" / "test", (name,), per_class=1, start=100 + start, size=(8, 8))
    run = {
        "model": {"name": "resnet8"},
        "dataset": {"name": "imagefolder", "path": "odd", "validation": 0},
        "recipe": {"iterations": 1, "batch_size": 4, "checkpoint_every": 1},
    }
    spec = TrainSpec.model_validate(run)
    data = load_dataset(spec.dataset, data_root=root)
    assert data.info.class_counts == (6, 3, 1)
    fit(spec, data, RunOptions(out_dir=tmp_path / "run"), RecordingSink())
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step-1.pt", weights_only=True)
    assert saved["data"]["class_counts"] == [6, 3, 1]
    assert DatasetInfo.from_record(saved["data"]) == data.info
    # Validation held out of the training split is not counted in it.
    held = load_dataset(_spec(name="imagefolder", path="odd", validation=0.5), data_root=root)
    assert held.info.class_counts == tuple(torch.bincount(held.train.labels, minlength=3).tolist())
    assert sum(held.info.class_counts or ()) == len(held.train) < 10


def test_a_record_without_class_counts_reads_back_with_none() -> None:
    info = DatasetInfo("old", ("a", "b"), 1, (8, 8), (0.5,), (0.25,), (3, 1))
    record = info.to_record()
    del record["class_counts"]  # as checkpoints written before the counts were recorded
    assert DatasetInfo.from_record(record).class_counts is None
    assert DatasetInfo.from_record(info.to_record()) == info


def test_imagefolder_train_and_val_trees_make_val_the_test_split(root: Path) -> None:
    # ImageNet's layout: the papers report val/ as their test figures.
    train = _write_tree(root / "imnet" / "train", ("a", "b"), per_class=5)
    val = _write_tree(root / "imnet" / "val", ("a", "b"), per_class=2, start=100)
    data = load_dataset(_spec(name="imagefolder", path="imnet", validation=0.2), data_root=root)
    assert data.info.classes == ("a", "b")  # not ("train", "val")
    assert set(_by_key(data.test)) == set(val)
    assert set(_by_key(data.train)) | set(_by_key(data.val)) == set(train)
    assert (len(data.train), len(data.val), len(data.test)) == (8, 2, 4)
    assert data.provenance is not None
    assert data.provenance.splits == {"train": 8, "val": 2, "test": 4}
    _assert_read_back(data, {**train, **val})


def test_imagefolder_train_val_and_test_trees_are_the_three_splits(root: Path) -> None:
    train = _write_tree(root / "s" / "train", ("a", "b"), per_class=3)
    val = _write_tree(root / "s" / "val", ("a", "b"), per_class=2, start=100)
    test = _write_tree(root / "s" / "test", ("a", "b"), per_class=1, start=200)
    data = load_dataset(_spec(name="imagefolder", path="s", validation=0.5), data_root=root)
    assert set(_by_key(data.train)) == set(train)  # nothing held out of train/
    assert set(_by_key(data.val)) == set(val)
    assert set(_by_key(data.test)) == set(test)
    assert data.provenance is not None
    assert data.provenance.splits == {"train": 6, "val": 4, "test": 2}
    files = load_dataset(
        _spec(name="imagefolder", path="s", in_memory=False, train_limit=4), data_root=root
    )
    assert isinstance(files.val, FileSplit)
    assert {path.parent.parent.name for path in files.val.paths} == {"val"}
    assert (len(files.train), len(files.val), len(files.test)) == (4, 4, 2)
    _assert_read_back(data, {**train, **val, **test})


@pytest.mark.parametrize("other", ["val", "test"])
def test_imagefolder_split_classes_must_match_train_naming_the_folder(
    root: Path, other: str
) -> None:
    _write_tree(root / "set" / "train", ("a", "b"))
    _write_tree(root / "set" / "val", ("a", "c") if other == "val" else ("a", "b"), start=50)
    if other == "test":
        _write_tree(root / "set" / "test", ("a",), start=100)
    with pytest.raises(ValueError, match=rf"set/{other} has classes .*; .*set/train has"):
        load_dataset(_spec(name="imagefolder", path="set"), data_root=root)


def test_a_lone_train_folder_is_a_class(root: Path) -> None:
    _write_tree(root / "odd", ("train", "other"))
    data = load_dataset(_spec(name="imagefolder", path="odd"), data_root=root)
    assert data.info.classes == ("other", "train")


def test_imagefolder_test_classes_must_match_train(root: Path) -> None:
    _write_tree(root / "set" / "train", ("a", "b"))
    _write_tree(root / "set" / "test", ("a", "c"))
    with pytest.raises(ValueError, match=r"classes \('a', 'c'\).*\('a', 'b'\)"):
        load_dataset(_spec(name="imagefolder", path="set"), data_root=root)


def test_gray_images_give_one_channel_and_resize_applies(root: Path) -> None:
    written = _write_tree(root / "g", ("x", "y"), gray=True)
    data = load_dataset(_spec(name="imagefolder", path="g", validation=0), data_root=root)
    assert data.info.channels == 1
    assert _images(data.train).shape[1:] == (1, 5, 7)
    _assert_read_back(data, written)
    resized = load_dataset(_spec(name="imagefolder", path="g", image_size=16), data_root=root)
    assert resized.info.image_size == (16, 16)
    assert _images(resized.test).shape[1:] == (1, 16, 16)


def test_photos_of_many_sizes_take_224_pixels_unless_told(root: Path) -> None:
    _write_tree(root / "m", ("x",))
    _write_tree(root / "m", ("y",), size=(9, 9), start=50)
    data = load_dataset(_spec(name="imagefolder", path="m", in_memory=False), data_root=root)
    assert data.info.image_size == (224, 224)
    told = load_dataset(_spec(name="imagefolder", path="m", image_size=8), data_root=root)
    assert told.info.image_size == (8, 8)


def test_photos_are_centre_cropped_never_stretched(root: Path) -> None:
    for name in ("x", "y"):
        (root / "w" / name).mkdir(parents=True)
        wide = np.zeros((10, 30, 3), dtype=np.uint8)
        wide[:, 10:20] = 255  # a white middle third, black sides
        Image.fromarray(wide).save(root / "w" / name / "0.png")
        Image.fromarray(wide).save(root / "w" / name / "1.png")
    spec = _spec(name="imagefolder", path="w", image_size=10, validation=0, test_fraction=0.5)
    images = _images(load_dataset(spec, data_root=root).train)
    assert images.shape[1:] == (3, 10, 10)
    assert int(images.min()) == 255  # only the centre is left: the black sides are cut
    # Resized to a shorter side of 20, the 10-pixel crop is the middle sixth of the width:
    # white too, and the run declares that resize for serving.
    wider = _spec(name="imagefolder", path="w", image_size=10, resize=20, validation=0)
    resized = load_dataset(wider, data_root=root)
    assert int(_images(resized.train).min()) == 255
    assert preprocessing_for(wider, resized.info).resize == 20
    with pytest.raises(ValidationError, match="resize 8 is smaller than image_size 10"):
        _spec(name="imagefolder", path="w", image_size=10, resize=8)


def test_corrupt_png_is_an_error_naming_the_file(root: Path) -> None:
    _write_tree(root / "c", ("x", "y"))
    bad = root / "c" / "y" / "2.png"
    bad.write_bytes(bad.read_bytes()[:60])
    with pytest.raises(ValueError, match="cannot read image") as caught:
        load_dataset(_spec(name="imagefolder", path="c"), data_root=root)
    assert str(bad) in str(caught.value)


def test_file_splits_when_not_in_memory(root: Path) -> None:
    written = _write_tree(root / "f", ("x", "y"), per_class=5)
    data = load_dataset(
        _spec(name="imagefolder", path="f", in_memory=False, validation=0.2), data_root=root
    )
    assert isinstance(data.train, FileSplit)
    assert isinstance(data.test, FileSplit)
    assert (len(data.train), len(data.val), len(data.test)) == (6, 2, 2)
    for path, label in zip(data.train.paths, data.train.labels.tolist(), strict=True):
        assert path.parent.name == ("x", "y")[label]
    pixels = np.stack([written[_key(path)][0] for path in data.train.paths])
    _assert_stats(data, pixels)


def test_large_data_is_read_from_files_by_default(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_tree(root / "f", ("x", "y"), gray=True)
    small = load_dataset(_spec(name="imagefolder", path="f"), data_root=root)
    monkeypatch.setattr(imagefolder, "MAX_IN_MEMORY_BYTES", 8 * 3 * 5 * 7 - 1)
    large = load_dataset(_spec(name="imagefolder", path="f"), data_root=root)
    assert isinstance(small.train, TensorSplit)
    assert isinstance(large.train, FileSplit)
    assert large.info == small.info  # all 8 images sampled: the same statistics, one channel


def _key(path: Path) -> int:
    """The key pixel of a written PNG."""
    return int(np.asarray(Image.open(path))[0, 0, 0])


def test_path_escaping_the_data_root_is_refused(root: Path) -> None:
    _write_tree(root.parent / "outside", ("x", "y"))
    (root / "link").symlink_to(root.parent / "outside")
    with pytest.raises(ValueError, match="outside the data root"):
        load_dataset(_spec(name="imagefolder", path="link"), data_root=root)


def test_missing_imagefolder_path_is_not_found(root: Path) -> None:
    with pytest.raises(DatasetNotFound, match=str(root / "nope.zip")):
        load_dataset(_spec(name="imagefolder", path="nope.zip"), data_root=root)


# --- Archives ---------------------------------------------------------------------------


def _zip_tree(folder: Path, archive: Path, prefix: str = "") -> None:
    """Zip every file below `folder`, named relative to it under `prefix`."""
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(folder.rglob("*")):
            zipped.write(path, prefix + path.relative_to(folder).as_posix())


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "tar"])
def test_archives_unpack_into_a_reused_cache(root: Path, tmp_path: Path, kind: str) -> None:
    written = _write_tree(tmp_path / "tree" / "train", ("a", "b"))
    written |= _write_tree(tmp_path / "tree" / "test", ("a", "b"), start=100)
    archive = root / f"upload.{kind}"
    if kind == "zip":
        _zip_tree(tmp_path / "tree", archive, prefix="mydata/")
        with zipfile.ZipFile(archive, "a") as zipped:  # what macOS's archiver adds
            zipped.writestr("mydata/__MACOSX/._0.png", b"resource fork")
            zipped.writestr("mydata/train/a/readme.txt", b"skip me")
    else:
        with tarfile.open(archive, "w:gz" if kind == "tar.gz" else "w") as tar:
            tar.add(tmp_path / "tree", arcname="mydata")
    data = load_dataset(_spec(name="imagefolder", path=archive.name, validation=0), data_root=root)
    _assert_read_back(data, written)
    (cache,) = (root / ".unpacked").iterdir()
    assert sorted(p.name for p in cache.rglob("*.*")) == sorted([f"{i}.png" for i in range(4)] * 4)
    (cache / "marker").write_text("kept")
    load_dataset(_spec(name="imagefolder", path=archive.name), data_root=root)
    assert (cache / "marker").exists()  # reused, not unpacked again


def _evil_zip(archive: Path, name: str) -> None:
    """A zip with one good image and one entry called `name`."""
    image = images.flat_png((0, 0, 0), size=4)
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("a/good.png", image)
        zipped.writestr(name, image)


def _symlink_tar(archive: Path, name: str) -> None:
    """A tar with a symlink entry called `name` pointing outside."""
    with tarfile.open(archive, "w") as tar:
        _add_bytes(tar, "a/good.png", b"x")
        link = tarfile.TarInfo(name)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)


@pytest.mark.parametrize(
    ("make", "name", "message"),
    [
        (_evil_zip, "../evil.png", r"'\.\./evil\.png' has a '\.\.' component"),
        (_evil_zip, "a/../../evil.png", r"'a/\.\./\.\./evil\.png' has a '\.\.' component"),
        (_evil_zip, "/tmp/evil.png", r"'/tmp/evil\.png' has an absolute path"),
        (_symlink_tar, "a/link.png", r"'a/link\.png' is a link or device"),
    ],
)
def test_unsafe_archives_are_refused_and_write_nothing(
    root: Path, make: Callable[[Path, str], None], name: str, message: str
) -> None:
    archive = root / ("evil.zip" if make is _evil_zip else "evil.tar")
    make(archive, name)
    before = sorted(root.parent.rglob("*"))
    with pytest.raises(ValueError, match=message):
        load_dataset(_spec(name="imagefolder", path=archive.name), data_root=root)
    assert sorted(root.parent.rglob("*")) == before


def test_entry_and_size_bounds_refuse(root: Path, tmp_path: Path) -> None:
    _write_tree(tmp_path / "tree", ("a", "b"))
    archive = root / "many.zip"
    _zip_tree(tmp_path / "tree", archive)
    cache = root / ".unpacked"
    with pytest.raises(ValueError, match="10 entries, more than 5"):
        unpack_archive(archive, cache, max_entries=5)
    with pytest.raises(ValueError, match="more than 100 bytes"):
        unpack_archive(archive, cache, max_bytes=100)
    assert not cache.exists()
    assert len(list(unpack_archive(archive, cache, max_entries=10).rglob("*.png"))) == 8


def test_failure_while_unpacking_leaves_no_partial_cache(root: Path) -> None:
    archive = root / "damaged.zip"
    _evil_zip(archive, "b/second.png")
    raw = archive.read_bytes()
    start = raw.rindex(b"\x89PNG")  # the second image, stored uncompressed
    archive.write_bytes(raw[: start + 20] + bytes(8) + raw[start + 28 :])
    with pytest.raises(ValueError, match=r"cannot unpack archive .*damaged\.zip"):
        unpack_archive(archive, root / ".unpacked")
    assert list((root / ".unpacked").iterdir()) == []
