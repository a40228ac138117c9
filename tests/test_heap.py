"""Freed memory kept by the process (components/core/heap.py): a training faults in fewer pages and
computes the same numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.heap import ENV, keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, tempfile
import numpy as np, torch
from components.core.data import TokenBlocks
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.train_settings import TrainSettings
from components.core.training import train
rng = np.random.default_rng(0)
x = rng.integers(1, 256, size=(64, 128)).astype(np.uint16)  # token 0 is padding, never a target
blocks = TokenBlocks(x, np.roll(x, -1, axis=1).astype(np.int32))
torch.manual_seed(0)
model = Transformer(TransformerSettings(n_layer=2, n_head=4, n_embd=128, block_size=128), 256)
ts = TrainSettings(max_steps=30, batch_size=8, eval_interval=0, eval_batches=1, log_interval=10,
                   device="cpu", dtype="float32", threads=1, seed=0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with tempfile.TemporaryDirectory() as out:
    res = train(model, blocks, blocks, ts, out)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults, "loss": float(res.val_loss)}))
"""


def _train_in_child(keep: bool) -> dict:
    env = {**os.environ, ENV: "1" if keep else "0"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not keep_freed_memory(), reason="glibc only: mallopt is what this sets")
def test_a_training_keeping_freed_memory_faults_less_and_computes_the_same():
    kept, default = _train_in_child(True), _train_in_child(False)
    assert kept["loss"] == default["loss"]
    assert kept["faults"] < 0.5 * default["faults"], (kept, default)


def test_the_setting_can_be_left_off(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    assert keep_freed_memory() is False
