"""Episode stitching across chunks, and atomic checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from sdk_python.protocol import EpisodeChunk
from server.checkpoint import load_checkpoint, save_checkpoint
from server.metrics import EpisodeTracker


def chunk(steps: int, done: bool, episode_id: str | None = None) -> EpisodeChunk:
    return EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64), np.ones(steps, np.float32),
                        None, None, done, False, episode_id)


def test_v1_chunks_without_ids_continue_per_connection() -> None:
    tracker = EpisodeTracker()
    assert tracker.add("a", [chunk(5, True), chunk(3, False)]) == [(5.0, 5)]
    assert tracker.add("b", [chunk(7, True)]) == [(7.0, 7)]  # other connection, own episode
    assert tracker.add("a", [chunk(4, True)]) == [(7.0, 7)]  # 3 + 4 from the open episode


def test_interleaved_episode_ids() -> None:
    tracker = EpisodeTracker()
    assert tracker.add("a", [chunk(2, False, "x"), chunk(3, False, "y")]) == []
    assert tracker.add("a", [chunk(1, True, "y"), chunk(1, True, "x")]) == [(4.0, 4), (3.0, 3)]
    tracker.add("a", [chunk(2, False, "z")])
    tracker.forget("a")
    assert tracker.add("a", [chunk(1, True, "z")]) == [(1.0, 1)]


def test_checkpoint_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"x": torch.ones(2)})

    def broken_save(obj, f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError):
        save_checkpoint(path, {"x": torch.zeros(2)})
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(2))  # the old file is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temp file left behind
