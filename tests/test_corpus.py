import json

import pytest

from components.core.corpus import CorpusSettings, build_corpus, default_wiki_dump, load_corpus, split_documents
from components.core.errors import PipelineInputError


def test_wiki_sample_gives_clean_articles(wiki_docs):
    # The dump holds 206 main-namespace pages, about half of them redirects.
    assert 90 <= len(wiki_docs) <= 120
    titles = {d["title"] for d in wiki_docs}
    assert "Anarchism" in titles and "AccessibleComputing" not in titles  # the latter is a redirect
    text = "\n".join(d["text"] for d in wiki_docs)
    for markup in ("[[", "]]", "{{", "}}", "<ref", "&nbsp;", "'''"):
        assert markup not in text, markup
    anarchism = next(d for d in wiki_docs if d["title"] == "Anarchism")
    assert anarchism["text"].startswith("Anarchism is a political philosophy")
    assert len(text.split()) > 400_000


def test_split_is_deterministic_disjoint_and_complete():
    a_train, a_val = split_documents(100, 0.1, seed=3)
    b_train, b_val = split_documents(100, 0.1, seed=3)
    assert (a_train == b_train).all() and (a_val == b_val).all()
    assert len(a_val) == 10 and set(a_train).isdisjoint(a_val) and len(set(a_train) | set(a_val)) == 100
    _, c_val = split_documents(100, 0.1, seed=4)
    assert set(c_val) != set(a_val)


def test_build_corpus_saves_arrow_splits(tmp_path):
    result = build_corpus(CorpusSettings(max_documents=20, validation_fraction=0.25), tmp_path / "ds")
    dd = load_corpus(result.path)
    assert dd["train"].num_rows == 15 and dd["validation"].num_rows == 5
    assert set(dd["train"]["doc_id"]).isdisjoint(dd["validation"]["doc_id"])
    assert result.stats["documents"] == 20 and result.stats["words"] > 10_000
    assert 0 <= result.stats["non_ascii_share"] < 0.05 and len(result.stats["content_sha256"]) == 64
    assert result.samples


def test_local_txt_jsonl_parquet_and_directory(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("First paragraph here.\n\nSecond one, with 中文.\n")
    (d / "b.jsonl").write_text(json.dumps({"body": "json doc one"}) + "\n\n" + json.dumps({"body": "json doc two"}) + "\n")
    pq.write_table(pa.table({"body": ["parquet doc"], "other": [1]}), d / "c.parquet")
    s = CorpusSettings(source="files", path=str(d), text_column="body", validation_fraction=0.2)
    result = build_corpus(s, tmp_path / "out")
    dd = load_corpus(result.path)
    texts = sorted(list(dd["train"]["text"]) + list(dd["validation"]["text"]))
    assert texts == sorted(["First paragraph here.", "Second one, with 中文.", "json doc one", "json doc two", "parquet doc"])
    one_doc = CorpusSettings(source="files", path=str(d / "a.txt"), txt_documents="file")
    with pytest.raises(PipelineInputError, match="only one document"):
        build_corpus(one_doc, tmp_path / "out2")


@pytest.mark.parametrize(
    "case",
    ["missing", "empty", "not_utf8", "truncated_bz2", "corrupt_bz2", "jsonl_column", "jsonl_syntax", "parquet_column"],
)
def test_bad_input_names_the_problem(tmp_path, case):
    out = tmp_path / "out"
    if case == "missing":
        s, match = CorpusSettings(source="files", path=str(tmp_path / "nope.txt")), "does not exist.*nope.txt"
    elif case == "empty":
        (tmp_path / "e.txt").write_text("\n\n   \n")
        s, match = CorpusSettings(source="files", path=str(tmp_path / "e.txt")), "empty"
    elif case == "not_utf8":
        (tmp_path / "l1.txt").write_bytes("caf\u00e9 ok\n\n".encode("utf-8") + b"na\xefve")
        s, match = CorpusSettings(source="files", path=str(tmp_path / "l1.txt")), r"l1.txt: not valid UTF-8 at byte offset 12"
    elif case in ("truncated_bz2", "corrupt_bz2"):
        data = bytearray(default_wiki_dump().read_bytes())
        if case == "truncated_bz2":
            data = data[: len(data) // 2]
        else:
            data[4000:4100] = b"\x00" * 100
        (tmp_path / "dump.xml.bz2").write_bytes(bytes(data))
        s, match = CorpusSettings(source="wiki_dump", path=str(tmp_path / "dump.xml.bz2")), "dump.xml.bz2: the dump is truncated or corrupted"
    elif case == "jsonl_column":
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
        s, match = CorpusSettings(source="files", path=str(tmp_path / "d.jsonl")), r"d.jsonl:2: no column 'text'"
    elif case == "jsonl_syntax":
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"text": \n')
        s, match = CorpusSettings(source="files", path=str(tmp_path / "d.jsonl")), r"d.jsonl:2: invalid JSON"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "p.parquet")
        s, match = CorpusSettings(source="files", path=str(tmp_path / "p.parquet")), r"p.parquet: no column 'text'.*body"
    with pytest.raises(PipelineInputError, match=match):
        build_corpus(s, out)
    assert not out.exists()


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="corpus.path is required"):
        CorpusSettings(source="files")
    with pytest.raises(ValueError, match="validation_fraction"):
        CorpusSettings(validation_fraction=1.5)
    with pytest.raises(ValueError, match="extra"):
        CorpusSettings(sorce="files")
