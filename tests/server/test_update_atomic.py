"""An update is atomic per module (issue: one module's failure lost the others): a module
whose update raises is put back as it was and its data counted as discarded, while the
other modules of the same update publish their new weights and count their steps."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer

SPACES = {"observation_space": {"type": "Box", "shape": [4], "low": -1, "high": 1},
          "action_space": {"type": "Discrete", "n": 2}}


def entry(agent: str, module: str, steps: int, seed: int) -> AgentChunk:
    rng = np.random.default_rng(seed)
    chunk = EpisodeChunk(rng.normal(scale=0.1, size=(steps + 1, 4)).astype(np.float32), rng.integers(2, size=steps),
                         np.ones(steps, np.float32), np.full(steps, -0.69, np.float32), None, True, False, f"e{seed}")
    return AgentChunk(agent, module, 0, chunk)


async def run(tmp_path) -> dict:
    config = ServerConfig(port=0, train_batch_size=100, minibatch_size=50, num_epochs=2, tensorboard=False, quiet=True,
                          logdir=str(tmp_path), checkpoint_every=0, verify_action_logp=False,
                          modules={"a": SPACES, "b": SPACES},
                          policy_mapping=[{"agent_id": "x", "module": "a"}, {"agent_id": "y", "module": "b"}])
    trainer = Trainer(config, build_layout(config))
    learner_b = trainer.modules["b"].learner
    b_before = {k: v.clone() for k, v in learner_b.model.state_dict().items()}
    real_update = learner_b.update

    def update_then_fail(batch):
        real_update(batch)  # the weights have moved when it fails
        raise RuntimeError("module b's update failed")

    learner_b.update = update_then_fail  # type: ignore[method-assign]
    # "a" first in the pool: it trains before "b" fails.
    record = MultiAgentRecord("ep", True, False, [entry("x", "a", 50, 1), entry("y", "b", 50, 2)])
    await trainer.submit("c", [record], {"a": 0, "b": 0}, False, source="#1 c")
    await trainer.learner_loop.between_updates()  # (the update may have finished within submit)
    out = {
        "versions": {m: rt.weights_seq_no for m, rt in trainer.modules.items()},
        "trained": trainer.metrics.agent_steps_trained,
        "discarded": trainer.metrics.updates_discarded,
        "b_unchanged": all(torch.equal(b_before[k], v) for k, v in learner_b.model.state_dict().items()),
    }
    await trainer.close(checkpoint=False)
    return out


def test_a_failing_module_is_rolled_back_and_the_others_publish(tmp_path) -> None:
    out = asyncio.run(run(tmp_path))
    assert out["versions"] == {"a": 1, "b": 0}, out
    assert out["trained"] == 50 and out["discarded"] == 1, out
    assert out["b_unchanged"], "the failed module's weights were put back"
