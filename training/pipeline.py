"""The input pipeline: a split becomes `Batches` of normalised images on the device.

In-memory splits (`TensorSplit`) live on the device as uint8 and are cropped, flipped and
normalised there a whole batch at a time, as airbench does. File splits (`FileSplit`)
stream through DataLoader workers that decode and augment one image at a time. Every
random choice is a function of (seed, epoch, batch) or (seed, epoch, image), so
`epoch(e, start=k)` yields exactly the batches k.. of `epoch(e)` without computing the
earlier ones.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision.ops import roi_align
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from training.data import Batches, DatasetInfo, FileSplit, Split, TensorSplit
from training.datasets.images import normalised, open_image
from training.preprocess import Preprocessing
from training.specs import AugmentationRecipe

# torchvision's RandomResizedCrop defaults: area fraction and aspect ratio of the crop.
RRC_SCALE, RRC_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
# 2015 Sec. 3.4: the shorter side resized at random in [256, 480] for 224x224 crops.
SCALE_RANGE = (256 / 224, 480 / 224)
# AlexNet's PCA colour augmentation: ImageNet's RGB eigenvalues and eigenvectors (on [0, 1]),
# as fb.resnet.torch, the 2016 paper's code, applies them.
PCA_EIGVAL = (0.2175, 0.0188, 0.0045)
PCA_EIGVEC = (
    (-0.5675, 0.7192, 0.4009),
    (-0.5808, -0.0045, -0.8140),
    (-0.5836, -0.6948, 0.4203),
)


@dataclass(frozen=True)
class Augmentation:
    """How training images vary, by a named recipe, each with optional flips.

    `cifar`: zero-pad `pad` pixels a side and crop back to size at random (2015 Sec. 4.2).
    `imagenet_scale`: resize the shorter side at random in [256, 480] (scaled to the input
    size) and take a random crop (2015 Sec. 3.4), with `lighting` PCA colour noise.
    `random_resized_crop`: torchvision's RandomResizedCrop (area 8-100%, aspect 3/4-4/3).
    """

    pad: int = 4
    flip: bool = True
    recipe: AugmentationRecipe = "cifar"
    lighting: float = 0.0

    def __post_init__(self) -> None:
        if self.pad < 0:
            raise ValueError(f"augmentation pad must be >= 0, got {self.pad}")
        if self.lighting and self.recipe != "imagenet_scale":
            raise ValueError("PCA lighting is part of the imagenet_scale recipe only")


def make_batches(
    split: Split,
    info: DatasetInfo,
    *,
    batch_size: int,
    device: torch.device,
    augment: bool | Augmentation | None,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    num_workers: int | None = None,
    channels_last: bool = False,
    shard: Shard | None = None,
    preprocessing: Preprocessing | None = None,
) -> Batches:
    """Batches of `split` on `device`: held there if in memory, streamed from its files if not.

    With a `shard`, each batch is that rank's part of the global batch of `batch_size`. Files
    become input through `preprocessing` (default: the data's own, `Preprocessing.of`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not len(info.mean) == len(info.std) == info.channels:
        raise ValueError(f"{info.name}: mean and std need one value per channel")
    schedule = _Schedule(len(split), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    normalise = Normalise(info, device, channels_last=channels_last)
    augmentation = Augmentation() if augment is True else augment or None
    shard = shard or Shard(0, 1)
    if isinstance(split, TensorSplit):
        return _TensorBatches(split, schedule, normalise, augmentation, shard)
    preprocessing = preprocessing or Preprocessing.of(info)
    workers = loader_workers(device) if num_workers is None else num_workers
    return _FileBatches(split, preprocessing, schedule, normalise, augmentation, workers, shard)


def loader_workers(device: torch.device) -> int:
    """DataLoader workers that decode a file split: on a GPU as many as the host's cores
    allow (up to 8: photos decode at a few hundred a second a core, a GPU trains thousands);
    on the CPU 2, which leave the cores to the net's step."""
    if device.type == "cuda":
        return max(2, min(8, (os.cpu_count() or 2) - 1))
    return 2


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `ranks` takes its contiguous part of every global batch."""

    rank: int
    ranks: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.ranks:
            raise ValueError(f"rank must be in [0, {self.ranks}), got {self.rank}")

    def of(self, batch: Tensor, dim: int = 0) -> Tensor:
        """This rank's part of `batch` along `dim` (parts differ in size by at most one)."""
        if self.ranks == 1:
            return batch
        return torch.tensor_split(batch, self.ranks, dim=dim)[self.rank]


def seed_of(*parts: int) -> int:
    """A 63-bit seed from integers; neighbouring tuples give unrelated random streams."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from `parts`, so draws are identical on every device."""
    return torch.Generator().manual_seed(seed_of(*parts))


@dataclass(frozen=True)
class _Schedule:
    """Which images each batch of an epoch holds."""

    size: int
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int

    def __len__(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return full + int(rest > 0 and not self.drop_last)

    def order(self, epoch: int) -> Tensor:
        """The epoch's image indices (CPU, int64): a permutation seeded by (seed, epoch)."""
        if not self.shuffle:
            return torch.arange(self.size)
        return torch.randperm(self.size, generator=_generator(self.seed, epoch))

    def check_start(self, start: int) -> None:
        """Refuse a start batch outside the epoch."""
        if not 0 <= start <= len(self):
            raise ValueError(f"start batch must be in [0, {len(self)}], got {start}")


class Normalise:
    """uint8 images to float32 minus the mean over the std, on the [0, 1] scale."""

    def __init__(
        self, info: DatasetInfo | Preprocessing, device: torch.device, *, channels_last: bool
    ) -> None:
        mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
        std = torch.tensor(info.std, device=device).view(1, -1, 1, 1)
        # x / 255 / std - mean / std as one multiply and one add over the batch.
        self.scale = 1 / (255 * std)
        self.shift = -mean / std
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: Tensor) -> Tensor:
        """The normalised float32 batch, in the configured memory format."""
        x = images.to(torch.float32).mul_(self.scale).add_(self.shift)
        # Reordering the floats last is 3x faster on CPU than converting into channels_last.
        return x.contiguous(memory_format=self.memory_format)


class _TensorBatches:
    """An in-memory split held on the device as uint8, augmented there a batch at a time."""

    def __init__(
        self,
        split: TensorSplit,
        schedule: _Schedule,
        normalise: Normalise,
        augmentation: Augmentation | None,
        shard: Shard,
    ) -> None:
        self._schedule = schedule
        self._normalise = normalise
        self._augmentation = augmentation
        self._shard = shard
        self._images = split.images.to(normalise.device)  # the one copy to the device
        self._labels = split.labels.to(normalise.device)
        # An empty split has no pixels to take crops from, and no batches that need them.
        pad = augmentation.pad if augmentation and augmentation.recipe == "cifar" else None
        self._crops = _RandomCrops(self._images, pad) if pad is not None and len(split) else None
        self._boxes = augmentation is not None and pad is None
        self._flip = augmentation is not None and augmentation.flip

    def __len__(self) -> int:
        return len(self._schedule)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches `start`.. of epoch `epoch`: normalised images and labels on the device."""
        self._schedule.check_start(start)
        # One copy per epoch of the order and the draws: batches never wait on the host.
        plan = self._plan(epoch, start).to(self._normalise.device)
        size = self._schedule.batch_size
        for first in range(0, plan.shape[1], size):
            # The whole global batch is planned on every rank (the same draws), so the
            # ranks' parts together are exactly the batch one process would train on.
            batch = self._shard.of(plan[:, first : first + size], dim=1)
            yield self._normalise(self._images_of(batch)), self._labels[batch[0].long()]

    def _plan(self, epoch: int, start: int) -> Tensor:
        """Rows index, and the draws when augmenting, for each image of batches `start`..:
        dy, dx, flip (cifar), or a box x1, y1, x2, y2, flip and lighting (the others)."""
        size = self._schedule.batch_size
        index = self._schedule.order(epoch)[start * size : len(self) * size]
        augmentation = self._augmentation
        if augmentation is None:
            return index[None]
        seed = self._schedule.seed
        if self._boxes:
            height, width = self._images.shape[2:]
            boxes = [
                _draw_boxes(seed, epoch, batch, size, augmentation, (height, width))
                for batch in range(start, len(self))
            ]
            rows = torch.cat([torch.empty(8, 0, dtype=torch.float64), *boxes], dim=1)
            return torch.cat([index[None].double(), rows[:, : len(index)]])
        draws = [
            _draw(seed, epoch, batch, augmentation.pad, size) for batch in range(start, len(self))
        ]
        # The empty head lets a start at the epoch's end through; a short last batch takes
        # the first of its draws.
        row = torch.cat([torch.empty(3, 0, dtype=torch.int64), *draws], dim=1)
        return torch.cat([index[None], row[:, : len(index)]])

    def _images_of(self, batch: Tensor) -> Tensor:
        """The images of one plan slice, cropped and flipped when augmenting (uint8, or
        float on the 0-255 scale for the resized crops)."""
        if self._boxes:
            return _boxed(self._images, batch)
        if self._crops is None:
            return self._images[batch[0]]
        index, dy, dx, flip = batch
        crops = self._crops(index, dy, dx)
        if not self._flip:
            return crops
        # Picking each image or its mirror from the pair by index copies whole images:
        # 4x faster on CPU than torch.where over pixels.
        pairs = torch.cat([crops, crops.flip(3)])
        return pairs.index_select(0, torch.arange(len(flip), device=flip.device) + len(flip) * flip)


def _boxed(images: Tensor, batch: Tensor) -> Tensor:
    """Each image's box resized to the input size (bilinear, `roi_align`: one batched call on
    the device), mirrored where drawn, with its colour noise; float on the 0-255 scale."""
    index = batch[0].long()
    height, width = images.shape[2:]
    chosen = images.index_select(0, index).float()
    rows = torch.arange(len(index), device=images.device, dtype=torch.float32)[:, None]
    boxes = torch.cat([rows, batch[1:5].T.float()], dim=1)
    # A box is never larger than its image, which is the input's size: every crop is an
    # enlargement, so one bilinear sample per output pixel is exact bilinear resizing.
    crops = roi_align(
        chosen, boxes, (height, width), spatial_scale=1.0, sampling_ratio=1, aligned=True
    )
    crops = torch.where(batch[5].bool()[:, None, None, None], crops.flip(3), crops)
    if crops.shape[1] == 3 and bool(batch[6:9].any()):
        crops = crops + _lighting(batch[6:9].T.float())[:, :, None, None]
    return crops


def _lighting(alphas: Tensor) -> Tensor:
    """The RGB shift (N, 3) on the 0-255 scale of PCA colour noise with weights `alphas`."""
    eigval = torch.tensor(PCA_EIGVAL, device=alphas.device)
    eigvec = torch.tensor(PCA_EIGVEC, device=alphas.device)
    return (alphas * eigval) @ eigvec.T * 255


def _draw_boxes(
    seed: int, epoch: int, batch: int, size: int, augmentation: Augmentation, shape: tuple[int, int]
) -> Tensor:
    """Rows x1, y1, x2, y2, flip and three lighting weights (8, size) of one batch's crops of
    images of `shape` (height, width), seeded by (seed, epoch, batch)."""
    generator = _generator(seed, epoch, batch)
    height, width = shape
    if augmentation.recipe == "imagenet_scale":
        # The shorter side scaled by u in [256/224, 480/224], then an input-sized crop: in
        # the stored image's pixels, a box of 1/u of its sides.
        low, high = SCALE_RANGE
        u = low + (high - low) * torch.rand(size, generator=generator, dtype=torch.float64)
        box_w, box_h = width / u, height / u
    else:
        box_w, box_h = _rrc_sides(generator, size, height, width)
    x1 = torch.rand(size, generator=generator, dtype=torch.float64) * (width - box_w)
    y1 = torch.rand(size, generator=generator, dtype=torch.float64) * (height - box_h)
    flip = torch.randint(2, (size,), generator=generator).double() * augmentation.flip
    light = torch.randn(3, size, generator=generator, dtype=torch.float64) * augmentation.lighting
    return torch.stack([x1, y1, x1 + box_w, y1 + box_h, flip, *light])


def _rrc_sides(
    generator: torch.Generator, size: int, height: int, width: int, tries: int = 10
) -> tuple[Tensor, Tensor]:
    """RandomResizedCrop's box sides, as torchvision draws them: up to `tries` (area, aspect)
    draws an image, the first that fits, else the whole image."""
    low, high = RRC_SCALE
    area = (
        height
        * width
        * (low + (high - low) * torch.rand(tries, size, generator=generator, dtype=torch.float64))
    )
    log_low, log_high = math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1])
    ratio = torch.exp(
        log_low
        + (log_high - log_low) * torch.rand(tries, size, generator=generator, dtype=torch.float64)
    )
    w, h = (area * ratio).sqrt(), (area / ratio).sqrt()
    fits = (w <= width) & (h <= height)
    first = fits.double().argmax(0)  # the first try that fits (0 when none does)
    any_fits = fits.any(0)
    pick_w, pick_h = w.gather(0, first[None])[0], h.gather(0, first[None])[0]
    full_w = torch.full((size,), float(width), dtype=torch.float64)
    full_h = torch.full((size,), float(height), dtype=torch.float64)
    return torch.where(any_fits, pick_w, full_w), torch.where(any_fits, pick_h, full_h)


class _RandomCrops:
    """Crops of zero-padded images at given offsets, gathered a batch at a time."""

    def __init__(self, images: Tensor, pad: int) -> None:
        _, channels, height, width = images.shape
        padded = F.pad(images, (pad, pad, pad, pad))  # once, not per batch
        # Every run of `width` pixels of the padded images, one per row of this view: a
        # crop is channels x height such runs, so one index_select copies a batch run by
        # run (1.6x faster on CPU than pixel-wise indexing of an unfold view of all crops).
        self._runs = padded.view(-1).unfold(0, width, 1)
        self._image_stride, channel_stride, self._row_stride, _ = padded.stride()
        channel_starts = torch.arange(channels, device=images.device) * channel_stride
        row_starts = torch.arange(height, device=images.device) * self._row_stride
        self._run_starts = channel_starts[:, None] + row_starts  # (C, H), from a crop's corner
        self._shape = (channels, height, width)

    def __call__(self, index: Tensor, dy: Tensor, dx: Tensor) -> Tensor:
        """Crops (B, C, H, W) of images `index` whose corner is padded row dy, column dx."""
        corners = index * self._image_stride + dy * self._row_stride + dx
        runs = self._runs.index_select(0, (corners[:, None, None] + self._run_starts).view(-1))
        return runs.view(-1, *self._shape)


def _draw(seed: int, epoch: int, batch: int, pad: int, size: int) -> Tensor:
    """Rows dy, dx, flip (3, size) of one batch, seeded by (seed, epoch, batch)."""
    generator = _generator(seed, epoch, batch)
    offsets = torch.randint(2 * pad + 1, (2, size), generator=generator)
    return torch.cat([offsets, torch.randint(2, (1, size), generator=generator)])


class _FileBatches:
    """A file split streamed by DataLoader workers that decode and augment one image each."""

    def __init__(
        self,
        split: FileSplit,
        preprocessing: Preprocessing,
        schedule: _Schedule,
        normalise: Normalise,
        augmentation: Augmentation | None,
        num_workers: int,
        shard: Shard,
    ) -> None:
        self._schedule = schedule
        # The colour noise of a batch of three-channel images, added on the device.
        self._lighting = (
            bool(augmentation and augmentation.lighting) and preprocessing.channels == 3
        )
        self._normalise = normalise
        self._shard = shard
        self._sampler = _EpochSampler(schedule)
        self._loader = DataLoader(
            _FileDataset(split, preprocessing, augmentation, seed=schedule.seed),
            batch_size=schedule.batch_size,
            sampler=self._sampler,
            drop_last=schedule.drop_last,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=normalise.device.type == "cuda",
            # Its own generator (whose draws nothing uses), so a pass leaves the global one alone.
            generator=torch.Generator(),
        )

    def __len__(self) -> int:
        return len(self._schedule)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches `start`.. of epoch `epoch`: normalised images and labels on the device."""
        self._schedule.check_start(start)
        self._sampler.set_epoch(epoch, first=start * self._schedule.batch_size)
        device = self._normalise.device
        for images, labels, lighting in self._loader:
            # Every rank decodes the whole global batch and keeps its part: simple and
            # exact, at N times the decoding work (a sharded sampler would avoid it).
            images, labels = self._shard.of(images), self._shard.of(labels)
            # uint8 crosses to the device (a quarter of float32's bytes) and is normalised
            # there, exactly as in-memory splits are.
            images = images.to(device, non_blocking=True)
            if self._lighting:
                shift = _lighting(self._shard.of(lighting).to(device))
                images = images.float() + shift[:, :, None, None]
            yield self._normalise(images), labels.to(device, non_blocking=True)


class _EpochSampler(Sampler[tuple[int, int]]):
    """Keys (epoch, index) of one epoch's order from its image `first` on."""

    def __init__(self, schedule: _Schedule) -> None:
        self._schedule = schedule
        self._epoch = self._first = 0

    def set_epoch(self, epoch: int, *, first: int) -> None:
        """Make the next pass yield epoch `epoch` from its image `first` on."""
        self._epoch, self._first = epoch, first

    def __len__(self) -> int:
        return max(self._schedule.size - self._first, 0)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = self._schedule.order(self._epoch)[self._first :]
        return iter([(self._epoch, index) for index in order.tolist()])


class _FileDataset(Dataset[tuple[Tensor, int, Tensor]]):
    """Decodes one image file per key (epoch, index) and makes it input as uint8: by the
    declared preprocessing (then the cifar crops), or by a resizing recipe from the image
    as decoded; with the image's three PCA lighting weights (zeros without lighting)."""

    def __init__(
        self,
        split: FileSplit,
        preprocessing: Preprocessing,
        augmentation: Augmentation | None,
        *,
        seed: int,
    ) -> None:
        self._paths = split.paths
        self._labels: list[int] = split.labels.tolist()
        self._preprocessing = preprocessing
        self._resizes = augmentation is not None and augmentation.recipe != "cifar"
        self._lighting = augmentation.lighting if augmentation is not None else 0.0
        self._transform = _file_transform(preprocessing.crop, augmentation)
        self._seed = seed

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor, int, Tensor]:
        epoch, index = key
        # Decoded by Pillow as every other path decodes (torchvision.io's decoders are
        # deprecated since torchvision 0.29), with errors naming the file.
        with open_image(self._paths[index]) as opened:
            if self._resizes:
                channels = self._preprocessing.channels
                image = TF.pil_to_tensor(normalised(opened, channels))
            else:
                image = torch.from_numpy(self._preprocessing.image(opened))
        # Seeding each image by (seed, epoch, index) makes a batch independent of the worker
        # count and resumable mid-epoch; fork_rng leaves the caller's global generator alone
        # when there are no workers.
        with torch.random.fork_rng(devices=()):
            torch.manual_seed(seed_of(self._seed, epoch, index))
            lighting = torch.randn(3) * self._lighting
            return self._transform(image), self._labels[index], lighting


def _file_transform(size: tuple[int, int], augmentation: Augmentation | None) -> v2.Compose:
    """A decoded uint8 image's training augmentation, by its recipe; nothing when evaluating."""
    if augmentation is None:
        return v2.Compose([v2.Identity()])
    crop = list(size)
    steps: list[v2.Transform]
    if augmentation.recipe == "random_resized_crop":
        steps = [v2.RandomResizedCrop(crop, scale=RRC_SCALE, ratio=RRC_RATIO, antialias=True)]
    elif augmentation.recipe == "imagenet_scale":
        low, high = (round(min(size) * factor) for factor in SCALE_RANGE)
        steps = [
            v2.RandomShortestSize(list(range(low, high + 1)), antialias=True),
            v2.RandomCrop(crop, pad_if_needed=True),
        ]
    else:
        steps = [v2.Pad(augmentation.pad), v2.RandomCrop(crop)]
    if augmentation.flip:
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps)
