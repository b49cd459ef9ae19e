"""The ResNet family of He et al. 2015 and 2016, pure torch, named and built by `models.zoo`."""

from models.config import Architecture, UnitConfig
from models.resnet import ResNet
from models.zoo import (
    MAX_NAME_LENGTH,
    OPTIONS,
    Estimate,
    build,
    describe,
    estimate,
    list_models,
    parse_name,
    resolve,
)

__all__ = [
    "MAX_NAME_LENGTH",
    "OPTIONS",
    "Architecture",
    "Estimate",
    "ResNet",
    "UnitConfig",
    "build",
    "describe",
    "estimate",
    "list_models",
    "parse_name",
    "resolve",
]
