"""A claim's verdict as Dagster shows it on the check page: one line that says why, first."""

from __future__ import annotations

import subprocess
import sys

from components.core.claims import CLAIMS, verdict
from components.orchestration.checks import check_result

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_a_failed_check_says_which_part_failed_in_one_line():
    c = next(c for c in CLAIMS if not c.warn)
    failed = check_result(
        c, verdict({"below_uniform": False, "finite": True}, {"val_loss": 6.123456789, "uniform_loss": 5.0})
    )
    assert not failed.passed
    assert (
        failed.description
        == failed.metadata["reason"].value
        == "failed: not below_uniform — val_loss 6.123; uniform_loss 5"
    )
    assert failed.metadata["val_loss"].value == 6.123456789  # the figure itself; the reason line rounds it
    passed = check_result(c, verdict({"below_uniform": True}, {}))
    assert passed.passed and passed.description == "passed: below_uniform"
    warn = next(c for c in CLAIMS if c.warn)
    assert check_result(warn, verdict({"x": False})).description.startswith("warning: not x")


def test_launch_names_the_jobs_when_one_is_unknown(tmp_path):
    env = {
        "PIPELINE_STATE_DIR": str(tmp_path / "state"),
        "DAGSTER_HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.launch", "no_such_job"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "no job 'no_such_job' in code location 'wordvec_to_transformer'" in out.stderr and "tiny_pipeline" in out.stderr
    )
