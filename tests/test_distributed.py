"""Data-parallel training in the core: 2 gloo processes under torchrun against 1 process at the same
global batch, resuming a 1-process checkpoint in 2 processes and a 2-process one in 1, a world size
that does not fit refused before anything launches. (tests/test_ddp_asset.py: the same through
a Dagster asset, Pipes and MLflow, with a rank killed.)

Tolerance: at the same global batch, on blocks that are all full (see `labels`), the trajectories
differ only by float summation order (a batch of 4 per rank, averaged, against one of 8). Every
logged loss must agree within 1e-4 nats; measured here: at most 2e-7 over the legs below (a fresh
2-process run from step 0 drifts more while the lr is high: 5e-5 at step 20, 7e-4 at step 40), while
another draw of the batches (another seed) moves the same losses by 0.006-0.05 nats.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components.core.artifacts import sha256_file, write_json
from components.core.checkpoint import CHECKPOINT_DIR, read_metadata
from components.core.data import IGNORE_INDEX
from components.core.distributed import (
    RESULT_FILE,
    LaunchSettings,
    WorkerSpec,
    check_world_size,
    cpu_cores,
    read_train_result,
    run_worker,
    world_size_problems,
    write_spec,
)
from components.core.errors import ConfigError, PipelineInputError
from components.core.labels import LabelSettings, build_labels
from components.core.tokenizer import TokenizerSettings, train_tokenizer
from components.core.train_settings import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # torchrun with gloo processes


@pytest.fixture(scope="module")
def labels(tmp_path_factory, wiki_texts):
    """A labels folder as the `labels` asset writes it (Wikipedia articles, 512-token BPE, blocks of
    32), less the train split's last block, the only one with padding: with it, a batch that draws it
    weighs its few targets differently in one process (one mean over the batch) and in two (a mean
    of the ranks' means) — a real difference, not rounding, which this comparison leaves out."""
    d = tmp_path_factory.mktemp("labels")
    tok = train_tokenizer(wiki_texts[:12], TokenizerSettings(vocab_size=512))
    tok.save(str(d / "tokenizer.json"))
    result = build_labels(
        {"train": wiki_texts[:8], "validation": wiki_texts[20:22]},
        d / "tokenizer.json",
        LabelSettings(block_size=32),
        d / "labels",
    )
    x, y = np.load(result.path / "train_x.npy"), np.load(result.path / "train_y.npy")
    assert (y[-1] == IGNORE_INDEX).any() and not (y[:-1] == IGNORE_INDEX).any()
    np.save(result.path / "train_x.npy", x[:-1])
    np.save(result.path / "train_y.npy", y[:-1])
    write_json(result.path / "meta.json", {**result.meta, "train_blocks": len(x) - 1})
    return result.path, result.meta["tokenizer_sha256"]


def settings(**kw) -> TrainSettings:
    # lr_decay_steps fixed: a 20-step leg follows the schedule of the 40-step run it is part of.
    base = dict(
        max_steps=40,
        lr_decay_steps=40,
        batch_size=8,
        lr=1e-2,
        min_lr=1e-3,
        warmup_steps=3,
        eval_interval=10,
        eval_batches=2,
        log_interval=5,
        device="cpu",
        seed=7,
        dtype="float32",
    )  # the resume comparisons hold at float32 rounding ('auto' is bf16 on a CPU with AMX)
    return TrainSettings(**{**base, **kw})


def make_spec(labels, out_dir: Path, **train) -> WorkerSpec:
    folder, tok_sha = labels
    return WorkerSpec(
        family="transformer",
        model=MODEL,
        train=settings(**train),
        labels=str(folder),
        labels_sha256={p.name: sha256_file(p) for p in sorted(Path(folder).iterdir())},
        tokenizer_sha256=tok_sha,
        out_dir=str(out_dir),
    )


def torchrun(spec: WorkerSpec, nproc: int = 2) -> subprocess.CompletedProcess:
    path = write_spec(spec, Path(spec.out_dir).parent / f"{Path(spec.out_dir).name}.spec.json")
    return subprocess.run(
        [sys.executable, "-m", "components.core.distributed", "launch", f"--nproc-per-node={nproc}", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def losses(history: list[dict], key: str) -> dict[int, float]:
    return {h["step"]: h[key] for h in history if key in h}


def assert_close(a: dict[int, float], b: dict[int, float]) -> float:
    assert a and set(a) == set(b), (sorted(a), sorted(b))
    worst = max(abs(a[s] - b[s]) for s in a)
    assert worst < TOL, {s: (a[s], b[s]) for s in a}
    return worst


@pytest.fixture(scope="module")
def one_process(labels, tmp_path_factory):
    """The reference: 40 steps in this process (world size 1), global batch 8."""
    return run_worker(make_spec(labels, tmp_path_factory.mktemp("ref") / "run"))


@pytest.fixture(scope="module")
def legs(labels, tmp_path_factory):
    """The same 40 steps in three legs: 1 process to step 20, 2 gloo processes under torchrun (4
    blocks each) to step 30, 1 process to step 40, each resuming the previous leg's checkpoint."""
    import shutil

    out = tmp_path_factory.mktemp("legs") / "run"
    first = run_worker(make_spec(labels, out, max_steps=20))
    shutil.copytree(out / CHECKPOINT_DIR, out.parent / "step20")  # kept for the FSDP test
    proc = torchrun(make_spec(labels, out, max_steps=30))
    assert proc.returncode == 0, proc.stderr[-4000:]
    ddp, extra = read_train_result(out / RESULT_FILE)
    ddp_files = {
        "checkpoint_step": read_metadata(out / CHECKPOINT_DIR)["step"],
        "history": json.loads((out / "history.json").read_text()),
    }
    last = run_worker(make_spec(labels, out))
    return first, (ddp, extra, ddp_files), last


def steps(history: list[dict], key: str, lo: int, hi: int) -> dict[int, float]:
    return {k: v for k, v in losses(history, key).items() if lo < k <= hi}


def test_two_gloo_processes_match_one_process_at_the_same_global_batch(one_process, legs):
    """1 → 2: a one-process checkpoint resumes in two processes, which continue the reference."""
    _, (ddp, extra, files), _ = legs
    assert extra == {"world_size": 2, "backend": "gloo", "strategy": "ddp", "rank0_params": ddp.params}
    assert ddp.resumed_from == 20 and ddp.steps == 30
    for key in ("train/loss", "val/loss"):
        assert_close(steps(ddp.history, key, 20, 30), steps(one_process.history, key, 20, 30))
    # The history before the resume is the checkpoint's: the first leg's, as logged.
    assert steps(ddp.history, "train/loss", 0, 20) == steps(legs[0].history, "train/loss", 0, 20)
    # Throughput counts the global batch: 8 blocks of 32 tokens per step, whatever the world size.
    point = ddp.history[-1]
    assert point["tokens_per_s"] == pytest.approx(8 * 32 / (point["step_ms"] / 1000))
    # Rank 0 alone wrote the files: a checkpoint at step 30, its history.
    assert files["checkpoint_step"] == "30" and files["history"] == ddp.history


def test_a_two_process_checkpoint_resumes_in_one_process(one_process, legs):
    """2 → 1: the same global batch of the same blocks, so the last leg ends where the reference does."""
    _, _, last = legs
    assert last.resumed_from == 30 and last.steps == 40 and last.warnings == []  # nothing trajectory-changing changed
    for key in ("train/loss", "val/loss"):
        assert_close(steps(last.history, key, 30, 40), steps(one_process.history, key, 30, 40))
    assert abs(last.val_loss - one_process.val_loss) < TOL


def test_a_world_size_that_does_not_fit_is_refused_before_anything_launches(labels, tmp_path):
    cores = cpu_cores()
    too_many = LaunchSettings(launcher="torchrun", nproc_per_node=cores + 1)
    cpu = settings(batch_size=8 * (cores + 1))
    (problem,) = world_size_problems(too_many, cpu)
    assert f"train.nproc_per_node={cores + 1} CPU processes do not fit" in problem and f"{cores} CPU core" in problem
    # More GPU processes than GPUs (none here: device=cuda on this machine has 0), and a batch that does not split.
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and not __import__("torch").cuda.is_available():
        (gpu_problem,) = world_size_problems(
            LaunchSettings(launcher="torchrun", nproc_per_node=2), settings(device="cuda")
        )
        assert "train.nproc_per_node=2 GPU processes do not fit this machine: it has 0 GPU(s)" in gpu_problem
    (odd,) = world_size_problems(LaunchSettings(launcher="torchrun", nproc_per_node=2), settings(batch_size=7))
    assert "train.batch_size=7 is the global batch" in odd and "multiple of train.nproc_per_node=2" in odd
    assert world_size_problems(LaunchSettings(launcher="inprocess", nproc_per_node=cores + 1), cpu) == []
    with pytest.raises(ConfigError, match="nothing was launched"):
        check_world_size(too_many, cpu)

    # The launcher refuses before torchrun starts anything: no rank ran, nothing was written.
    out = tmp_path / "run"
    proc = torchrun(make_spec(labels, out, batch_size=8 * (cores + 1)), nproc=cores + 1)
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("ConfigError: train.nproc_per_node=")
        and "nothing was launched" in proc.stderr
    )
    assert not out.exists()


def test_a_rank_refuses_labels_that_changed_since_the_launch(labels, tmp_path):
    spec = make_spec(labels, tmp_path / "run")
    name = next(iter(spec.labels_sha256))
    spec.labels_sha256[name] = "0" * 64
    with pytest.raises(PipelineInputError, match=rf"{name} has sha256 .* but the spec expects 000000000000"):
        run_worker(spec)
    assert not (tmp_path / "run").exists()


def test_fsdp_shards_the_model_and_checkpoints_in_the_one_format(labels, one_process, legs, tmp_path):
    """FSDP2 (`strategy: fsdp`): rank 0 holds about half the parameters; the one-process checkpoint
    of step 20 resumes sharded over 2 gloo processes, which continue the reference to step 30, and
    their checkpoint is the unsharded format (it loads into a plain model and resumes in one process)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(Path(legs[0].checkpoint_dir).parent.parent / "step20", out / CHECKPOINT_DIR)  # the first leg's
    spec = make_spec(labels, out, max_steps=30)
    proc = torchrun(spec.model_copy(update={"strategy": "fsdp"}))
    assert proc.returncode == 0, proc.stderr[-4000:]
    fsdp, extra = read_train_result(out / RESULT_FILE)
    assert (extra["strategy"], extra["world_size"], fsdp.resumed_from, fsdp.steps) == ("fsdp", 2, 20, 30)
    assert 0.45 * fsdp.params < extra["rank0_params"] < 0.55 * fsdp.params  # its shards only
    for key in ("train/loss", "val/loss"):
        assert_close(steps(fsdp.history, key, 20, 30), steps(one_process.history, key, 20, 30))
    last = run_worker(make_spec(labels, out))  # the sharded run's checkpoint, in one process
    assert last.resumed_from == 30 and abs(last.val_loss - one_process.val_loss) < TOL


@pytest.mark.parametrize(
    "wait",
    [
        "time.sleep(120)",
        # Native code that keeps the GIL (ctypes.PyDLL does not release it), as a C++ destructor that
        # joins a thread does: the watch thread cannot run, the kernel's signal still arrives.
        "ctypes.PyDLL(None).sleep(120)",
    ],
    ids=["python", "native_code_holding_the_gil"],
)
def test_a_rank_or_launcher_whose_parent_dies_stops(tmp_path, wait):
    """What keeps a killed step from leaving processes that train on into the checkpoint folder:
    a process under `exit_with_parent` (every rank, and the launcher, whose SIGTERM makes torchrun stop
    its ranks) ends within a second of its parent's death. Here the parent is a shell killed -9."""
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    code = (
        "import ctypes, os, time; from components.core.distributed import exit_with_parent; exit_with_parent(0.1); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); {wait}"
    )
    shell = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" -c "{code}"; sleep 120'], cwd=ROOT, start_new_session=True
    )
    try:
        deadline = time.time() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline and shell.poll() is None, "the child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        os.kill(shell.pid, signal.SIGKILL)
        shell.wait()
        deadline = time.time() + 5
        while alive(child):
            assert time.time() < deadline, "the orphan kept running"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)  # the shell's session: whatever is left of it
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (OSError, IndexError):
        return False


def listeners() -> list[tuple[str, set[int]]]:
    """(local address:port, owning pids) of every listening TCP socket this user's processes hold (`ss -ltnpH`)."""
    import re

    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [
        (line.split()[3], {int(p) for p in re.findall(r"pid=(\d+)", line)})
        for line in out.splitlines()
        if "pid=" in line
    ]


def descendants(root: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, set()).add(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def test_a_torchrun_launch_listens_on_loopback_only(labels, tmp_path):
    """The launcher's rendezvous store and every rank's sockets listen on 127.0.0.1 (or ::1) alone,
    watched with `ss -ltnp` for as long as a 2-process launch runs; at least one listener of the
    launch is seen, so the check cannot pass on a launch that was never watched."""
    import shutil
    import time

    if not shutil.which("ss"):
        pytest.skip("needs ss (iproute2)")
    spec = make_spec(labels, tmp_path / "run", max_steps=30, eval_interval=30)
    path = write_spec(spec, tmp_path / "run.spec.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.core.distributed", "launch", "--nproc-per-node=2", str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict[str, set[int]] = {}
    try:
        while proc.poll() is None:
            tree = descendants(proc.pid)
            for addr, pids in listeners():
                if pids & tree:
                    seen.setdefault(addr, set()).update(pids)
            time.sleep(0.1)
    finally:
        proc.kill() if proc.poll() is None else None
        output = proc.communicate()[0]
    assert proc.returncode == 0, output[-3000:]
    assert seen, "no listening socket of the launch was seen"
    outside = [a for a in seen if not (a.startswith("127.0.0.1:") or a.startswith("[::1]:"))]
    assert not outside, f"listening outside loopback: {outside} (all: {sorted(seen)})"
