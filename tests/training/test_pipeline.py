"""The input pipeline: crops, flips, normalisation, determinism and resume, file streaming."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from training.data import Batches, DatasetInfo, FileSplit, Split, TensorSplit
from training.pipeline import Augmentation, Shard, make_batches

CPU = torch.device("cpu")


def _info(channels: int = 3, size: int = 8) -> DatasetInfo:
    """Dataset info with uneven per-channel statistics, so a channel mix-up shows."""
    mean = (0.49, 0.48, 0.45)[:channels]
    std = (0.25, 0.24, 0.26)[:channels]
    return DatasetInfo("test", tuple("abcdefghij"), channels, (size, size), mean, std)


def _random_split(n: int, channels: int = 3, size: int = 8, seed: int = 0) -> TensorSplit:
    """Random uint8 images labelled by their index, so a label names its image."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(
        0, 256, (n, channels, size, size), dtype=torch.uint8, generator=generator
    )
    return TensorSplit(images, torch.arange(n))


def _batches(
    split: Split,
    info: DatasetInfo,
    *,
    batch_size: int = 16,
    augment: bool | Augmentation | None = True,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    channels_last: bool = False,
    num_workers: int = 0,
    shard: Shard | None = None,
) -> Batches:
    """make_batches on the CPU with the training settings (and no workers) by default."""
    return make_batches(
        split,
        info,
        batch_size=batch_size,
        device=CPU,
        augment=augment,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
        num_workers=num_workers,
        channels_last=channels_last,
        shard=shard,
    )


def _collect(batches: Batches, epoch: int = 0, start: int = 0) -> tuple[Tensor, Tensor]:
    """All images and labels from batch `start` of `epoch` on, concatenated."""
    xs, ys = zip(*batches.epoch(epoch, start), strict=True)
    return torch.cat(xs), torch.cat(ys)


def _pixels(x: Tensor, info: DatasetInfo) -> Tensor:
    """Undo the normalisation: uint8 pixels back from normalised floats."""
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    return ((x * std + mean) * 255).round().to(torch.uint8)


def _all_crops(images: Tensor, pad: int) -> Tensor:
    """(N, K, C, H, W): every crop of the zero-padded images, unflipped ones first."""
    height, width = images.shape[-2:]
    padded = F.pad(images, (pad, pad, pad, pad))
    span = range(2 * pad + 1)
    crops = [padded[..., dy : dy + height, dx : dx + width] for dy in span for dx in span]
    stacked = torch.stack(crops, dim=1)
    return torch.cat([stacked, stacked.flip(-1)], dim=1)


def _coordinate_split(n: int, size: int = 8) -> TensorSplit:
    """Channel 0 encodes each pixel's position (never 0), channel 1 the image's index."""
    position = 1 + torch.arange(size * size, dtype=torch.uint8).view(size, size)
    index = (1 + torch.arange(n) % 255).to(torch.uint8).view(n, 1, 1)
    images = torch.stack([position.expand(n, size, size), index.expand(n, size, size)], dim=1)
    return TensorSplit(images.contiguous(), torch.arange(n))


@pytest.mark.parametrize("flip", [True, False])
def test_crops_are_windows_of_the_zero_padded_image(flip: bool) -> None:
    pad, n = 4, 2000
    split, info = _coordinate_split(n), _info(channels=2)
    augment = Augmentation(pad=pad, flip=flip)
    x, y = _collect(_batches(split, info, batch_size=256, augment=augment))
    assert sorted(y.tolist()) == list(range(n))
    # Each output must be exactly one crop (or flipped crop) of its own labelled image.
    candidates = _all_crops(split.images, pad)[y]
    matches = (_pixels(x, info)[:, None] == candidates).flatten(2).all(-1)
    assert matches.sum(1).eq(1).all()
    chosen = matches.int().argmax(1)
    offsets = (2 * pad + 1) ** 2
    assert set((chosen % offsets).tolist()) == set(range(offsets))
    flipped = (chosen >= offsets).float().mean().item()
    assert 0.4 <= flipped <= 0.6 if flip else flipped == 0


def test_no_padding_and_no_flip_is_evaluation() -> None:
    split, info = _random_split(50), _info()
    plain = _collect(_batches(split, info, augment=Augmentation(pad=0, flip=False)))
    evaluation = _collect(_batches(split, info, augment=False))
    assert torch.equal(plain[0], evaluation[0])
    assert torch.equal(plain[1], evaluation[1])


def test_evaluation_is_the_normalised_input_in_order() -> None:
    split, info = _random_split(50), _info()
    x, y = _collect(_batches(split, info, augment=False, shuffle=False))
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    expected = (split.images.float() / 255 - mean) / std
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-5)
    assert torch.equal(y, split.labels)


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalisation_inverts_to_the_uint8_input(channels_last: bool) -> None:
    split, info = _random_split(50), _info()
    batches = _batches(split, info, augment=None, channels_last=channels_last)
    x, y = _collect(batches)
    assert not torch.equal(y, split.labels)  # shuffled
    assert torch.equal(_pixels(x, info), split.images[y])
    first, _ = next(iter(batches.epoch(0)))
    assert first.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert first.is_contiguous() != channels_last


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    split, info = _random_split(100), _info()
    first = _collect(_batches(split, info, seed=3))
    again = _collect(_batches(split, info, seed=3))
    other = _collect(_batches(split, info, seed=4))
    assert torch.equal(first[0], again[0])
    assert torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])
    assert not torch.equal(first[0][first[1].argsort()], other[0][other[1].argsort()])


def test_epochs_differ_in_order_and_augmentation() -> None:
    split, info = _random_split(100), _info()
    batches = _batches(split, info)
    (x0, y0), (x1, y1) = _collect(batches, epoch=0), _collect(batches, epoch=1)
    assert not torch.equal(y0, y1)
    assert not torch.equal(x0[y0.argsort()], x1[y1.argsort()])


@pytest.mark.parametrize("augment", [True, False])
@pytest.mark.parametrize("start", [1, 4, 7])
def test_resume_yields_the_tail_of_the_epoch(augment: bool, start: int) -> None:
    split, info = _random_split(100), _info()
    full = list(_batches(split, info, augment=augment).epoch(5))
    resumed = list(_batches(split, info, augment=augment).epoch(5, start=start))
    assert len(resumed) == len(full) - start
    for (x, y), (rx, ry) in zip(full[start:], resumed, strict=True):
        assert torch.equal(x, rx)
        assert torch.equal(y, ry)


@pytest.mark.parametrize(("drop_last", "batches", "last"), [(False, 7, 4), (True, 6, 16)])
def test_length_with_and_without_drop_last(drop_last: bool, batches: int, last: int) -> None:
    pipeline = _batches(_random_split(100), _info(), drop_last=drop_last)
    sizes = [len(y) for _, y in pipeline.epoch(0)]
    assert len(pipeline) == len(sizes) == batches
    assert sizes[-1] == last
    assert set(sizes[:-1]) == {16}


def test_start_outside_the_epoch_is_refused() -> None:
    pipeline = _batches(_random_split(100), _info())
    assert list(pipeline.epoch(0, start=len(pipeline))) == []
    with pytest.raises(ValueError, match="start batch"):
        next(iter(pipeline.epoch(0, start=len(pipeline) + 1)))


def test_an_empty_split_has_no_batches() -> None:
    pipeline = _batches(_random_split(0), _info())
    assert len(pipeline) == 0
    assert list(pipeline.epoch(0)) == []


def test_bad_settings_are_refused() -> None:
    split, info = _random_split(10), _info()
    with pytest.raises(ValueError, match="pad"):
        Augmentation(pad=-1)
    with pytest.raises(ValueError, match="batch_size"):
        _batches(split, info, batch_size=0)
    with pytest.raises(ValueError, match="per channel"):
        _batches(split, DatasetInfo("rgb", ("a",), 3, (8, 8), (0.5,), (0.2,)))


@pytest.mark.gpu
def test_cuda_yields_the_cpu_batches() -> None:
    split, info = _random_split(100), _info()
    on_cpu = _collect(_batches(split, info))
    cuda = make_batches(
        split,
        info,
        batch_size=16,
        device=torch.device("cuda"),
        augment=True,
        shuffle=True,
        drop_last=False,
        seed=0,
    )
    on_cuda = _collect(cuda)
    assert on_cuda[0].device.type == "cuda"
    torch.testing.assert_close(on_cuda[0].cpu(), on_cpu[0], rtol=0, atol=1e-6)
    assert torch.equal(on_cuda[1].cpu(), on_cpu[1])


def _file_split(tmp_path: Path, split: TensorSplit) -> FileSplit:
    """Write each image of `split` as a PNG and return the same split as files."""
    paths = []
    for index, image in enumerate(split.images):
        path = tmp_path / f"{index:02d}.png"
        Image.fromarray(image.permute(1, 2, 0).squeeze(2).numpy()).save(path)
        paths.append(path)
    return FileSplit(tuple(paths), split.labels)


def test_file_evaluation_yields_the_files_normalised_pixels(tmp_path: Path) -> None:
    split, info = _random_split(20), _info()
    files = _file_split(tmp_path, split)
    x, y = _collect(_batches(files, info, batch_size=8, augment=False, shuffle=False))
    in_memory = _collect(_batches(split, info, batch_size=8, augment=False, shuffle=False))
    assert x.shape == (20, 3, 8, 8)
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert torch.equal(x, in_memory[0])
    assert torch.equal(y, split.labels)


def test_file_training_batches_are_seeded_and_resumable(tmp_path: Path) -> None:
    split, info = _random_split(20), _info()
    files = _file_split(tmp_path, split)
    state = torch.random.get_rng_state()
    full = list(_batches(files, info, batch_size=8).epoch(2))
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    resumed = list(_batches(files, info, batch_size=8).epoch(2, start=1))
    assert [len(y) for _, y in full] == [8, 8, 4]
    for (x, y), (rx, ry) in zip(full[1:], resumed, strict=True):
        assert torch.equal(x, rx)
        assert torch.equal(y, ry)
    x, y = torch.cat([b[0] for b in full]), torch.cat([b[1] for b in full])
    assert sorted(y.tolist()) == list(range(20))
    # Each output is a crop of its own padded, maybe flipped, file, at varying offsets.
    matches = (_pixels(x, info)[:, None] == _all_crops(split.images, 4)[y]).flatten(2).all(-1)
    assert matches.any(1).all()
    chosen = matches.int().argmax(1)
    assert len(set((chosen % 81).tolist())) > 1
    assert 0 < (chosen >= 81).sum() < 20


def test_file_batches_do_not_depend_on_the_worker_count(tmp_path: Path) -> None:
    split, info = _random_split(20), _info()
    files = _file_split(tmp_path, split)
    in_process = _batches(files, info, batch_size=8)
    workers = _batches(files, info, batch_size=8, num_workers=2)
    passes = []
    for epoch in (0, 1):  # the second pass reuses the persistent workers
        expected, got = _collect(in_process, epoch), _collect(workers, epoch)
        assert torch.equal(expected[0], got[0])
        assert torch.equal(expected[1], got[1])
        passes.append(got[0][got[1].argsort()])
    assert not torch.equal(*passes)  # each epoch draws its own crops and flips


def test_file_images_are_resized_to_the_dataset_size(tmp_path: Path) -> None:
    files = _file_split(tmp_path, _random_split(4, channels=1, size=12))
    x, _ = _collect(_batches(files, _info(channels=1, size=8), batch_size=4))
    assert x.shape == (4, 1, 8, 8)


@pytest.mark.parametrize("in_memory", [True, False])
def test_the_ranks_parts_of_each_batch_make_up_the_batch(tmp_path: Path, in_memory: bool) -> None:
    info, tensors = _info(), _random_split(20)
    split: Split = tensors if in_memory else _file_split(tmp_path, tensors)
    whole = list(_batches(split, info, batch_size=8).epoch(1, start=1))
    parts = [
        list(_batches(split, info, batch_size=8, shard=Shard(r, 2)).epoch(1, 1)) for r in (0, 1)
    ]
    assert [len(y) for _, y in parts[0]] == [4, 2]  # the short last batch 4 splits 2 + 2
    for (x, y), (x0, y0), (x1, y1) in zip(whole, *parts, strict=True):
        assert torch.equal(torch.cat([x0, x1]), x)
        assert torch.equal(torch.cat([y0, y1]), y)


def test_a_shard_outside_the_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        Shard(2, 2)
