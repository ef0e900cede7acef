"""mixed_precision "bf16": the update's forward passes run in bfloat16 (autocast, on the CPU here as on
a GPU), while weights, optimizer state and losses stay float32; what it cannot do yet is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tether.protocol import Discrete
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import box
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch


def chunks(rng: np.random.Generator, steps: int = 600) -> list[EpisodeChunk]:
    out = []
    for _ in range(steps // 200):
        out.append(EpisodeChunk(obs=rng.standard_normal((201, 8)).astype(np.float32), actions=rng.integers(0, 4, 200),
                                rewards=rng.standard_normal(200), action_logp=np.full(200, -np.log(4.0)),
                                action_dist_inputs=np.zeros((200, 4)), is_terminated=True, is_truncated=False))
    return out


def learner(precision: str, **hp) -> PPOLearner:
    return PPOLearner(box(-10, 10, (8,)), Discrete(4),
                      PPOHyperparams(mixed_precision=precision, num_epochs=2, minibatch_size=128, **hp), seed=0)


def test_bf16_runs_the_forward_passes_in_bfloat16_and_keeps_float32_weights() -> None:
    fast, plain = learner("bf16"), learner("off")
    seen: dict[str, set] = {"bf16": set(), "off": set()}
    for name, l in (("bf16", fast), ("off", plain)):
        first = next(m for m in l.model.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_hook(lambda m, i, o, name=name: seen[name].add(o.dtype))
    batch = build_batch(chunks(np.random.default_rng(0)))
    before = [p.detach().clone() for p in fast.model.parameters()]
    stats_fast, stats_plain = fast.update(batch), plain.update(batch)
    assert torch.bfloat16 in seen["bf16"] and seen["off"] == {torch.float32}
    assert all(p.dtype == torch.float32 for p in fast.model.parameters())
    assert all(v.dtype == torch.float32 for s in fast.optimizer.state.values() for v in s.values() if torch.is_tensor(v)
               and v.numel() > 1)
    assert any(not torch.equal(a, b) for a, b in zip(before, fast.model.parameters())), "it trained"
    assert all(np.isfinite(v) for v in stats_fast.values())
    # The same update in the two precisions: close, not equal (bfloat16 keeps 8 bits of mantissa).
    assert stats_fast["value_loss"] == pytest.approx(stats_plain["value_loss"], rel=0.05)
    assert stats_fast["policy_loss"] != stats_plain["policy_loss"]
    assert len(fast.export_onnx()) > 0  # (the exported model is float32, exported outside autocast)


def test_other_precisions_and_memory_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="float16 would need a loss scale"):
        learner("fp16")
    with pytest.raises(ValueError, match="model with memory"):
        learner("bf16", model={"recurrent": {"type": "lstm", "size": 16}})
