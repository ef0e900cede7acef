"""Learners: PPO on one module's network, and the ONNX writer for its policy."""

from .isolation import IsolatedUpdate, screen_sources, update_isolating
from .ppo import NonFiniteUpdate, PPOHyperparams, PPOLearner
from .rollout_batch import RolloutBatch, build_batch

__all__ = ["IsolatedUpdate", "NonFiniteUpdate", "PPOHyperparams", "PPOLearner", "RolloutBatch", "build_batch",
           "screen_sources", "update_isolating"]
