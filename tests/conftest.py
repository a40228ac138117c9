from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Screenshots the browser tests (tests/test_ui.py) saved, listed at the end of the session.
SCREENSHOTS = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, config):
    shots = config.stash.get(SCREENSHOTS, [])
    if shots:
        terminalreporter.write_sep("-", "browser screenshots")
        for path in shots:
            terminalreporter.write_line(str(path))


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """A fresh state folder (Dagster storage, MLflow DB, asset files) for one test."""
    d = tmp_path / "state"
    monkeypatch.setenv("PIPELINE_STATE_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def wiki_docs():
    """The real default corpus: articles of the Wikipedia sample dump in gensim's test data."""
    from components.core.corpus import default_wiki_dump, iter_wiki_articles

    return list(iter_wiki_articles(default_wiki_dump()))


@pytest.fixture(scope="session")
def wiki_texts(wiki_docs):
    return [d["text"] for d in wiki_docs]


@pytest.fixture
def one_thread():
    """One intra-op thread: on two cores shared with other work it is both faster and steadier."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
