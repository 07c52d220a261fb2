"""What `dataflow profile` runs as the training step: nothing (capacity), a sleep, or a training program's step.

With `--config TRAINER.toml`, a training program registered for the `dataflow.profile` entry point
(the bundled trainer) builds the loader and the model step itself (`ProfileTarget`), so the loader is
measured against the compute it will really have to keep up with.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from dataflow.errors import ConfigError


@dataclass
class Consumer:
    """A step function over a batch, and how to describe it in the report."""

    step: Callable[[Any], None]
    description: str
    step_ms: float | None  # the nominal step time, when known in advance


def idle() -> Consumer:
    return Consumer(lambda batch: None, "no consumer", 0.0)


def sleeper(step_ms: float) -> Consumer:
    """A consumer busy `step_ms` per step (a sleep: it holds no CPU, like a step waiting on its GPU)."""
    if not (math.isfinite(step_ms) and step_ms >= 0):  # nan and inf pass a `< 0` check
        raise ConfigError(f"--step-ms must be a number of milliseconds >= 0, got {step_ms:g}")
    seconds = step_ms / 1e3
    return Consumer(lambda batch: time.sleep(seconds) if seconds else None, f"{step_ms:g} ms sleep per step",
                    step_ms)


@dataclass
class ProfileTarget:
    """What a training program hands `dataflow profile --config`: its own data pipeline and its step.

    A program registers `NAME = "module:function"` in the `dataflow.profile` entry-point group; the
    function takes the config path and returns this. The bundled trainer does (`trainer.profile`), so
    the profile measures the loader the trainer really builds (shuffle window, document masking...)
    against the compute it really runs, and `dataflow` never imports the trainer.
    """

    defaults: dict[str, Any]  # RunSettings fields read from the config (data, batch_size, seq_len, ...)
    make_loader: Callable[..., Any]  # (settings, **loader options) -> a StreamingDataLoader
    make_consumer: Callable[[int, int, str], Consumer]  # (vocab_size, seq_len, device) -> the step


def load_target(config: str) -> ProfileTarget:
    """The `ProfileTarget` for a training config, from the one program registered for `dataflow.profile`."""
    from importlib.metadata import entry_points

    found = list({e.value: e for e in entry_points(group="dataflow.profile")}.values())  # one per target
    if not found:
        raise ConfigError("--config needs a training program registered in the 'dataflow.profile' entry-point group "
                          "(the bundled trainer is: reinstall the project with `pip install -e .`)")
    if len(found) > 1:
        raise ConfigError(f"--config: several programs registered for 'dataflow.profile' "
                          f"({', '.join(e.name for e in found)}); uninstall all but one")
    try:
        make = found[0].load()
    except ImportError as e:
        raise ConfigError(f"--config: the registered training program {found[0].value} does not import: {e}") from None
    return make(config)
