"""The console's controls: pause and resume training, save a checkpoint, change a
module's learning rate or entropy coefficient, change an environment parameter or the
curriculum's lesson, stop the server. Each one needs the
control token, is logged in the console's event log and, with TensorBoard on,
written as a scalar."""

from __future__ import annotations

import hmac
import math
from typing import Any

from ..curriculum import CurriculumError
from .state import ConsoleState

#: The largest learning rate or entropy coefficient a control may set: past it, training only diverges.
MAX_VALUE = 1.0
ACTIONS = ("pause", "resume", "checkpoint", "set_lr", "set_ent_coef", "set_param", "set_lesson", "stop")


class ControlError(Exception):
    """A control the console refuses, with the reason the page shows."""


async def apply_control(state: ConsoleState, token: str, message: dict[str, Any]) -> dict[str, Any]:
    """Carries out one control message; returns what was done. Raises ControlError."""
    given = message.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode()):
        state.event("control_refused", action=str(message.get("action"))[:40], message="no valid control token")
        raise ControlError("controls need the console's token")
    action = message.get("action")
    if action not in ACTIONS:
        raise ControlError(f"unknown action {str(action)[:40]!r}; one of {', '.join(ACTIONS)}")
    trainer = state.trainer
    done: dict[str, Any] = {"action": action}
    if action == "pause":
        trainer.pause()
    elif action == "resume":
        trainer.resume()
    elif action == "checkpoint":
        if getattr(trainer, "group", None) is not None:
            raise ControlError("several ranks checkpoint together, every checkpoint_every updates: a checkpoint "
                               "of rank 0 alone could not be resumed from (docs/scale-out.md)")
        # Taken on the loop between updates (not in the executor): a batch stored meanwhile would
        # miss the checkpoint's pool while its journal generation is deleted.
        path = await trainer.checkpoint_now()
        done["path"] = str(path)
    elif action in ("set_lr", "set_ent_coef"):
        module = message.get("module")
        if not isinstance(module, str) or module not in trainer.modules:
            raise ControlError(f"no module {str(module)[:80]!r}; modules: {', '.join(trainer.modules)}")
        value = message.get("value")
        # (an int too large for a float, 10**400, is refused before math.isfinite would overflow)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_VALUE \
                or not math.isfinite(value):
            raise ControlError(f"value must be a number from 0 to {MAX_VALUE:g}")
        if action == "set_lr":
            trainer.set_learning_rate(module, float(value))
        else:
            trainer.set_entropy_coef(module, float(value))
        done.update(module=module, value=float(value))
    elif action in ("set_param", "set_lesson"):
        curriculum = trainer.curriculum
        if curriculum is None:
            raise ControlError("this run has no curriculum: start the server with a [curriculum] table")
        try:
            if action == "set_param":
                value = curriculum.set_param(message.get("name"), message.get("value"))
                done.update(name=message["name"], value=value)
            else:
                curriculum.set_lesson(message.get("lesson"))
                done.update(lesson=curriculum.lesson)
        except CurriculumError as exc:
            raise ControlError(str(exc)) from None
        done["set_seq"] = curriculum.seq  # ("seq" numbers the event log's entries)
        trainer.curriculum_changed()
    elif action == "stop":
        trainer.request_stop("console")  # an operator's stop, as a signal: no TRAINING_DONE (§6.6)
    state.event("control", **done)
    _to_tensorboard(trainer, done)
    return done


def _to_tensorboard(trainer: Any, done: dict[str, Any]) -> None:
    if trainer.tensorboard is None:
        return
    action = done["action"]
    if action in ("set_lr", "set_ent_coef"):
        key = f"console/{done['module']}/{action[4:]}"
        value = done["value"]
    elif action in ("set_param", "set_lesson"):
        return  # (written by trainer.curriculum_changed as curriculum/*)
    else:
        key, value = f"console/{action}", 1.0
    try:
        trainer.tensorboard.write({key: value}, trainer.metrics.env_steps_received)
    except Exception:  # the log must not take a control down
        pass
