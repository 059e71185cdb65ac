"""benchmarks/step_profile.py end to end on the smallest case: a step time and a profile of named ops."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_case_prints_its_median_step_and_its_profile():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.step_profile", "cnn", "nonprivate", "--steps", "2", "--warmup", "1",
         "--profile"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    median = re.search(r"cnn nonprivate: median ([\d.]+) ms over 2 steps", done.stdout)
    assert median and float(median.group(1)) > 0
    assert "aten::mkldnn_convolution" in done.stdout or "aten::convolution" in done.stdout
