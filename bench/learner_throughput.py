"""Samples per second of the PPO update, on the CPU and, where there is one, on CUDA.

One update is what the server's learner runs per batch: GAE over the batch, then ``num_epochs``
passes of minibatches (10 x 256 steps over a 4,000-step batch, the server's defaults, except the
batch). A sample is one agent step of the batch, so ``samples_per_s`` is ``batch_steps / seconds per
update`` (each step is seen ``num_epochs`` times within it). Networks, Discrete(6) actions:

* ``mlp``: the default 64,64 MLP on an 8-value observation;
* ``cnn``: the Nature-CNN on 84x84x4 uint8 images (CleanRL's Atari agent: hidden_sizes empty).

Each figure is the median of ``--updates`` timed updates after one untimed warm-up update, on
random observations and rewards (the update's cost does not depend on their values). Prints one
JSON object, e.g.::

    {"cpu": {"mlp": {"samples_per_s": 41000, "update_s_p50": 0.098}, "cnn": {...}}, "cuda": null,
     "cuda_device": null, "batch_steps": {"mlp": 4000, "cnn": 1024}, "torch_threads": 2}

``cuda`` is null on a machine without a CUDA device; there, the same keys as ``cpu``, plus
``cuda_over_cpu``, the ratio of samples per second per network.

``bf16`` holds the same figures per device with ``mixed_precision = "bf16"`` (the forward passes in
bfloat16), and ``bf16_over_fp32`` their ratio to the float32 figures of the same device and run
(``--no-bf16`` leaves both out: a CPU without bfloat16 instructions takes long over the CNN).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from _common import add_quiet_argument, log

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tether.protocol import Discrete  # noqa: E402
from tether.protocol.episodes import EpisodeChunk  # noqa: E402
from tether.protocol.spaces import box  # noqa: E402
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch  # noqa: E402

NETWORKS = {
    "mlp": ((8,), PPOHyperparams(model=None, hidden_sizes=(64, 64))),
    "cnn": ((84, 84, 4), PPOHyperparams(model={"encoder": "cnn", "image_shape": [84, 84, 4]}, hidden_sizes=())),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=5, help="timed updates per network and device (default: 5)")
    parser.add_argument("--mlp-steps", type=int, default=4000, help="agent steps per MLP batch (default: 4000)")
    parser.add_argument("--cnn-steps", type=int, default=1024, help="agent steps per CNN batch (default: 1024)")
    parser.add_argument("--epochs", type=int, default=10, help="PPO epochs per update (default: 10)")
    parser.add_argument("--no-bf16", action="store_true", help="do not measure mixed_precision bf16")
    add_quiet_argument(parser)
    return parser.parse_args(argv)


def batch_of(shape: tuple[int, ...], steps: int, rng: np.random.Generator) -> list[EpisodeChunk]:
    """Episodes of 200 steps of random observations (uint8 images, or floats), actions and rewards."""
    chunks, left = [], steps
    while left > 0:
        t = min(200, left)
        obs = (rng.integers(0, 256, (t + 1, *shape), dtype=np.uint8) if len(shape) > 1
               else rng.standard_normal((t + 1, *shape)).astype(np.float32))
        chunks.append(EpisodeChunk(obs=obs, actions=rng.integers(0, 6, t), rewards=rng.standard_normal(t),
                                   action_logp=np.full(t, -np.log(6.0)), action_dist_inputs=np.zeros((t, 6)),
                                   is_terminated=True, is_truncated=False))
        left -= t
    return chunks


def measure(device: str, shape: tuple[int, ...], hp: PPOHyperparams, steps: int, updates: int) -> dict:
    space = box(0, 255, shape, "uint8") if len(shape) > 1 else box(-10, 10, shape)
    learner = PPOLearner(space, Discrete(6), hp, device=device, seed=0)
    batch = build_batch(batch_of(shape, steps, np.random.default_rng(0)))
    learner.update(batch)  # warm-up (allocator, kernels)
    times = []
    for _ in range(updates):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        learner.update(batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    p50 = statistics.median(times)
    return {"samples_per_s": round(steps / p50, 1), "update_s_p50": round(p50, 4)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = {"mlp": args.mlp_steps, "cnn": args.cnn_steps}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    result: dict = {"cpu": {}, "cuda": None, "cuda_device": torch.cuda.get_device_name(0) if "cuda" in devices else None,
                    "batch_steps": steps, "epochs": args.epochs, "torch_threads": torch.get_num_threads()}
    precisions = ["off"] + ([] if args.no_bf16 else ["bf16"])
    if not args.no_bf16:
        result["bf16"], result["bf16_over_fp32"] = {}, {}
    for device in devices:
        for precision in precisions:
            figures = {}
            for name, (shape, hp) in NETWORKS.items():
                hp = dataclasses.replace(hp, num_epochs=args.epochs, mixed_precision=precision)
                figures[name] = measure(device, shape, hp, steps[name], args.updates)
                log(f"{device} {precision} {name}: {figures[name]['samples_per_s']:.0f} samples/s "
                    f"({figures[name]['update_s_p50'] * 1e3:.0f} ms per update of {steps[name]} steps)")
            if precision == "off":
                result[device] = figures
            else:
                result["bf16"][device] = figures
                result["bf16_over_fp32"][device] = {
                    name: round(figures[name]["samples_per_s"] / result[device][name]["samples_per_s"], 2)
                    for name in NETWORKS}
    if result["cuda"] is not None:
        result["cuda_over_cpu"] = {name: round(result["cuda"][name]["samples_per_s"] / result["cpu"][name]["samples_per_s"], 2)
                                   for name in NETWORKS}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
