"""Learners: PPO on one module's network, and the ONNX writer for its policy."""

from .ppo import NonFiniteUpdate, PPOHyperparams, PPOLearner
from .rollout_batch import RolloutBatch, build_batch

__all__ = ["NonFiniteUpdate", "PPOHyperparams", "PPOLearner", "RolloutBatch", "build_batch"]
