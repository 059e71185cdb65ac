"""Errors that stop a run before it can do anything wrong, with a message a user can act on."""

import difflib
import signal
from pathlib import Path


class ConfigurationError(ValueError):
    """A configuration that dpbench refuses: unknown keys, impossible budgets, unsupported models or data."""


class UnsupportedModelError(ConfigurationError):
    """The model has a layer that the chosen privatizer cannot handle privately."""


class NonFiniteStepError(ConfigurationError):
    """A private step whose gradient or updated model is not finite: the run stops before releasing it."""


class MissingDataError(ConfigurationError):
    """Offline data is not installed, or a data set is empty or unknown."""


class RunInterrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; `resume=true` continues it."""

    def __init__(self, signum: int, step: int | None, checkpoint: Path | None):
        """`step` None: stopped outside training (starting up, or at once by a second signal)."""
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        if step is None:
            super().__init__(f"stopped by {name} outside a training step: no new checkpoint was written")
            return
        where = (f"checkpoint {checkpoint} (continue with resume=true and the same hydra.run.dir)" if checkpoint else
                 "no checkpoint (trainer.checkpoint=false): nothing to resume")
        super().__init__(f"stopped by {name} after step {step}; {where}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

def did_you_mean(word: str, candidates: list[str], prefix: str = "") -> str:
    """The hint an error gives for a mistyped name: up to three close candidates, each with `prefix`."""
    starting = [c for c in candidates if len(word) >= 3 and c.startswith(word) and c != word]
    close = list(dict.fromkeys(difflib.get_close_matches(word, candidates, n=3, cutoff=0.6) + starting))[:3]
    return f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else ""
