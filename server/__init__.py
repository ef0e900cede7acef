"""Tether's training server: RLlink over TCP, pooled experience, PPO in PyTorch."""

__version__ = "0.1.0"
