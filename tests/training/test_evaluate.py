"""Evaluation metrics against hand-computed values."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from training.evaluate import evaluate


class FixedLogits(nn.Module):
    """Returns the batch itself as logits, so the test chooses every prediction."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1)


class ListBatches:
    def __init__(self, batches: list[tuple[Tensor, Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(self.batches[start:])


def test_metrics_match_hand_computation() -> None:
    logits = torch.tensor([[4.0, 0, 0], [0, 4.0, 0], [0, 4.0, 0], [0, 0, 4.0]])
    labels = torch.tensor([0, 1, 2, 2])
    batches = ListBatches(
        [(logits[:2].view(2, 3, 1, 1), labels[:2]), (logits[2:].view(2, 3, 1, 1), labels[2:])]
    )
    result = evaluate(FixedLogits(), batches, num_classes=3)
    assert result.count == 4
    assert result.error == pytest.approx(0.25)
    assert result.top5_error == 0
    assert result.confusion == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    assert result.per_class_accuracy == pytest.approx([1.0, 1.0, 0.5])
    expected_loss = nn.functional.cross_entropy(logits, labels).item()
    assert result.loss == pytest.approx(expected_loss)
    confidence = torch.softmax(logits, 1).max(1).values[0].item()
    # All four share one confidence bin; three of four are right.
    assert result.ece == pytest.approx(abs(confidence - 0.75))


def test_flip_tta_averages_both_views() -> None:
    x = torch.tensor([[[[1.0, 0.0]]]])  # 1 channel, 1x2: logits [1, 0] and flipped [0, 1]
    result = evaluate(FixedLogits(), ListBatches([(x, torch.tensor([0]))]), 2, tta_flip=True)
    assert result.loss == pytest.approx(torch.log(torch.tensor(2.0)).item())


def test_empty_split_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty split"):
        evaluate(FixedLogits(), ListBatches([]), 3)
