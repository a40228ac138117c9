import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_dagster_definitions_validate(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "PIPELINE_STATE_DIR": str(tmp_path / "state")}
    (tmp_path / "dagster.yaml").write_text("")
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All code locations passed validation" in out.stdout + out.stderr


def test_dg_check_defs(tmp_path):
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "DAGSTER_HOME": str(tmp_path),
        "PIPELINE_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(
        [str(BIN / "dg"), "check", "defs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
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


def test_assets_carry_code_versions_owners_tags_and_freshness(monkeypatch):
    """Set in one place (pipelines/definitions.py): every asset has a code version, owners and tags;
    the language models, retrained weekly, a freshness policy. A code version moves with the asset's
    own module, the core modules it reaches and its config defaults, not with shared plumbing."""
    import datetime as dt

    from components.orchestration import versions
    from components.orchestration.language_model import LM_TAG
    from pipelines.definitions import build_defs, defs

    graph = defs.resolve_asset_graph()
    nodes = {k.to_user_string(): graph.get(k) for k in graph.get_all_asset_keys()}
    lms = {k for k, n in nodes.items() if LM_TAG in n.tags}
    assert {"rnn_lm", "lstm_lm", "transformer_lm"} <= lms
    for key, n in nodes.items():
        assert n.code_version and len(n.code_version) == 16, key
        assert n.owners == ["team:ml"] and n.tags["project"] == "wordvec-to-transformer", key
        assert n.tags["role"] == (
            "data"
            if key
            in ("corpus", "tokenizer", "labels", "corpus_shards", "shard_tokenizer", "label_shards", "sharded_labels")
            else "model"
            if key in lms | {"word_embeddings", "quantized_models", "model_export"}
            else "study"
        ), key
        if key in lms:
            policy = n.freshness_policy
            assert policy is not None and policy.fail_window.to_timedelta() == dt.timedelta(days=8), key
            assert policy.warn_window.to_timedelta() == dt.timedelta(days=7, hours=2)
            # The UI words both windows in whole days (moment's humanize): they must read differently.
            assert round(policy.warn_window.to_timedelta() / dt.timedelta(days=1)) == 7
        else:
            assert n.freshness_policy is None, key
    # Same module, different defs.yaml defaults: different versions.
    assert nodes["rnn_lm"].code_version != nodes["lstm_lm"].code_version
    # What a language model's version covers: the training loop and the models, not the tracking.
    lm_module = versions.PROJECT_ROOT / "components/orchestration/language_model.py"
    covered = {str(p.relative_to(versions.PROJECT_ROOT)) for p in versions.core_closure(lm_module)}
    assert {"components/core/training.py", "components/core/lm.py", "components/core/models/transformer.py"} <= covered
    assert not {p for p in covered if not p.startswith("components/core/")}
    # Editing the training loop changes every language model's version and not the corpus's.
    real = versions._file_digest
    monkeypatch.setattr(
        versions, "_file_digest", lambda p: "edited" if p.name == "training.py" and p.parent.name == "core" else real(p)
    )
    edited = {
        k.to_user_string(): build_defs().resolve_asset_graph().get(k).code_version for k in graph.get_all_asset_keys()
    }
    assert all(edited[k] != nodes[k].code_version for k in lms)
    assert edited["corpus"] == nodes["corpus"].code_version


def test_every_claim_is_the_check_of_the_asset_it_names_and_wired_nowhere_else():
    """A claim is wired by its registry entry alone: build_defs makes each one the check of its asset
    (those judged on every language model are the language-model component's, on each model)."""
    from pathlib import Path

    from components.core.claims import CLAIMS, LANGUAGE_MODELS
    from components.orchestration.language_model import LM_CLAIMS
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    for c in CLAIMS:
        if c.asset == LANGUAGE_MODELS:
            assert c.name in LM_CLAIMS and ("transformer_lm", c.name) in checks, c.name
        else:
            assert (c.asset, c.name) in checks, c.name
    root = Path(__file__).parent.parent / "pipelines"
    assert not [p for p in root.rglob("*.py") if "claim_check(" in p.read_text()]


def test_no_import_cycles():
    """No module of components/ or pipelines/ reaches itself through imports, counting the imports
    inside functions and under TYPE_CHECKING (a split-off module imports leaf modules, never its parent)."""
    import ast
    from pathlib import Path

    root = Path(__file__).parent.parent
    files = [*root.glob("components/**/*.py"), *root.glob("pipelines/**/*.py")]
    mods = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in files}

    def imported(name: str, path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                mod = ".".join(base + [node.module] if node.module else base) if node.level else node.module
                targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out.add(t)
        return out

    graph = {m: imported(m, p) for m, p in mods.items()}
    cycles = []
    for start in graph:  # a path from a module's imports back to it
        seen, stack = set(), list(graph[start])
        while stack:
            m = stack.pop()
            if m == start:
                cycles.append(start)
                break
            if m not in seen:
                seen.add(m)
                stack.extend(graph[m])
    assert not cycles, f"modules on an import cycle: {sorted(cycles)}"
