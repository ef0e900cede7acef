"""Hand-written experts for the scripted examples: a function from an observation to the action to take.

scripted_demos_client.py and scripted_team_client.py import them (run as scripts, their own folder is
on the import path).
"""

from __future__ import annotations

import math

import numpy as np


def cartpole_expert(obs: np.ndarray) -> int:
    """Push towards where the pole is falling (angle plus a share of its angular velocity): 500 every time."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def pendulum_expert(obs: np.ndarray) -> np.ndarray:
    """Swing up by pumping energy, then balance with a PD law near the top (about -130 per episode).

    Pendulum-v1's dynamics (angle 0 upright) are theta'' = 15 sin(theta) + 3 u, whose energy
    0.5 theta'^2 + 15 cos(theta) is 15 at rest on top: push along the swing while short of it."""
    cos, sin, speed = float(obs[0]), float(obs[1]), float(obs[2])
    if cos > 0.9:  # near the top: balance
        torque = -10.0 * math.atan2(sin, cos) - 2.0 * speed
    else:
        energy = 0.5 * speed * speed + 15.0 * cos
        torque = 2.0 * (1.0 if speed >= 0 else -1.0) * (1.0 if energy < 15.0 else -1.0)
    return np.array([np.clip(torque, -2.0, 2.0)], np.float32)
