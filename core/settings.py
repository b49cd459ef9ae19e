"""One validated settings object, read from the environment (and `.env`) once."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of the service; the README has the table."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("var/data"), description="Where datasets are looked up.")
    artifact_dir: Path = Field(Path("var/artifacts"), description="Checkpoints and run files.")
    allow_downloads: bool = Field(
        False, description="Let torchvision download CIFAR/MNIST into DATA_DIR when missing."
    )


@lru_cache
def get_settings() -> Settings:
    """The process's settings, validated on first use."""
    return Settings()
