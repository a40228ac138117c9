import json
import os
import re

import pytest

from components.core.corpus import (
    CorpusSettings,
    build_corpus,
    count_words,
    default_wiki_dump,
    iter_texts,
    load_corpus,
    split_documents,
)
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
    (d / "b.jsonl").write_text(
        json.dumps({"body": "json doc one"}) + "\n\n" + json.dumps({"body": "json doc two"}) + "\n"
    )
    pq.write_table(pa.table({"body": ["parquet doc"], "other": [1]}), d / "c.parquet")
    s = CorpusSettings(source="files", path=str(d), text_column="body", validation_fraction=0.2)
    result = build_corpus(s, tmp_path / "out")
    dd = load_corpus(result.path)
    texts = sorted(list(dd["train"]["text"]) + list(dd["validation"]["text"]))
    assert texts == sorted(
        ["First paragraph here.", "Second one, with 中文.", "json doc one", "json doc two", "parquet doc"]
    )
    one_doc = CorpusSettings(source="files", path=str(d / "a.txt"), txt_documents="file")
    with pytest.raises(PipelineInputError, match="only one document"):
        build_corpus(one_doc, tmp_path / "out2")


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "empty",
        "not_utf8",
        "truncated_bz2",
        "corrupt_bz2",
        "jsonl_column",
        "jsonl_syntax",
        "jsonl_list",
        "parquet_column",
        "parquet_int",
        "parquet_list",
        "dangling_symlink",
        "symlink_loop",
        "symlink_loop_in_directory",
        "directory_named_like_file",
        "directory_named_like_file_inside",
        "unsupported_file",
    ],
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
        s, match = (
            CorpusSettings(source="files", path=str(tmp_path / "l1.txt")),
            r"l1.txt: not valid UTF-8 at byte offset 12",
        )
    elif case in ("truncated_bz2", "corrupt_bz2"):
        data = bytearray(default_wiki_dump().read_bytes())
        if case == "truncated_bz2":
            data = data[: len(data) // 2]
        else:
            data[4000:4100] = b"\x00" * 100
        (tmp_path / "dump.xml.bz2").write_bytes(bytes(data))
        s, match = (
            CorpusSettings(source="wiki_dump", path=str(tmp_path / "dump.xml.bz2")),
            "dump.xml.bz2: the dump is truncated or corrupted",
        )
    elif case == "jsonl_column":
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
        s, match = CorpusSettings(source="files", path=str(tmp_path / "d.jsonl")), r"d.jsonl:2: no column 'text'"
    elif case == "jsonl_syntax":
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"text": \n')
        s, match = CorpusSettings(source="files", path=str(tmp_path / "d.jsonl")), r"d.jsonl:2: invalid JSON"
    elif case == "jsonl_list":
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"text": ["b", "c"]}\n')
        s, match = (
            CorpusSettings(source="files", path=str(tmp_path / "d.jsonl")),
            r"d.jsonl:2: column 'text' holds a JSON list",
        )
    elif case.startswith("parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        column = {
            "parquet_column": ("body", ["x", "y"]),
            "parquet_int": ("text", [1, 2]),
            "parquet_list": ("text", [["a"], ["b"]]),
        }[case]
        pq.write_table(pa.table({column[0]: column[1]}), tmp_path / "p.parquet")
        s = CorpusSettings(source="files", path=str(tmp_path / "p.parquet"))
        match = {
            "parquet_column": r"p.parquet: no column 'text'.*body",
            "parquet_int": r"p.parquet: column 'text' has type int64, not string",
            "parquet_list": r"p.parquet: column 'text' has type list<.*string>, not string",
        }[case]
    elif case == "dangling_symlink":
        os.symlink(tmp_path / "gone.txt", tmp_path / "link.txt")
        s, match = (
            CorpusSettings(source="files", path=str(tmp_path / "link.txt")),
            r"link.txt: dangling symlink.*gone.txt",
        )
    elif case.startswith("symlink_loop"):
        d = tmp_path / "docs"
        d.mkdir()
        (d / "ok.txt").write_text("one\n\ntwo\n")
        os.symlink(d / "b.txt", d / "a.txt")
        os.symlink(d / "a.txt", d / "b.txt")
        where = d if case == "symlink_loop_in_directory" else d / "a.txt"
        s, match = CorpusSettings(source="files", path=str(where)), r"a.txt: symlink loop"
    elif case.startswith("directory_named_like_file"):
        (tmp_path / "data.txt").mkdir()
        (tmp_path / "data.txt" / "inner.txt").write_text("one\n\ntwo\n")
        where = tmp_path / "data.txt" if case == "directory_named_like_file" else tmp_path
        s, match = CorpusSettings(source="files", path=str(where)), r"data.txt: a directory named like a .txt file"
    else:
        (tmp_path / "d.csv").write_text("text\na\n")
        s, match = CorpusSettings(source="files", path=str(tmp_path / "d.csv")), r"d.csv: unsupported file type '.csv'"
    with pytest.raises(PipelineInputError, match=match):
        build_corpus(s, out)
    assert not out.exists()


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="corpus.path is required"):
        CorpusSettings(source="files")
    with pytest.raises(ValueError, match="validation_fraction"):
        CorpusSettings(validation_fraction=1.5)
    with pytest.raises(ValueError, match="max_documents"):
        CorpusSettings(max_documents=1)
    with pytest.raises(ValueError, match="min_chars"):
        CorpusSettings(min_chars=0)
    with pytest.raises(ValueError, match="extra"):
        CorpusSettings(sorce="files")


def test_left_out_files_and_rows_are_reported(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("one paragraph\n\nanother one\n")
    (d / "notes.md").write_text("# not read")
    (d / "table.csv").write_text("text\nx\n")
    (d / "b.jsonl").write_text('{"text": "json doc"}\n{"text": null}\n{"text": ""}\n')
    pq.write_table(pa.table({"text": ["parquet doc", None, None]}), d / "c.parquet")
    result = build_corpus(CorpusSettings(source="files", path=str(d), validation_fraction=0.3), tmp_path / "out")
    stats = result.stats
    assert stats["documents"] == 4 and stats["skipped_files"] == 2
    assert stats["dropped_null_rows"] == 3 and stats["dropped_short_documents"] == 1  # the empty jsonl row
    assert len(stats["warnings"]) == 2
    assert (
        "skipped 2 file(s)" in stats["warnings"][0]
        and "notes.md" in stats["warnings"][0]
        and "table.csv" in stats["warnings"][0]
    )
    assert "dropped 3 row(s) whose 'text' is null" in stats["warnings"][1]
    clean = build_corpus(CorpusSettings(max_documents=4), tmp_path / "wiki").stats
    assert clean["skipped_files"] == clean["dropped_null_rows"] == 0 and clean["warnings"] == []


def test_paragraphs_split_as_blank_line_regex_does(tmp_path):
    """.txt files are read line by line; the documents are those `re.split(r"\\n\\s*\\n", text)` gives
    (CRLF line ends read as "\\n")."""
    text = "  \nFirst.\r\nsame doc\n\n\n  \t\nSecond, 中文.\n \n\x0cthird\u2028still third\n" + "x " * 500 + "\n\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "b.txt").write_text("only one line", encoding="utf-8")
    result = build_corpus(CorpusSettings(source="files", path=str(tmp_path), validation_fraction=0.3), tmp_path / "out")
    dd = load_corpus(result.path)
    got = sorted(list(dd["train"]["text"]) + list(dd["validation"]["text"]))
    normalised = text.replace("\r\n", "\n")  # line ends are normalised
    expected = [b.strip() for b in re.split(r"\n\s*\n", normalised) if b.strip()] + ["only one line"]
    assert got == sorted(expected)


def test_stats_match_the_whole_texts(tmp_path, wiki_texts):
    import hashlib

    result = build_corpus(CorpusSettings(max_documents=30), tmp_path / "ds")
    texts = wiki_texts[:30]
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\x00")
    assert result.stats["content_sha256"] == h.hexdigest()
    assert result.stats["words"] == sum(len(t.split()) for t in texts)
    assert result.stats["characters"] == sum(map(len, texts))
    assert result.stats["train_characters"] + result.stats["validation_characters"] == result.stats["characters"]
    for text in texts[:5] + ["a  b", " lead", "trail ", "x\x1cy z", ""]:
        assert count_words(text, step=7) == len(text.split()), text


def test_iter_texts_reads_a_dataset_column_in_batches(tmp_path):
    result = build_corpus(CorpusSettings(max_documents=12), tmp_path / "ds")
    column = load_corpus(result.path)["train"]["text"]
    assert list(iter_texts(column, batch_rows=5)) == list(column)
    assert list(iter_texts(["a", "b"])) == ["a", "b"]


def test_bom_and_crlf_are_cleaned_and_nul_bytes_refused(tmp_path):
    """A Windows-saved UTF-8 file (BOM, CRLF) reads as the same documents as its plain form; a file of
    NUL bytes is refused as binary, naming the file and where; the one-document error suggests
    'paragraph' only where it is not already set; a dangling symlink is named with its target."""
    plain = "First line of one.\nSecond line of one.\n\nFirst of two.\nSecond of two.\n\nThree.\n"
    (tmp_path / "unix").mkdir()
    (tmp_path / "win").mkdir()
    (tmp_path / "unix" / "a.txt").write_text(plain, encoding="utf-8")
    (tmp_path / "win" / "a.txt").write_bytes(b"\xef\xbb\xbf" + plain.replace("\n", "\r\n").encode("utf-8"))
    (tmp_path / "win" / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "x y"}\r\n{"text": "z w"}\r\n')
    texts = {}
    for name in ("unix", "win"):
        dd = load_corpus(
            build_corpus(
                CorpusSettings(source="files", path=str(tmp_path / name), validation_fraction=0.3),
                tmp_path / f"{name}-out",
            ).path
        )
        texts[name] = sorted(list(dd["train"]["text"]) + list(dd["validation"]["text"]))
    assert not any("\ufeff" in t or "\r" in t for t in texts["win"]), texts["win"]
    assert set(texts["unix"]) <= set(texts["win"]) and {"x y", "z w"} <= set(texts["win"])

    (tmp_path / "nul.txt").write_bytes(b"\x00" * 4096)
    with pytest.raises(PipelineInputError, match=r"nul.txt: .*NUL byte.*offset 0.*not text"):
        build_corpus(CorpusSettings(source="files", path=str(tmp_path / "nul.txt")), tmp_path / "nul-out")
    (tmp_path / "some-nul.txt").write_bytes(b"one\n\ntwo\x00three\n")
    with pytest.raises(PipelineInputError, match=r"some-nul.txt: .*NUL byte at byte offset 8 \(line 3\)"):
        build_corpus(CorpusSettings(source="files", path=str(tmp_path / "some-nul.txt")), tmp_path / "nul-out")

    (tmp_path / "one.txt").write_text("just one paragraph\nof two lines\n")
    with pytest.raises(PipelineInputError, match="only one document") as e:
        build_corpus(CorpusSettings(source="files", path=str(tmp_path / "one.txt")), tmp_path / "one-out")
    assert "txt_documents" not in str(e.value) and "blank line" in str(e.value)  # 'paragraph' is already the default
    with pytest.raises(PipelineInputError, match="set corpus.txt_documents to 'paragraph'"):
        build_corpus(
            CorpusSettings(source="files", path=str(tmp_path / "one.txt"), txt_documents="file"), tmp_path / "one-out"
        )

    os.symlink(tmp_path / "gone" / "deeper" / "data.txt", tmp_path / "link.txt")
    with pytest.raises(
        PipelineInputError, match=r"link.txt: dangling symlink to .*gone/deeper/data.txt, which does not exist"
    ):
        build_corpus(CorpusSettings(source="files", path=str(tmp_path / "link.txt")), tmp_path / "link-out")
