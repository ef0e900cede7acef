"""Checkpoints: written atomically (temp file, fsync, rename) so a crash never
leaves a half-written file where a good one was."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` with torch.save to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


class CheckpointError(ValueError):
    """A checkpoint file could not be read as tensors and plain values."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``: tensors and plain values
    only (``weights_only=True``), so a crafted file cannot run code when loaded."""
    try:
        return torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        if isinstance(exc, OSError):
            raise
        raise CheckpointError(f"{path} is not a Tether checkpoint of tensors and plain values: {exc}") from None
