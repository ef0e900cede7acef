"""The ``tether`` command: ``tether serve`` runs a training server, ``tether
demo`` trains CartPole with example clients and shows the learned return, ``tether
pretrain`` clones demonstrations into a checkpoint and ``tether demos`` shows or converts them."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .config import add_config_arguments, config_from_args, host_in_url

REPO_ROOT = Path(__file__).resolve().parents[1]


def _console(args: argparse.Namespace) -> int:
    """Serves the console of a finished run, read-only, from the log it left in --logdir."""
    import json
    import math

    from .console import server as console_server
    from .console.state import SAVED_RUN

    path = Path(args.logdir) / SAVED_RUN

    def not_json(constant: str) -> None:  # (json.loads takes NaN and Infinity, which JSON has not)
        raise ValueError(f"{constant} is not a JSON number")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value

    try:
        saved = json.loads(path.read_text(), parse_constant=not_json, parse_float=finite)
        if not isinstance(saved, dict):
            raise ValueError("it is not a JSON object")
        for key in ("episodes", "episode_details", "history"):
            if not isinstance(saved.get(key, {}), dict):
                raise ValueError(f"{key} is not an object")
    except (OSError, ValueError, RecursionError) as exc:
        print(f"tether console: cannot read {path} (a server run with --console-port writes it): {exc}", file=sys.stderr)
        return 2
    saved["read_only"] = True

    async def main() -> None:
        console = console_server.ConsoleServer(None, args.host, args.port, None, saved_run=saved)
        await console.start()
        print(f"[tether] console (read-only, {path}): http://{host_in_url(args.host)}:{console.port}/", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await console.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .app import run
    from .config import ConfigError
    from .distributed.rank_group import RankGroupError

    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"tether serve: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        summary = run(config)
    except ConfigError as exc:  # a configuration the server cannot run: say what, no traceback
        print(f"tether serve: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except RankGroupError as exc:  # (the group could not form: a rendezvous that did not complete)
        print(f"tether serve: error: {exc}", file=sys.stderr, flush=True)
        return 1
    # A rank whose group failed exits non-zero: torchrun stops the others and, with --max-restarts,
    # starts the group again, each rank resuming its checkpoint (docs/scale-out.md).
    return 1 if (summary.get("group") or {}).get("failure") else 0


def _pretrain(args: argparse.Namespace) -> int:
    import json

    from .config import ConfigError
    from .pretrain import pretrain

    try:
        config = config_from_args(args)
        report = pretrain(config, args.dataset, args.out, args.epochs, args.module or None)
    except (ValueError, ConfigError) as exc:
        print(f"tether pretrain: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(report), flush=True)
    return 0


def _demos(args: argparse.Namespace) -> int:
    import json

    from tether.protocol.demonstrations import DemonstrationError

    from .minari_datasets import load_demonstrations, write_minari

    try:
        demos = load_demonstrations(args.source, args.module)
        if args.action == "show":
            print(json.dumps({"modules": {m: {"episodes": len(demos.of_module(m)), "steps": demos.steps(m),
                                              "logged_steps": int(sum(int(e.chunk.logged.sum()) for e in demos.of_module(m)
                                                                      if e.chunk.logged is not None))}
                                          for m in demos.modules}}), flush=True)
            return 0
        if not args.out:
            raise ValueError("convert needs --out (a new folder for the Minari dataset)")
        if args.module in demos.modules or len(demos.modules) == 1:
            module = args.module if args.module in demos.modules else next(iter(demos.modules))
        else:  # (a file of several modules, or none: which one is not guessed)
            raise ValueError(f"--module {args.module!r} is not one of the file's modules {sorted(demos.modules)}")
        print(write_minari(demos, module, args.out, args.name), flush=True)
    except (DemonstrationError, ValueError, OSError) as exc:
        print(f"tether demos: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def evaluate_policy(policy_path: Path, episodes: int = 10, seed: int = 1000, env_id: str = "CartPole-v1") -> float:
    """Mean return of the greedy policy in ``policy_path`` on a Gymnasium game (default CartPole-v1; the
    model's most likely action or mean, §11; run with ONNX Runtime as a client would, without the
    client package; a Box action clipped into its bounds as an engine does)."""
    import gymnasium as gym
    import numpy as np
    import onnxruntime as ort

    from tether.protocol.distributions import deterministic, to_env_action
    from tether.protocol.spaces import from_gymnasium

    session = ort.InferenceSession(policy_path.read_bytes(), providers=["CPUExecutionProvider"])
    input_name, output_name = session.get_inputs()[0].name, session.get_outputs()[0].name
    env = gym.make(env_id)
    space = from_gymnasium(env.action_space)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            dist = session.run([output_name], {input_name: np.asarray(obs, np.float32)[None]})[0][0]
            obs, reward, terminated, truncated, _ = env.step(to_env_action(space, deterministic(space, dist)))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def _demo(args: argparse.Namespace) -> int:
    from .app import serve
    from .config import ServerConfig

    logdir = args.logdir or tempfile.mkdtemp(prefix="tether-demo-")
    config = ServerConfig(
        port=args.port,
        env="CartPole-v1",
        stop_at_return=args.target,
        max_env_steps=args.max_env_steps,
        logdir=logdir,
        seed=args.seed,
    )
    client_script = REPO_ROOT / "examples" / "cartpole_client.py"
    print(f"[tether demo] training CartPole-v1 with {args.clients} client(s) until the mean return of "
          f"the last 100 episodes reaches {args.target:g} (at most {args.max_env_steps} env steps)", flush=True)

    async def main() -> dict:
        ready = asyncio.Event()
        server_task = asyncio.create_task(serve(config, ready))
        await ready.wait()
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        clients = [
            subprocess.Popen([sys.executable, str(client_script), "--port", str(config.port), "--seed", str(args.seed + i)],
                             env=env)
            for i in range(args.clients)
        ]
        try:
            return await server_task
        finally:
            # Told that training is done (§6.6), each client ends its episode, reports and exits.
            deadline = time.monotonic() + 10
            for c in clients:
                try:
                    c.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.terminate()
            for c in clients:
                c.wait()

    summary = asyncio.run(main())
    reached = summary["reached_target_at"] is not None
    print(f"[tether demo] {'reached' if reached else 'did not reach'} mean return {summary['return_mean']:.1f} "
          f"after {summary['env_steps']} env steps in {summary['wall_s']:.1f} s", flush=True)
    learned = evaluate_policy(Path(summary["policy"]))
    print(f"[tether demo] learned policy's return (greedy, mean of 10 episodes): {learned:.1f}", flush=True)
    print(f"[tether demo] policy: {summary['policy']}  checkpoint: {summary['checkpoint']}", flush=True)
    return 0 if reached else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tether", description="Tether: train agents that live in your engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a training server", description="Run a Tether training server.")
    add_config_arguments(serve)
    serve.set_defaults(func=_serve)
    console = sub.add_parser("console", help="show a finished run's console, read-only",
                             description="Serve the live console's page for a finished run, read-only, from the "
                                         "console.json that `tether serve --console-port` wrote into its logdir.")
    console.add_argument("--logdir", required=True, help="the run's logdir")
    console.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks a free one)")
    console.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    console.set_defaults(func=_console)
    demo = sub.add_parser("demo", help="train CartPole with example clients and report the learned return",
                          description="Start a server and N CartPole client processes, train until the "
                          "target return, then evaluate the learned policy.")
    demo.add_argument("--clients", type=int, default=1, help="number of CartPole client processes (default: 1)")
    demo.add_argument("--port", type=int, default=5555, help="server port (default: 5555)")
    demo.add_argument("--target", type=float, default=450.0, help="stop at this mean return of the last 100 episodes (default: 450)")
    demo.add_argument("--max-env-steps", type=int, default=400_000, help="give up after this many env steps (default: 400000)")
    demo.add_argument("--seed", type=int, default=0, help="seed for the learner and the clients (default: 0)")
    demo.add_argument("--logdir", default=None, help="where to write TensorBoard files, checkpoint and policy (default: a temp folder)")
    demo.set_defaults(func=_demo)
    pretrain = sub.add_parser(
        "pretrain", help="behavioural cloning from demonstrations into a checkpoint `tether serve` starts from",
        description="Build the modules as `tether serve` would (same options) and train them by behavioural "
                    "cloning on a demonstration file (.jsonl) or a Minari dataset folder; write a checkpoint "
                    "for `tether serve --init-from` and each module's ONNX policy beside it.")
    add_config_arguments(pretrain)
    pretrain.add_argument("--dataset", required=True, help="a demonstration file (.jsonl) or a Minari dataset folder")
    pretrain.add_argument("--out", required=True, help="the checkpoint to write (e.g. pretrained.pt)")
    pretrain.add_argument("--epochs", type=int, default=100, help="passes over the dataset (default: 100)")
    pretrain.add_argument("--module", action="append", help="a module to pretrain (repeatable; default: those the "
                                                           "dataset holds, or the one module)")
    pretrain.set_defaults(func=_pretrain)
    demos = sub.add_parser("demos", help="show a demonstration file or dataset, or convert one to a Minari dataset",
                           description="show: episodes and steps per module; convert: a demonstration file's "
                                       "episodes of one module as a Minari dataset folder.")
    demos.add_argument("action", choices=["show", "convert"])
    demos.add_argument("source", help="a demonstration file (.jsonl) or a Minari dataset folder")
    demos.add_argument("--out", help="convert: the Minari dataset folder to create")
    demos.add_argument("--module", default="default_policy",
                       help="the module (default: default_policy; a Minari dataset's episodes are taken as its)")
    demos.add_argument("--name", default="demonstrations", help="convert: the dataset's name (id tether/NAME-v0)")
    demos.set_defaults(func=_demos)
    from tether.checker import check_client

    check = sub.add_parser("check-client", help="check a client program against the protocol (exit status = failures)",
                           description=check_client.__doc__.split("\n\n")[0])
    check_client.add_arguments(check)
    check.set_defaults(func=check_client.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
