"""Action latency benchmark: the Python SDK's ``TetherClient.get_action``
against a bare ONNX Runtime ``InferenceSession.run`` on the same model.

The model is a CartPole policy (4 -> 64 -> 64 -> 2, Tanh) written by
``server/learner/onnx_export.py`` ``export_policy`` from a fresh
``PPOLearner``. The bare session uses one intra-op thread, as the SDK does.

For the SDK figure a real server runs as a subprocess (same learner seed, so
it serves the same weights; checked) with ``env_steps_per_sample`` so large
that the client never sends during timing, and a real ``TetherClient``
connects to it. Each ``get_action`` call on one ongoing episode is timed
with ``time.perf_counter_ns``; a reward is logged between calls (untimed), as
an engine loop would. Bare and SDK calls are timed in alternating blocks so
background load affects both alike. ``batch256_us_p50`` is a bare session run
on a (256, 4) batch.

``sdk_python_us_p99_while_sending``: a second real server (which never trains,
so it answers as soon as it has stored a batch) asks for 4000-step batches; the
same SDK loop runs on, and only the calls made while a batch is queued or in
flight (handed to the client's I/O thread, not yet answered) are counted,
including the call that cuts the batch. Target: at most 2x ``sdk_python_us_p99``
(``while_sending_p99_ratio``).

Images: ``ort_python_cnn_us_p50`` / ``sdk_python_cnn_us_p50`` (and their ``sdk_python_cnn_ratio``)
time Nature-CNN on 84x84x4 uint8 images (a byte box, protocol 1.4): bare ONNX Runtime on the served
model against ``TetherClient.get_action`` on the same images, ``--cnn-calls`` of each, alternating,
against a third server that serves the CNN. ``--no-cnn`` leaves them out.

The C++ SDK (sdk_cpp/bench/act_latency.cpp, built by
``sdk_cpp/scripts/build_and_test.sh --build-only normal``) is measured the same
way against the same two servers and the same model: ``ort_cpp_us_p50`` and
``ort_cpp_batch256_us_p50`` (ONNX Runtime's C API, tensors bound once),
``sdk_cpp_us_p50`` / ``sdk_cpp_us_p99`` (``TetherClient::get_action``),
``sdk_cpp_us_p99_while_sending`` and its ratio to the idle p99,
``sdk_cpp_batch256_us_p50`` / ``_p99`` (``MultiAgentClient::get_action`` for
one frame of 256 agents of one module: one inference run, sampling and
recording each, in steady state: against the sending server, so a batch is cut
every 4000 agent steps and the episode's arrays are reused as in a long run;
frames paced at ``--frame-interval-us``, 1000 by default, with a bare batch-256
run beside each frame (before it, then after it, in turn), ``ort_cpp_batch256_paced_us_p50``;
``sdk_cpp_batch256_ratio`` is the frame against that paced bare run,
``sdk_cpp_batch256_vs_unpaced_ratio`` against ``ort_cpp_batch256_us_p50``,
``sdk_cpp_batch256_p99_vs_p50``, with the bare run's own tail at the same pace
as its baseline: ``ort_cpp_batch256_paced_us_p99``, ``ort_cpp_batch256_paced_p99_vs_p50``
and ``sdk_cpp_batch256_p99_vs_bare_p99`` (C# and both sustained series alike); at 1 ms the server does not keep up, and once a
batch is dropped the rest of the episode is played unrecorded:
``sdk_cpp_batch256_server_agent_steps_per_s`` is what it took), and
``sdk_cpp_backend_batch256_us_p50`` (the SDK's ONNX Runtime backend on 256
rows plus sampling them, without recording). The same frames at a pace the
sending server sustains (twice its time per frame's agent steps in the 1 ms
series, whole milliseconds, 2 to 50), where every frame is recorded and every
batch answered: ``sdk_cpp_batch256_sustained_us_p50`` / ``_us_p99`` /
``_ratio`` (against ``ort_cpp_batch256_sustained_paced_us_p50``) /
``_p99_vs_p50`` / ``_frame_interval_us`` / ``_server_kept_up`` (nothing
dropped, at least 80 % of the timed agent steps answered), with ``_frames``,
``_batches_dropped``, ``_agent_steps_sent`` (the whole series, warm-up frames included) and ``_server_agent_steps_per_s``.
On the CNN server, with the model it serves: ``ort_cpp_cnn_us_p50`` / ``_p99`` (the C API on the
image's bytes, a uint8 tensor bound once) against ``sdk_cpp_cnn_us_p50`` / ``_p99``
(``TetherClient::get_action`` on the same 84x84x4 images' bytes, as an engine's camera gives them:
its ``const std::uint8_t*`` overload), ``--cnn-calls`` of each alternating in blocks of 10, and
``sdk_cpp_cnn_ratio`` (sdk / ort at p50; target at most 1.1); ``sdk_cpp_cnn_floats_us_p50`` /
``_ratio`` are the same calls given the images as the floats 0-255 its float overload takes (checked
and converted to bytes). Between blocks the episode's steps are sent (``flush``, untimed), as a batch
is cut in a long run, so each step is recorded into arrays that kept their capacity;
``sdk_cpp_cnn_growing_us_p50`` / ``_p99`` / ``_ratio`` are the same calls on a second client whose
episode is never cut (every 113 KB step lands in fresh memory). ``--no-cnn`` leaves these out too.
``--no-cpp`` leaves all of them out.

The C# SDK (sdk_csharp/Bench~/ActLatency.cs, built by
``sdk_csharp/scripts/build_and_test.sh --build-only`` and run under mono) is
measured against the same idle server and model: ``ort_csharp_us_p50`` /
``_p99`` (its ONNX Runtime backend alone: P/Invoke into the C API through a
binding made once), ``sdk_csharp_us_p50`` / ``_p99`` (``TetherClient.GetAction``)
and, against the sending server, ``sdk_csharp_allocated_bytes_per_call`` (bytes
the calling thread allocated per GetAction in steady state: 2 x ``--calls`` (at least two batches)
calls, one every 50 us, that cut a batch every ``--sending-batch`` steps, after
five batches of warm-up) with ``sdk_csharp_allocating_calls``, and
``sdk_csharp_batch256_us_p50`` / ``_p99`` (``MultiAgentClient.GetActions`` for
one frame of 256 agents of one module against the sending server, paced and
beside a bare batch-256 run as for C++: ``ort_csharp_batch256_paced_us_p50``,
``sdk_csharp_batch256_ratio``, ``sdk_csharp_batch256_p99_vs_p50``,
``sdk_csharp_batch256_allocated_bytes_per_frame``; at 1 ms the server does not keep
up, ``sdk_csharp_batch256_server_agent_steps_per_s`` is what it took). The same
frames at a pace the sending server sustains (twice its time per frame's agent
steps in the 1 ms series, whole milliseconds), where batches come back for reuse:
``sdk_csharp_batch256_sustained_us_p50`` / ``_us_p99`` / ``_ratio`` (against
``ort_csharp_batch256_sustained_paced_us_p50``) / ``_p99_vs_p50`` /
``_allocated_bytes_per_frame`` (cuts included) / ``_frame_interval_us`` /
``_server_kept_up``. On the CNN server, with the model it serves: ``ort_csharp_cnn_us_p50`` /
``_p99`` (``OnnxRuntimeBackend.Run`` on the image's bytes, a uint8 input bound once) against
``sdk_csharp_cnn_us_p50`` / ``_p99`` (``TetherClient.GetAction`` on the same 84x84x4 images given as
``byte[]``), ``--cnn-calls`` of each alternating in blocks of 10, the episode's steps sent between
blocks as for C++, ``sdk_csharp_cnn_ratio`` (sdk / ort at p50; target at most 1.1) and
``sdk_csharp_cnn_allocated_bytes_per_call``. ``--no-csharp`` leaves them all out.

Prints one JSON object on stdout, e.g.::

    {"onnxruntime_us_p50": 9.1, "sdk_python_us_p50": 17.3, "sdk_python_us_p99": 30.2,
     "sdk_python_us_p99_while_sending": 41.0, "batch256_us_p50": 60.5, "sdk_overhead_us_p50": 8.2, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO_ROOT,
    HostLoad,
    add_quiet_argument,
    ensure_installed,
    free_port,
    install_cleanup,
    log,
    spawn,
    stop,
    wait_for_port,
    wait_until_quiet,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000, help="timed calls per figure (default: 20000)")
    parser.add_argument("--warmup", type=int, default=2_000, help="untimed calls before timing (default: 2000)")
    parser.add_argument("--blocks", type=int, default=10,
                        help="bare and SDK calls alternate in this many blocks (default: 10)")
    parser.add_argument("--batch-calls", type=int, default=2_000, help="timed (256, 4) batch runs (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="learner seed for the model (default: 0)")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free port)")
    parser.add_argument("--sending-batch", type=int, default=4000,
                        help="env steps per batch for the while-sending figure (default: 4000)")
    parser.add_argument("--frame-interval-us", type=int, default=1000,
                        help="C++ multi-agent frame: microseconds from one frame's start to the next (default: 1000)")
    parser.add_argument("--sending-seconds", type=float, default=60.0,
                        help="longest time spent collecting the while-sending calls (default: 60)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server (default: 60)")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="also run the SDK loop under cProfile and write its stats to FILE")
    parser.add_argument("--cnn-calls", type=int, default=300,
                        help="timed calls per figure for the CNN on 84x84x4 images (default: 300)")
    parser.add_argument("--no-cnn", action="store_true", help="skip the CNN figures")
    parser.add_argument("--lstm-calls", type=int, default=5_000,
                        help="timed calls per figure for the LSTM model (default: 5000)")
    parser.add_argument("--no-lstm", action="store_true", help="skip the LSTM figures")
    parser.add_argument("--no-cpp", action="store_true", help="skip the C++ SDK's figures")
    parser.add_argument("--no-csharp", action="store_true", help="skip the C# SDK's figures")
    add_quiet_argument(parser)
    args = parser.parse_args(argv)
    if args.cnn_calls > CNN_STEPS_PER_SAMPLE - 100:
        parser.error(f"--cnn-calls must be at most {CNN_STEPS_PER_SAMPLE - 100} (the never-sent client's episode "
                     "must stay below one batch of the CNN server)")
    return args


def export_model(seed: int) -> bytes:
    """ONNX bytes of a fresh CartPole PPOLearner's policy (what a new server serves)."""
    from tether.protocol.spaces import Discrete, box
    from tether.server.learner import PPOHyperparams, PPOLearner
    from tether.server.learner.onnx_export import export_policy

    obs_space = box([-4.8, -float("inf"), -0.418879, -float("inf")], [4.8, float("inf"), 0.418879, float("inf")])
    learner = PPOLearner(obs_space, Discrete(2), PPOHyperparams(hidden_sizes=(64, 64)), "cpu", seed)
    return export_policy(learner.model)


CNN_IMAGE = [84, 84, 4]


#: Calls between two sends of the steady-state CNN client.
CNN_BLOCK_CALLS = 10
#: The CNN server's batch size in env steps: the most --cnn-calls can be, plus the warm-up.
CNN_STEPS_PER_SAMPLE = 2000


def cnn_model(seed: int) -> bytes:
    """ONNX bytes of a fresh Nature-CNN learner on 84x84x4 uint8 images, Discrete(6) (what the CNN server serves)."""
    from tether.protocol.spaces import Discrete, space_from_json
    from tether.server.learner import PPOHyperparams, PPOLearner

    space = space_from_json({"type": "Box", "shape": CNN_IMAGE, "dtype": "uint8", "low": 0, "high": 255})
    hp = PPOHyperparams(model={"encoder": "cnn", "image_shape": CNN_IMAGE}, hidden_sizes=())
    return PPOLearner(space, Discrete(6), hp, "cpu", seed).export_onnx()


def measure_cnn(args: argparse.Namespace, tmp: Path) -> dict:
    """The CNN figures of the Python SDK and, unless ``--no-cpp`` / ``--no-csharp``, of the C++ and C#
    SDKs, against one server that serves Nature-CNN on 84x84x4 uint8 images."""
    port = free_port()
    space = {"type": "Box", "shape": CNN_IMAGE, "dtype": "uint8", "low": 0, "high": 255}
    server = spawn([
        sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port), "--seed", str(args.seed),
        "--observation-space", json.dumps(space), "--action-space", json.dumps({"type": "Discrete", "n": 6}),
        "--model", json.dumps({"encoder": "cnn", "image_shape": CNN_IMAGE}), "--hidden-sizes", "",
        # (2,000 images a batch fit the 64 MiB frame limit; the never-sent client stays below one batch)
        "--env-steps-per-sample", str(CNN_STEPS_PER_SAMPLE), "--train-batch-size", str(10**12),
        "--no-tensorboard", "--checkpoint-every", "0", "--quiet", "--logdir", str(tmp / "cnn-run"),
    ], stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, server, timeout_s=args.timeout)
        result = measure_python_cnn(args, port)
        if not args.no_cpp:
            result.update(measure_cpp_cnn(args, tmp, port))
        if not args.no_csharp:
            result.update(measure_csharp_cnn(args, tmp, port))
    finally:
        stop(server, grace_s=10.0)
    return result


#: The model with memory of the LSTM figures: 16 observation values, Discrete(4), an LSTM of 64 units.
LSTM_OBS = 16
LSTM_MODEL = {"recurrent": {"type": "lstm", "size": 64}}


def lstm_model(seed: int) -> bytes:
    """ONNX bytes of a fresh learner with an LSTM (what the LSTM server serves)."""
    from tether.protocol.spaces import Discrete, box
    from tether.server.learner import PPOHyperparams, PPOLearner

    hp = PPOHyperparams(model=LSTM_MODEL, hidden_sizes=(64, 64))
    return PPOLearner(box(-1, 1, (LSTM_OBS,)), Discrete(4), hp, "cpu", seed).export_onnx()


def measure_lstm(args: argparse.Namespace, tmp: Path) -> dict:
    """The LSTM figures (batch 1, the state fed back at every call) of the Python SDK and, unless
    ``--no-cpp`` / ``--no-csharp``, of the C++ and C# SDKs, against one server that serves the LSTM
    model and never trains (its batch size is out of reach)."""
    port = free_port()
    server = spawn([
        sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port), "--seed", str(args.seed),
        "--observation-space", json.dumps({"type": "Box", "shape": [LSTM_OBS], "low": -1, "high": 1}),
        "--action-space", json.dumps({"type": "Discrete", "n": 4}), "--model", json.dumps(LSTM_MODEL),
        "--hidden-sizes", "64,64", "--train-batch-size", str(10**12), "--no-tensorboard", "--checkpoint-every", "0",
        "--quiet", "--logdir", str(tmp / "lstm-run"),
    ], stdout=subprocess.DEVNULL)
    model_file = tmp / "lstm_policy.onnx"
    model_file.write_bytes(lstm_model(args.seed))
    try:
        wait_for_port(port, server, timeout_s=args.timeout)
        result = measure_python_lstm(args, port)
        if not args.no_cpp:
            build_cpp()
            result.update(_program_json([str(CPP_PROGRAM), "--lstm-model", str(model_file), "--lstm-port", str(port),
                                         "--lstm-calls", str(args.lstm_calls), "--seed", str(args.seed)], "C++ LSTM"))
            result["sdk_cpp_lstm_ratio"] = round(result["sdk_cpp_lstm_us_p50"] / result["ort_cpp_lstm_us_p50"], 3)
            result["sdk_cpp_lstm_batch256_ratio"] = round(
                result["sdk_cpp_lstm_batch256_us_p50"] / result["ort_cpp_lstm_batch256_us_p50"], 3)
        if not args.no_csharp:
            build_csharp()
            result.update(_program_json(["mono", "--optimize=all", str(CSHARP_PROGRAM), "--lstm-model", str(model_file),
                                         "--lstm-port", str(port), "--lstm-calls", str(args.lstm_calls), "--seed",
                                         str(args.seed)], "C# LSTM", csharp_env()))
            result["sdk_csharp_lstm_ratio"] = round(
                result["sdk_csharp_lstm_us_p50"] / result["ort_csharp_lstm_us_p50"], 3)
    finally:
        stop(server, grace_s=10.0)
    return result


def _program_json(cmd: list[str], what: str, env: dict | None = None) -> dict:
    """The last JSON line a bench program prints."""
    run_ = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    if run_.returncode != 0:
        raise RuntimeError(f"{what} bench exited {run_.returncode}: {run_.stderr[-4000:]}")
    return json.loads([line for line in run_.stdout.strip().splitlines() if line.startswith("{")][-1])


def measure_python_lstm(args: argparse.Namespace, port: int) -> dict:
    """Bare ONNX Runtime on the served LSTM model (its state fed back by hand, batch 1) against
    TetherClient.get_action, which carries the state itself; calls alternate so that background load
    hits both alike. Episodes of 200 steps (the state starts from zeros at each), sent as they end."""
    import numpy as np
    import onnxruntime as ort

    from tether.sdk import TetherClient

    client = TetherClient("127.0.0.1", port, client_name="bench-act-latency-lstm", seed=args.seed,
                          reconnect_timeout_s=args.timeout)
    try:
        bare = bare_session(lstm_model(args.seed))
        names = ["action_dist_inputs", "state_out_h", "state_out_c"]
        rng = np.random.default_rng(args.seed)
        rows = [rng.uniform(-1, 1, (1, LSTM_OBS)).astype(np.float32) for _ in range(64)]
        feed = {"onnx::Gemm_0": rows[0], "state_in_h": np.zeros((1, 64), np.float32),
                "state_in_c": np.zeros((1, 64), np.float32)}
        perf_ns = time.perf_counter_ns
        bare_ns: list[int] = []
        sdk_ns: list[int] = []
        eid = client.start_episode()
        for i in range(-args.warmup // 10, args.lstm_calls):
            if i % 200 == 0:
                client.end_episode(eid, rows[0][0])
                eid = client.start_episode()
                feed["state_in_h"][:] = 0
                feed["state_in_c"][:] = 0
            feed["onnx::Gemm_0"] = rows[i % 64]
            t0 = perf_ns()
            _, h, c = bare.run(names, feed)
            t1 = perf_ns()
            client.get_action(eid, rows[i % 64][0])
            t2 = perf_ns()
            feed["state_in_h"], feed["state_in_c"] = h, c
            client.log_returns(eid, 1.0)
            if i >= 0:
                bare_ns.append(t1 - t0)
                sdk_ns.append(t2 - t1)
    finally:
        client.close()
    bare_ns.sort()
    sdk_ns.sort()
    bare_p50, sdk_p50 = percentile(bare_ns, 50), percentile(sdk_ns, 50)
    return {"ort_python_lstm_us_p50": bare_p50, "sdk_python_lstm_us_p50": sdk_p50,
            "sdk_python_lstm_us_p99": percentile(sdk_ns, 99), "sdk_python_lstm_ratio": round(sdk_p50 / bare_p50, 3),
            "lstm_calls": len(sdk_ns)}


def measure_python_cnn(args: argparse.Namespace, port: int) -> dict:
    """Nature-CNN on 84x84x4 uint8 images: bare ONNX Runtime on the served model against
    TetherClient.get_action on the same images (bytes in, as an engine's camera gives them).

    Steady state, as in a long run: the episode's steps are sent (flush, untimed) after every block
    of ``CNN_BLOCK_CALLS`` calls, so recorded images land in memory the client used before. A second
    client's episode is never sent: every image it records lands in fresh memory
    (``sdk_python_cnn_growing_*``), as in the C++ figures."""
    import numpy as np
    import onnxruntime as ort

    from tether.sdk import TetherClient

    client = TetherClient("127.0.0.1", port, client_name="bench-act-latency-cnn", seed=args.seed,
                          reconnect_timeout_s=args.timeout)
    growing = TetherClient("127.0.0.1", port, client_name="bench-act-latency-cnn-growing", seed=args.seed,
                           reconnect_timeout_s=args.timeout)
    try:
        # The bare session runs the model a fresh learner with the server's seed exports: the served one.
        bare = bare_session(cnn_model(args.seed))
        in_name, out_names = bare.get_inputs()[0].name, [bare.get_outputs()[0].name]
        rng = np.random.default_rng(args.seed)
        images = [rng.integers(0, 256, CNN_IMAGE).astype(np.uint8) for _ in range(64)]
        rows = [im[None] for im in images]
        same = bool(np.allclose(client.policy.dist_inputs(np.stack(images[:4])),
                                bare.run(out_names, {in_name: np.stack(images[:4])})[0], atol=1e-5))
        perf_ns = time.perf_counter_ns
        figures: dict[str, list[int]] = {"bare": [], "sdk": [], "growing": []}
        for sdk, name in ((client, "sdk"), (growing, "growing")):
            eid = sdk.start_episode()
            bare_ns = [] if name == "growing" else figures["bare"]
            for i in range(-2 * CNN_BLOCK_CALLS, args.cnn_calls):  # alternating, so background load hits both alike
                t0 = perf_ns()
                bare.run(out_names, {in_name: rows[i % 64]})
                t1 = perf_ns()
                sdk.get_action(eid, images[i % 64])
                t2 = perf_ns()
                sdk.log_returns(eid, 1.0)
                if i >= 0:
                    bare_ns.append(t1 - t0)
                    figures[name].append(t2 - t1)
                if name == "sdk" and i % CNN_BLOCK_CALLS == CNN_BLOCK_CALLS - 1:
                    sdk.flush()  # (untimed: the steps recorded so far are sent, as every batch is in a long run)
            if name == "growing":
                figures["growing_bare"] = bare_ns
        sent = client.env_steps_sent
    finally:
        client.close()
        growing.close()
    for values in figures.values():
        values.sort()
    bare_p50, sdk_p50 = percentile(figures["bare"], 50), percentile(figures["sdk"], 50)
    growing_p50, growing_bare_p50 = percentile(figures["growing"], 50), percentile(figures["growing_bare"], 50)
    return {"ort_python_cnn_us_p50": bare_p50, "sdk_python_cnn_us_p50": sdk_p50,
            "sdk_python_cnn_ratio": round(sdk_p50 / bare_p50, 3),
            "sdk_python_cnn_us_p99": percentile(figures["sdk"], 99), "sdk_python_cnn_env_steps_sent": sent,
            "sdk_python_cnn_growing_us_p50": growing_p50,
            "sdk_python_cnn_growing_ratio": round(growing_p50 / growing_bare_p50, 3),
            "cnn_calls": len(figures["sdk"]), "cnn_same_model_as_server": same}


def bare_session(model: bytes):
    """A bare ONNX Runtime session as the SDKs make theirs: one thread, quiet."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def percentile(sorted_ns: list[int], q: float) -> float:
    """q-th percentile of sorted nanosecond samples, in microseconds."""
    idx = min(len(sorted_ns) - 1, max(0, int(round(q / 100 * (len(sorted_ns) - 1)))))
    return round(sorted_ns[idx] / 1e3, 2)


def run(args: argparse.Namespace) -> dict:
    import numpy as np
    import onnxruntime as ort

    from tether.sdk import TetherClient

    model = export_model(args.seed)
    session = bare_session(model)
    in_name, out_name = session.get_inputs()[0].name, session.get_outputs()[0].name
    out_names = [out_name]

    rng = np.random.default_rng(args.seed)
    n_obs = 1024
    obs_pool = [rng.normal(0, 0.5, 4).astype(np.float32) for _ in range(n_obs)]  # what gymnasium hands an engine
    obs_rows = [o.reshape(1, 4) for o in obs_pool]
    batch = rng.normal(0, 0.5, (256, 4)).astype(np.float32)

    port = args.port or free_port()
    sending_port = free_port()
    perf_ns = time.perf_counter_ns
    with tempfile.TemporaryDirectory(prefix="tether-bench-act-") as tmp:
        host_load = HostLoad()

        def serve(serve_port: int, steps_per_sample: int, name: str):
            return spawn([
                sys.executable, "-m", "tether.server.cli", "serve", "--port", str(serve_port), "--seed", str(args.seed),
                "--env-steps-per-sample", str(steps_per_sample), "--train-batch-size", str(10**12),
                "--no-tensorboard", "--checkpoint-every", "0", "--quiet", "--logdir", str(Path(tmp) / name),
            ], stdout=subprocess.DEVNULL)

        server = serve(port, 10**12, "run")
        sending_server = serve(sending_port, args.sending_batch, "sending-run")
        try:
            wait_for_port(port, server, timeout_s=args.timeout)
            client = TetherClient("127.0.0.1", port, client_name="bench-act-latency", seed=args.seed,
                                  reconnect_timeout_s=args.timeout)
            try:
                assert client.policy is not None
                same = bool(np.allclose(client.policy.dist_inputs(batch),
                                        session.run(out_names, {in_name: batch})[0], atol=1e-6))
                if not same:
                    log("warning: the server's model differs from the locally exported one")
                eid = client.start_episode()
                get_action, log_returns = client.get_action, client.log_returns

                def bare_block(n: int, out: list[int] | None, start: int) -> None:
                    run_ = session.run
                    for i in range(start, start + n):
                        feed = {in_name: obs_rows[i % n_obs]}
                        t0 = perf_ns()
                        run_(out_names, feed)
                        t1 = perf_ns()
                        if out is not None:
                            out.append(t1 - t0)

                def sdk_block(n: int, out: list[int] | None, start: int) -> None:
                    for i in range(start, start + n):
                        obs = obs_pool[i % n_obs]
                        t0 = perf_ns()
                        get_action(eid, obs)
                        t1 = perf_ns()
                        log_returns(eid, 1.0)
                        if out is not None:
                            out.append(t1 - t0)

                bare_block(args.warmup, None, 0)
                sdk_block(args.warmup, None, 0)
                bare_ns: list[int] = []
                sdk_ns: list[int] = []
                per_block = max(1, args.calls // args.blocks)
                for b in range(args.blocks):
                    bare_block(per_block, bare_ns, b * per_block)
                    sdk_block(per_block, sdk_ns, b * per_block)

                batch_ns: list[int] = []
                feed = {in_name: batch}
                for _ in range(min(200, args.batch_calls)):
                    session.run(out_names, feed)
                for _ in range(args.batch_calls):
                    t0 = perf_ns()
                    session.run(out_names, feed)
                    batch_ns.append(perf_ns() - t0)

                sent = getattr(client, "env_steps_sent", None)
                if args.profile:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                    sdk_block(args.calls, None, 0)
                    profiler.disable()
                    profiler.dump_stats(args.profile)
                    log(f"SDK loop profile written to {args.profile}")
            finally:
                client.close()
            wait_for_port(sending_port, sending_server, timeout_s=args.timeout)
            sending = measure_while_sending(args, sending_port, obs_pool)
            cnn = {} if args.no_cnn else measure_cnn(args, Path(tmp))
            lstm = {} if args.no_lstm else measure_lstm(args, Path(tmp))
            cpp = {} if args.no_cpp else measure_cpp(args, model, Path(tmp), port, sending_port)
            csharp = {} if args.no_csharp else measure_csharp(args, model, Path(tmp), port, sending_port)
        finally:
            stop(server, grace_s=10.0)
            stop(sending_server, grace_s=10.0)
        load = host_load.stop()

    bare_ns.sort()
    sdk_ns.sort()
    batch_ns.sort()
    sending_ns = sorted(sending.pop("durations_ns"))
    result = {
        "onnxruntime_us_p50": percentile(bare_ns, 50),
        "sdk_python_us_p50": percentile(sdk_ns, 50),
        "sdk_python_us_p99": percentile(sdk_ns, 99),
        "sdk_python_us_p99_while_sending": percentile(sending_ns, 99),
        "sdk_python_us_p50_while_sending": percentile(sending_ns, 50),
        "sdk_python_us_max_while_sending": round(sending_ns[-1] / 1e3, 2),
        "while_sending_p99_ratio": round(percentile(sending_ns, 99) / percentile(sdk_ns, 99), 2),
        "calls_while_sending": len(sending_ns),
        **sending,
        "batch256_us_p50": percentile(batch_ns, 50),
        "onnxruntime_us_p99": percentile(bare_ns, 99),
        "sdk_overhead_us_p50": round(percentile(sdk_ns, 50) - percentile(bare_ns, 50), 2),
        "calls": len(sdk_ns),
        "batch_calls": len(batch_ns),
        "same_model_as_server": same,
        "env_steps_sent_during_timing": sent,
        "onnxruntime_version": ort.__version__,
        **cnn,
        **lstm,
        **cpp,
        **csharp,
        **load,
    }
    return result


CPP_BUILD = REPO_ROOT / "sdk_cpp" / "build" / "normal"
CPP_PROGRAM = CPP_BUILD / "bench" / "act_latency_cpp"


_cpp_built = False


def build_cpp() -> None:
    """Builds sdk_cpp (normal configuration) if needed, once per run."""
    global _cpp_built
    if _cpp_built:
        return
    build = subprocess.run(["bash", str(REPO_ROOT / "sdk_cpp" / "scripts" / "build_and_test.sh"), "--build-only",
                            "normal"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if build.returncode != 0:
        sys.exit("act_latency.py: building sdk_cpp failed (bash sdk_cpp/scripts/build_and_test.sh --build-only "
                 "normal); its last output:\n" + build.stdout[-4000:])
    _cpp_built = True


def measure_cpp_cnn(args: argparse.Namespace, tmp: Path, port: int) -> dict:
    """The C++ SDK's CNN figures against the CNN server on `port`, with the model it serves."""
    build_cpp()
    model_file = tmp / "cnn_policy.onnx"
    model_file.write_bytes(cnn_model(args.seed))
    run_ = subprocess.run([str(CPP_PROGRAM), "--cnn-model", str(model_file), "--cnn-port", str(port),
                           "--cnn-calls", str(args.cnn_calls), "--seed", str(args.seed)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if run_.returncode != 0:
        raise RuntimeError(f"act_latency_cpp (CNN) exited {run_.returncode}: {run_.stderr[-4000:]}")
    return json.loads(run_.stdout.strip().splitlines()[-1])


def measure_csharp_cnn(args: argparse.Namespace, tmp: Path, port: int) -> dict:
    """The C# SDK's CNN figures against the CNN server on `port`, with the model it serves: builds
    sdk_csharp with mcs and runs its bench program's CNN series under mono."""
    import onnxruntime as ort

    build_csharp()
    model = cnn_model(args.seed)
    model_file = tmp / "cnn_policy_csharp.onnx"
    model_file.write_bytes(model)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    run_ = subprocess.run(["mono", "--optimize=all", str(CSHARP_PROGRAM),
                           "--cnn-model", str(model_file), "--cnn-port", str(port), "--cnn-calls", str(args.cnn_calls),
                           "--cnn-input-name", session.get_inputs()[0].name, "--cnn-output-name", session.get_outputs()[0].name,
                           "--seed", str(args.seed)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600, env=csharp_env())
    if run_.returncode != 0:
        raise RuntimeError(f"act_latency.exe (CNN) exited {run_.returncode}: {run_.stderr[-4000:]}")
    lines = [line for line in run_.stdout.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def measure_cpp(args: argparse.Namespace, model: bytes, tmp: Path, port: int, sending_port: int) -> dict:
    """The C++ SDK's figures: builds sdk_cpp (normal configuration) if needed and runs its bench program."""
    build_cpp()
    model_file = tmp / "policy.onnx"
    model_file.write_bytes(model)
    run_ = subprocess.run([str(CPP_PROGRAM), "--model", str(model_file), "--port", str(port), "--sending-port",
                           str(sending_port), "--calls", str(args.calls), "--warmup", str(args.warmup), "--blocks",
                           str(args.blocks), "--batch-calls", str(args.batch_calls), "--sending-seconds",
                           str(args.sending_seconds), "--frame-interval-us", str(args.frame_interval_us), "--seed", str(args.seed)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if run_.returncode != 0:
        raise RuntimeError(f"act_latency_cpp exited {run_.returncode}: {run_.stderr[-4000:]}")
    result = json.loads(run_.stdout.strip().splitlines()[-1])
    result["sdk_cpp_us_p50_vs_ort_cpp"] = round(result["sdk_cpp_us_p50"] / result["ort_cpp_us_p50"], 2)
    return result


CSHARP_BUILD = REPO_ROOT / "sdk_csharp" / ".build"
CSHARP_PROGRAM = CSHARP_BUILD / "act_latency.exe"

_csharp_built = False


def build_csharp() -> None:
    """Builds sdk_csharp with mcs (into CSHARP_BUILD) if needed, once per run."""
    global _csharp_built
    if _csharp_built:
        return
    build = subprocess.run(["bash", str(REPO_ROOT / "sdk_csharp" / "scripts" / "build_and_test.sh"), "--build-only"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800,
                           env={**os.environ, "TETHER_CSHARP_BUILD_DIR": str(CSHARP_BUILD)})
    if build.returncode != 0:
        sys.exit("act_latency.py: building sdk_csharp failed (bash sdk_csharp/scripts/build_and_test.sh --build-only); "
                 "its last output:\n" + build.stdout[-4000:])
    _csharp_built = True


def csharp_env() -> dict[str, str]:
    """The environment the C# bench program runs in: ONNX Runtime's C library on the loader's path."""
    env = dict(os.environ)
    ort_lib = REPO_ROOT / "sdk_cpp" / "third_party" / "onnxruntime" / "lib"
    env["LD_LIBRARY_PATH"] = f"{ort_lib}:{env.get('LD_LIBRARY_PATH', '')}"
    return env


def measure_csharp(args: argparse.Namespace, model: bytes, tmp: Path, port: int, sending_port: int) -> dict:
    """The C# SDK's figures: builds sdk_csharp with mcs and runs its bench program under mono."""
    build_csharp()
    model_file = tmp / "policy_csharp.onnx"
    model_file.write_bytes(model)
    env = csharp_env()
    run_ = subprocess.run(["mono", "--optimize=all", str(CSHARP_PROGRAM), "--model", str(model_file), "--port", str(port),
                           "--sending-port", str(sending_port), "--alloc-calls", str(max(2 * args.calls, 2 * args.sending_batch)),
                           "--alloc-warmup", str(max(args.warmup, 5 * args.sending_batch)), "--calls", str(args.calls), "--warmup", str(args.warmup), "--blocks", str(args.blocks),
                           "--batch-calls", str(args.batch_calls), "--frame-interval-us", str(args.frame_interval_us),
                           "--seed", str(args.seed)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    if run_.returncode != 0:
        raise RuntimeError(f"act_latency.exe exited {run_.returncode}: {run_.stderr[-4000:]}")
    lines = [line for line in run_.stdout.strip().splitlines() if line.startswith("{")]
    result = {**json.loads(lines[-2]), **json.loads(lines[-1])}
    result["sdk_csharp_us_p50_vs_ort_csharp"] = round(result["sdk_csharp_us_p50"] / result["ort_csharp_us_p50"], 2)
    return result


def measure_while_sending(args: argparse.Namespace, port: int, obs_pool: list) -> dict:
    """The SDK loop against a server that asks for ``args.sending_batch``-step
    batches; get_action durations of the calls made while a batch was queued
    or in flight (the call that cuts one included)."""
    from tether.sdk import TetherClient

    client = TetherClient("127.0.0.1", port, client_name="bench-act-latency-sending", seed=args.seed,
                          reconnect_timeout_s=args.timeout)
    perf_ns = time.perf_counter_ns
    durations: list[int] = []
    batches: list = []
    submit = client.link.submit
    client.link.submit = lambda batch: (batches.append(batch), submit(batch))[1]
    try:
        eid = client.start_episode()
        get_action, log_returns, link = client.get_action, client.log_returns, client.link
        n_obs = len(obs_pool)
        for i in range(args.warmup):
            get_action(eid, obs_pool[i % n_obs])
            log_returns(eid, 1.0)
        deadline = time.monotonic() + args.sending_seconds
        i = 0
        while len(durations) < args.calls and time.monotonic() < deadline:
            obs = obs_pool[i % n_obs]
            queued = len(batches)
            busy = link.busy
            t0 = perf_ns()
            get_action(eid, obs)
            t1 = perf_ns()
            log_returns(eid, 1.0)
            if busy or len(batches) != queued:
                durations.append(t1 - t0)
            i += 1
        client.flush()
    finally:
        client.close()
    round_trips = sorted(b.round_trip_s for b in batches if b.round_trip_s is not None)
    return {
        "durations_ns": durations,
        "sending_batch_env_steps": args.sending_batch,
        "batches_sent_while_sending": len(round_trips),
        "batches_dropped_while_sending": client.batches_dropped,
        "batch_round_trip_ms_p50": round(round_trips[len(round_trips) // 2] * 1e3, 2) if round_trips else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_cleanup()
    if not args.no_cpp:
        ensure_installed("sdk_cpp/scripts/install_toolchain.sh", tools=["cmake", "g++"],
                         what="the C++ SDK's figures", skip_flag="--no-cpp")
    if not args.no_csharp:
        ensure_installed("sdk_csharp/scripts/install_toolchain.sh", tools=["mcs", "mono", "pkg-config"],
                         what="the C# SDK's figures", skip_flag="--no-csharp")
        # (its backend P/Invokes ONNX Runtime's C library, which the C++ SDK's script fetches)
        ensure_installed("sdk_cpp/scripts/fetch_onnxruntime.sh", files=["sdk_cpp/third_party/onnxruntime/lib/libonnxruntime.so"],
                         what="the C# SDK's figures", skip_flag="--no-csharp")
    if args.wait_quiet > 0:
        wait_until_quiet(args.wait_quiet)
    result = run(args)
    log(f"SDK get_action p50 {result['sdk_python_us_p50']} us vs bare onnxruntime {result['onnxruntime_us_p50']} us "
        f"(overhead {result['sdk_overhead_us_p50']} us); p99 {result['sdk_python_us_p99']} us idle, "
        f"{result['sdk_python_us_p99_while_sending']} us while a {args.sending_batch}-step batch is in flight")
    if "sdk_cpp_us_p50" in result:
        log(f"C++ SDK get_action p50 {result['sdk_cpp_us_p50']} us vs bare ONNX Runtime C API "
            f"{result['ort_cpp_us_p50']} us; p99 {result['sdk_cpp_us_p99']} us idle, "
            f"{result['sdk_cpp_us_p99_while_sending']} us while sending; 256 agents in one frame "
            f"{result['sdk_cpp_batch256_us_p50']} us (backend+sampling {result['sdk_cpp_backend_batch256_us_p50']} us) "
            f"vs bare {result['ort_cpp_batch256_paced_us_p50']} us (ratio {result['sdk_cpp_batch256_ratio']}, "
            f"p99 {result['sdk_cpp_batch256_p99_vs_p50']}x p50); at a pace the server sustains "
            f"({result['sdk_cpp_batch256_sustained_frame_interval_us']} us, kept up: "
            f"{result['sdk_cpp_batch256_sustained_server_kept_up']}) {result['sdk_cpp_batch256_sustained_us_p50']} us "
            f"vs bare {result['ort_cpp_batch256_sustained_paced_us_p50']} us "
            f"(ratio {result['sdk_cpp_batch256_sustained_ratio']}, "
            f"p99 {result['sdk_cpp_batch256_sustained_p99_vs_p50']}x p50, bare's own p99 "
            f"{result['ort_cpp_batch256_sustained_paced_p99_vs_p50']}x its p50)")
    if "sdk_cpp_cnn_us_p50" in result:
        log(f"C++ SDK get_action on 84x84x4 images (Nature-CNN) p50 {result['sdk_cpp_cnn_us_p50']} us vs bare "
            f"ONNX Runtime C API {result['ort_cpp_cnn_us_p50']} us (ratio {result['sdk_cpp_cnn_ratio']}), "
            f"p99 {result['sdk_cpp_cnn_us_p99']} us; one episode never cut: {result['sdk_cpp_cnn_growing_us_p50']} us "
            f"(ratio {result['sdk_cpp_cnn_growing_ratio']})")
    if "sdk_csharp_us_p50" in result:
        log(f"C# SDK GetAction p50 {result['sdk_csharp_us_p50']} us vs its bare ONNX Runtime backend "
            f"{result['ort_csharp_us_p50']} us; p99 {result['sdk_csharp_us_p99']} us; "
            f"{result['sdk_csharp_allocated_bytes_per_call']} bytes allocated per call; 256 agents in one frame "
            f"{result['sdk_csharp_batch256_us_p50']} us vs bare {result['ort_csharp_batch256_paced_us_p50']} us "
            f"(ratio {result['sdk_csharp_batch256_ratio']}), {result['sdk_csharp_batch256_allocated_bytes_per_frame']} bytes per frame")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
