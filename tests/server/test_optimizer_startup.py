"""A learner is built and checkpointed without importing torch's compiler (server/learner/optimizer_startup.py), and
its optimizer still works: updates, checkpoints of its state, and a restore; torch's own Adam is
left as it is."""

from __future__ import annotations

import subprocess
import sys
import textwrap




def test_a_learner_starts_without_torch_dynamo_and_its_optimizer_works() -> None:
    program = textwrap.dedent("""
        import sys
        import numpy as np
        import torch
        torch.set_num_threads(1)  # as the server runs its learner (torch_threads): no hand-offs between threads
        from tether.protocol import Discrete, EpisodeChunk
        from tether.protocol.spaces import box
        from tether.server.learner import PPOHyperparams, PPOLearner, build_batch
        from tether.server.learner.optimizer_startup import builds_without_dynamo

        learner = PPOLearner(box(-5, 5, (3,)), Discrete(2), PPOHyperparams(minibatch_size=64), seed=0)
        assert "torch._dynamo" not in sys.modules, "building a learner imported torch._dynamo"
        state = learner.optimizer.state_dict()  # (the run's first checkpoint, written before it listens)
        learner.optimizer.load_state_dict(state)
        learner.optimizer.zero_grad()
        assert "torch._dynamo" not in sys.modules, "checkpointing a learner imported torch._dynamo"
        assert builds_without_dynamo()
        assert isinstance(learner.optimizer, torch.optim.Adam)
        # torch's own optimizers keep their guard: only the learner's are built without it.
        for name in ("add_param_group", "state_dict", "load_state_dict", "zero_grad"):
            assert getattr(torch.optim.Adam, name) is getattr(torch.optim.Optimizer, name), name
        rng = np.random.default_rng(0)
        chunks = [EpisodeChunk(obs=rng.normal(size=(2, 3)).astype(np.float32), actions=np.array([1]),
                               rewards=np.array([1.0], np.float32), action_logp=np.array([-0.69], np.float32),
                               action_dist_inputs=None, is_terminated=True, is_truncated=False) for _ in range(128)]
        before = [p.detach().clone() for p in learner.model.parameters()]
        learner.update(build_batch(chunks))
        moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(learner.model.parameters(), before))
        assert moved > 0, "the update did not change the weights"
        saved = learner.optimizer.state_dict()
        assert saved["state"], "Adam keeps moments once it has stepped"
        learner.optimizer.load_state_dict(saved)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
