"""Learners: PPO on one module's network, and the ONNX writer for its policy."""

from .ppo import PPOHyperparams, PPOLearner
from .rollout_batch import RolloutBatch, build_batch

__all__ = ["PPOHyperparams", "PPOLearner", "RolloutBatch", "build_batch"]
