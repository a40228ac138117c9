import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_dagster_definitions_validate(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "PIPELINE_STATE_DIR": str(tmp_path / "state")}
    (tmp_path / "dagster.yaml").write_text("")
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All code locations passed validation" in out.stdout + out.stderr


def test_dg_check_defs(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "PIPELINE_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    out = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_core_imports_no_dagster_or_mlflow():
    code = (
        "import importlib, pkgutil, sys, components.core as c\n"
        "mods = [m.name for m in pkgutil.walk_packages(c.__path__, 'components.core.')]\n"
        "[importlib.import_module(m) for m in mods]\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('dagster', 'mlflow')]\n"
        "print(len(mods), bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert int(out.stdout.split()[0]) >= 5
