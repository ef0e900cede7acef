"""Checkpoints hold tensors and plain values only: a crafted file cannot run
code when loaded, and --resume of a checkpoint not written yet starts fresh."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tether.server.checkpoint import CheckpointError, load_checkpoint
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # creates the marker file when unpickled


def test_pickle_payload_in_a_checkpoint_is_not_executed(tmp_path) -> None:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": "tether-checkpoint-2", "modules": {}, "counters": {}, "evil": _Payload(str(marker))}, path)
    with pytest.raises(CheckpointError, match="not a Tether checkpoint"):
        load_checkpoint(path)
    assert not marker.exists()


def test_checkpoint_round_trip_and_resume_of_a_missing_path(tmp_path, capsys) -> None:
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, auth_token="secret")
    trainer = Trainer(config, build_layout(config))
    trainer.modules["default_policy"].weights_seq_no = 7
    trainer.metrics.agent_steps_received = 123
    trainer.dedup.load_state({"s-1": 4})
    path = trainer.save_checkpoint()
    state = load_checkpoint(path)  # weights_only=True reads what save_checkpoint writes
    assert state["batch_dedup"] == {"s-1": 4} and "auth_token" not in state["config"]

    resumed = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), resume=str(path)), build_layout(config))
    assert resumed.weights_seq_no == 7 and resumed.metrics.agent_steps_received == 123
    assert resumed.dedup.state() == {"s-1": 4}
    # [1.8] A resumed run is the same run (its versions continue): PONG names it alike (§7.2).
    assert resumed.run_id == trainer.run_id and len(trainer.run_id) == 32

    missing = tmp_path / "not-yet" / "checkpoint.pt"
    fresh = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), resume=str(missing)), build_layout(config))
    assert fresh.weights_seq_no == 0
    assert "no checkpoint there yet; starting fresh" in capsys.readouterr().out
    # A new run, in the same log folder or not, is another run: its versions count from 0 again.
    again = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path)), build_layout(config))
    assert len({trainer.run_id, fresh.run_id, again.run_id}) == 3


def test_a_metrics_failure_never_stops_checkpoints(tmp_path, capsys) -> None:
    """A metric named after a lone-surrogate agent id is written escaped, and a TensorBoard
    write that fails anyway is logged while the periodic checkpoint is still written."""
    from collections import deque

    config = ServerConfig(logdir=str(tmp_path), quiet=True, checkpoint_every=1)
    trainer = Trainer(config, build_layout(config))
    trainer.checkpoint_path.unlink()  # the one a new run writes at once
    trainer.metrics.updates = 1
    trainer.metrics.agent_type_returns["\ud800"] = deque([1.0])
    trainer.metrics.agent_type_lengths["\ud800"] = deque([3])

    async def after_update() -> None:
        await trainer.learner_loop._after_update(asyncio.get_running_loop())

    asyncio.run(after_update())
    assert trainer.checkpoint_path.exists() and trainer.metrics.metrics_write_failures == 0

    def failing_write(scalars, step) -> None:
        raise OSError("disk full")

    trainer.checkpoint_path.unlink()
    trainer.tensorboard.write = failing_write
    asyncio.run(after_update())
    assert trainer.checkpoint_path.exists() and trainer.metrics.metrics_write_failures == 1
    assert "writing TensorBoard metrics failed" in capsys.readouterr().err
    asyncio.run(trainer.close(checkpoint=False))


def test_what_the_console_changed_survives_a_resume(tmp_path) -> None:
    """Learning rate and entropy coefficient set from the console are in the checkpoint; a resumed
    run trains with them, not with the configured values."""
    import asyncio

    from tether.server.console.controls import apply_control
    from tether.server.console.state import ConsoleState

    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, lr=1e-3, ent_coef=0.0)
    trainer = Trainer(config, build_layout(config))
    console = ConsoleState(trainer)
    for action, value in (("set_lr", 0.02), ("set_ent_coef", 0.05)):
        asyncio.run(apply_control(console, "tok", {"token": "tok", "action": action, "module": "default_policy",
                                                   "value": value}))
    path = trainer.save_checkpoint()
    resumed = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, lr=1e-3, ent_coef=0.0,
                                   resume=str(path)), build_layout(config))
    learner = resumed.modules["default_policy"].learner
    assert learner.hp.lr == 0.02 and learner.hp.ent_coef == 0.05
    assert learner.lr_now() == 0.02 and learner.ent_coef_now() == 0.05  # (what its next update trains with)


def test_a_resume_after_a_crash_serves_no_version_number_twice(tmp_path) -> None:
    """Versions served after the last checkpoint died with the process (kill -9): the resumed run serves
    its restored weights under the next unused number, so that a client's steps claiming a lost version
    are never checked against (or trained as) other weights under the same number (§13.1)."""
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True)
    trainer = Trainer(config, build_layout(config))
    runtime = trainer.modules["default_policy"]
    runtime.weights_seq_no = 3
    path = trainer.save_checkpoint()
    for _ in range(4):  # v4..v7 served after the checkpoint
        runtime.publish(runtime.onnx_field)
        trainer._record_versions()
    resumed = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), resume=str(path)), build_layout(config))
    assert resumed.weights_seq_no == 8 and resumed.run_id == trainer.run_id
    # Without the file (a run from before it), the checkpoint's number stands; a clean stop loses nothing.
    (tmp_path / "versions.json").unlink()
    assert Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), resume=str(path)),
                   build_layout(config)).weights_seq_no == 3
    runtime.weights_seq_no = 3
    trainer._record_versions()
    assert Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), resume=str(path)),
                   build_layout(config)).weights_seq_no == 3
