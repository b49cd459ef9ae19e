"""The ResNet family of He et al. 2015 and 2016, pure torch, behind one registry."""

from models.config import Architecture, UnitConfig
from models.registry import build, describe, list_models, parse_name, resolve
from models.resnet import ResNet

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
