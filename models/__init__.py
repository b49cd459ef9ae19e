"""The ResNet family of He et al. 2015 and 2016, pure torch, named and built by `models.zoo`."""

from models.config import Architecture, UnitConfig
from models.resnet import ResNet
from models.zoo import build, describe, list_models, parse_name, resolve

__all__ = [
    "Architecture",
    "ResNet",
    "UnitConfig",
    "build",
    "describe",
    "list_models",
    "parse_name",
    "resolve",
]
