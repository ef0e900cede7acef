"""Time to export a module's policy to ONNX on each update, per kind of network.

A new ONNX model goes out with every update, so exporting must stay cheap whatever the network.
The default MLP is written directly from its weights; the CNN and user networks are traced once per
architecture (``trace_ms``, paid when the learner is built) and then only their weights are
rewritten per version (``export_ms_p50``); ``publish_ms_p50`` adds what SET_STATE carries of it,
base64(gzip(model)), made once per version. Networks, with the action space Discrete(6):

* ``mlp``: the default, hidden_sizes 64,64, on an 8-value observation;
* ``cnn``: Nature-CNN on an 84x84x4 uint8 image (hidden_sizes empty: CleanRL's Atari agent);
* ``user``: examples/custom_model.py's ResidualMlp (width 128, two blocks) on a 64-value observation;
* ``lstm``: the default heads after an LSTM of 64 units (the model then takes and returns its state) on a
  16-value observation.

Each figure is the median of ``--exports`` exports, each after the weights changed (an optimizer step's
worth of noise), in one process. Prints one JSON object, e.g.::

    {"export_ms_p50": {"mlp": 0.3, "cnn": 5.5, "user": 0.6}, "trace_ms": {"cnn": 170.0, "user": 90.0},
     "onnx_bytes": {...}, "exports": 50}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _common import REPO_ROOT, add_quiet_argument, log

sys.path.insert(0, str(REPO_ROOT / "examples"))  # custom_model.py, the user network

import torch  # noqa: E402

from tether.protocol import Discrete  # noqa: E402
from tether.protocol.onnx_codec import encode_onnx  # noqa: E402
from tether.protocol.spaces import box  # noqa: E402
from tether.server.learner import PPOHyperparams, PPOLearner  # noqa: E402

NETWORKS = {
    "mlp": (8, PPOHyperparams(model=None, hidden_sizes=(64, 64))),
    "cnn": ((84, 84, 4), PPOHyperparams(model={"encoder": "cnn", "image_shape": [84, 84, 4]}, hidden_sizes=())),
    "user": (64, PPOHyperparams(model={"class": "custom_model:ResidualMlp", "options": {"width": 128}})),
    "lstm": (16, PPOHyperparams(model={"recurrent": {"type": "lstm", "size": 64}}, hidden_sizes=(64, 64))),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exports", type=int, default=50, help="timed exports per network (default: 50)")
    add_quiet_argument(parser)
    return parser.parse_args(argv)


def measure(obs: int | tuple[int, ...], hp: PPOHyperparams, exports: int) -> tuple[float, float, float, int]:
    """(first export ms, median later export ms, median later export + SET_STATE encoding ms, bytes)
    for one network; a tuple ``obs`` is an image (a uint8 Box, as engines send cameras)."""
    space = box(0, 255, obs, "uint8") if isinstance(obs, tuple) else box(0, 255, (obs,))
    learner = PPOLearner(space, Discrete(6), hp, seed=0)
    start = time.perf_counter()
    model = learner.export_onnx()
    first_ms = (time.perf_counter() - start) * 1e3
    times, published = [], []
    for _ in range(exports):
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(1e-3 * torch.randn_like(p))
        start = time.perf_counter()
        model = learner.export_onnx()
        exported = time.perf_counter()
        encode_onnx(model)  # (what SET_STATE carries: base64 of gzip, once per version)
        times.append((exported - start) * 1e3)
        published.append((time.perf_counter() - start) * 1e3)
    return first_ms, statistics.median(times), statistics.median(published), len(model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    result: dict = {"export_ms_p50": {}, "publish_ms_p50": {}, "trace_ms": {}, "onnx_bytes": {}, "exports": args.exports}
    for name, (obs_dim, hp) in NETWORKS.items():
        first_ms, p50, publish_p50, size = measure(obs_dim, hp, args.exports)
        result["export_ms_p50"][name] = round(p50, 3)
        result["publish_ms_p50"][name] = round(publish_p50, 3)
        if name != "mlp":
            result["trace_ms"][name] = round(first_ms, 1)
        result["onnx_bytes"][name] = size
        log(f"{name}: export p50 {p50:.2f} ms ({size} bytes), first export {first_ms:.1f} ms")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
