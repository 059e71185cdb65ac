"""What a run prints: dpbench's lines and summary, library chatter in dpbench.log, and on a terminal one progress
bar over the whole run with its ETA."""

import contextlib
import fcntl
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import sysconfig
import termios
import warnings
from pathlib import Path

from dpbench.app.run_output import LIBRARY_WARNINGS, library_warnings_to_log
from dpbench.leaderboard.launch import launch_fork
from tests.helpers.cli import FAST, ROOT, dpbench

SUMMARY_LINES = 15
WHOLE_RUN_BAR = re.compile(r"\d+/20 \[\d\d:\d\d<\d\d:\d\d")  # steps of the run, elapsed < ETA


def _on_a_terminal(*args: str) -> str:
    """`python -m dpbench` with stdout and stderr on a 120-column pseudo-terminal; what it showed there."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "dpbench", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                               stdout=terminal, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert process.wait(timeout=300) == 0, shown.decode()[-3000:]
    return shown.decode()


def test_default_run_prints_its_own_lines_and_logs_the_rest(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DATA_DIR": str(tmp_path / "wandb_data"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config")}
    run_dir = tmp_path / "run"
    run = dpbench("max_steps=4", f"hydra.run.dir={run_dir}", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).splitlines()
    summary = lines.index("dpbench run summary") - 1
    own = [line for line in lines[:summary] if "][dpbench." not in line]
    assert own == [] and len(lines[summary:]) == SUMMARY_LINES + 1, "\n".join(lines)  # + the W&B upload command
    assert lines[-1].startswith("W&B run saved offline; to upload it: wandb sync ")
    log = (run_dir / "dpbench.log").read_text()
    assert "[lightning.pytorch" in log and "GPU available" in log and "model=cnn: 26,010 parameters" in log


def test_a_run_forked_after_lightning_was_imported_prints_its_own_lines_too(tmp_path):
    """The leaderboard's fork launcher imports Lightning before any logging is set up, and Lightning then gives its
    own loggers a console handler that bypasses the root logger's filter (its cells' logs showed its INFO lines)."""
    run_dir, log = tmp_path / "run", tmp_path / "cell.log"
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with contextlib.chdir(ROOT):
        code = launch_fork(["max_steps=2", f"hydra.run.dir={run_dir}", *FAST], log, env)
    lines = log.read_text().splitlines()
    assert code == 0, "\n".join(lines[-40:])
    summary = lines.index("dpbench run summary") - 1
    assert [line for line in lines[:summary] if "][dpbench." not in line] == [], "\n".join(lines)
    assert "GPU available" in (run_dir / "dpbench.log").read_text()


def test_library_warnings_go_to_the_log_and_others_to_the_terminal(tmp_path, caplog):
    library = str(Path(sysconfig.get_paths()["purelib"]) / "somelib" / "module.py")
    caplog.set_level(logging.INFO, logger=LIBRARY_WARNINGS)
    with warnings.catch_warnings(record=True) as shown, library_warnings_to_log():
        warnings.simplefilter("always")
        warnings.warn_explicit("deprecated inside a library", FutureWarning, library, 3)
        warnings.warn_explicit("about the user's own model", UserWarning, str(tmp_path / "my_model.py"), 7)
    assert [str(warning.message) for warning in shown] == ["about the user's own model"]
    assert [record.getMessage() for record in caplog.records] == [
        f"{library}:3: FutureWarning: deprecated inside a library"]


def test_one_progress_bar_over_the_whole_run_on_a_terminal_only(tmp_path):
    shown = _on_a_terminal("max_steps=20", "batch_size=250", "trainer.checkpoint=false",
                           f"hydra.run.dir={tmp_path / 'bar'}", "eval_batch_size=1000")  # 16 steps an epoch
    assert "20/20 [" in shown and WHOLE_RUN_BAR.search(shown) and "/16 " not in shown, shown[-3000:]
    assert "dpbench run summary" in shown
    quiet = _on_a_terminal("max_steps=3", "batch_size=250", "trainer.checkpoint=false",
                           f"hydra.run.dir={tmp_path / 'quiet'}", *FAST)
    assert "3/3" not in quiet and "training:" not in quiet and "dpbench run summary" in quiet, quiet[-3000:]
