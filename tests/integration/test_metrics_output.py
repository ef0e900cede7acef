"""A run leaves TensorBoard scalars, a progress line and periodic checkpoints."""

from __future__ import annotations

import subprocess
import sys

from tether.server.checkpoint import load_checkpoint

from .server_process import REPO, RawClient, ServerProcess, wait_until

RECORD = {"obs": [[0.0, 0.0, 0.0, 0.0]] * 6, "actions": [0, 1, 0, 1, 0], "rewards": [1.0] * 5,
          "action_logp": [-0.69] * 5, "is_terminated": True, "is_truncated": False}


def test_tensorboard_progress_line_and_checkpoint_every(tmp_path) -> None:
    server = ServerProcess(tmp_path, "--train-batch-size", "5", "--checkpoint-every", "2")
    server.cmd.remove("--no-tensorboard")
    with server:
        raw = RawClient(server.port)
        for _ in range(2):
            raw.request({"type": "EPISODES_AND_GET_STATE", "episodes": [RECORD]})
        # Written after update 2, before shutdown (which writes one too); a new run writes one at start.
        def periodic_checkpoint_written() -> bool:
            path = server.logdir / "checkpoint.pt"
            return path.exists() and load_checkpoint(path)["modules"]["default_policy"]["weights_seq_no"] == 2

        assert wait_until(periodic_checkpoint_written, 10)
        raw.close()
        summary = server.stop()
    assert summary["updates"] == 2
    progress = [line for line in server.lines if line.startswith("[tether] update")]
    assert len(progress) == 2 and "return     5.0" in progress[-1] and "v2" in progress[-1]

    script = (
        "import sys; from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E;"
        "e=E(sys.argv[1]); e.Reload(); t=e.Tags()['scalars'];"
        "print(len(e.Scalars('episode/return_mean')), 'losses/approx_kl' in t, 'charts/env_steps_per_s' in t)"
    )
    out = subprocess.run([sys.executable, "-c", script, str(server.logdir)], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["2", "True", "True"], out.stderr
