"""``bertjax.data.work_units``: spans from file sizes alone, each cut on its own, stitched into
units that hold exactly the corpus's documents (``instances.read_text_documents``, the reference
reader), each at least 2, whoever cuts which span; a ``.gz`` file's units read their pieces."""

import dataclasses
import gzip
import itertools
import pathlib

import pytest

from bertjax.data import bundled, instances, sources, tokenization, work_units

CHUNK = work_units.MIN_SPAN_BYTES


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(files, the gzip'd file's text): a small .gz, a one-document file, a plain file of several
    spans with a document longer than a span in it, an empty file and a last one-document file."""
    directory = tmp_path_factory.mktemp("corpus")
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f:
        text = "".join(itertools.islice(f, 4000))
    long_document = " ".join(line for line in text[:200000].splitlines() if line) + "\n"
    assert len(long_document) > 2.5 * CHUNK  # a whole span inside it
    (directory / "a.txt.gz").write_bytes(gzip.compress(text[:20000].encode()))
    (directory / "b.txt").write_text("\n\n  \nOne lone document.\nIn file b.\n\n\n")
    big = text[20000:120000] + "\n\n" + long_document + "\n" + text[120000:250000]
    (directory / "c.txt").write_text(big + "\r\nlast line\r\n")
    (directory / "d.txt").write_text("")
    (directory / "e.txt").write_text("A last document\nalone in its file.\n")
    return sorted(str(p) for p in directory.iterdir()), text[:20000]


def test_spans_come_from_sizes_alone(corpus, monkeypatch):
    files, _ = corpus
    monkeypatch.setattr(sources, "open_file", None)  # nothing may be read
    spans = work_units.spans(files, 5000)
    assert [s.index for s in spans] == list(range(len(spans)))
    sizes = {f: pathlib.Path(f).stat().st_size for f in files}
    big = files[2]
    count = sizes[big] // CHUNK
    assert count >= 4
    assert spans[0].ranges == ((files[0], 0, None), (files[1], 0, None))  # small files grouped
    assert [s.ranges for s in spans[1:-1]] == [
        ((big, sizes[big] * k // count, sizes[big] * (k + 1) // count),) for k in range(count)
    ]
    assert spans[-1].ranges == ((files[3], 0, None), (files[4], 0, None))
    assert [s.size for s in spans] == [sizes[files[0]] + sizes[files[1]]] + [
        r[0][2] - r[0][1] for r in (s.ranges for s in spans[1:-1])
    ] + [sizes[files[3]] + sizes[files[4]]]
    gz = pathlib.Path(files[0]).with_name("big.txt.gz")
    gz.write_bytes(b"\0" * (CHUNK + 1))  # a large .gz: one span, however large
    assert work_units.spans([str(gz)], 5000)[0].ranges == ((str(gz), 0, None),)
    gz.unlink()


@pytest.mark.parametrize("text", [b"a\n\nb\nc\n\n\nd\n", b"a\r\n\r\nb\r\n", b"abc\n\n"])
def test_document_start_at_is_the_next_non_blank_line_after_a_blank_one(tmp_path, text):
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    lines = text.splitlines(keepends=True)
    starts = [sum(map(len, lines[:i])) for i in range(len(lines))]
    documents = [
        s for i, s in enumerate(starts) if lines[i].strip() and i > 0 and not lines[i - 1].strip()
    ]  # a blank line before: a document start (the file's start too, but only for position 0)
    with open(path, "rb") as f:
        for position in range(len(text) + 1):
            # the blank line must begin at or after the position: a line starting before it
            blanks = [s for s in starts if s >= position and not text[s:].split(b"\n")[0].strip()]
            want = next((d for d in documents if blanks and d > blanks[0]), len(text))
            assert work_units.document_start_at(f, position) == (0 if position == 0 else want)


def _with_contents(units):
    """Units with each piece's bytes in place of its name (a cut's own)."""
    read = lambda piece: piece and pathlib.Path(piece).read_bytes()  # noqa: E731
    return [dataclasses.replace(u, pieces=tuple(map(read, u.pieces))) for u in units]


@pytest.mark.parametrize("unit_bytes", [1, 5000, 10**9])
@pytest.mark.parametrize("split", [False, True], ids=["read-gz", "split-gz"])
def test_units_hold_exactly_the_corpus_documents(corpus, tmp_path, unit_bytes, split):
    files, gz_text = corpus
    tokenizer = tokenization.create_tokenizer("wordpiece", bundled.VOCAB, True)
    expected = list(instances.read_text_documents(files, tokenizer))
    spans = work_units.spans(files, unit_bytes)
    cut = [work_units.cut_span(s, unit_bytes, str(tmp_path) if split else None) for s in spans]
    units = work_units.stitch(cut)  # each span cut on its own: in any order, in any process
    again = work_units.work_units(files, unit_bytes, str(tmp_path) if split else None)
    assert _with_contents(units) == _with_contents(again)  # pieces: other names, same bytes
    assert [u.index for u in units] == list(range(len(units)))
    if unit_bytes < CHUNK:  # c.txt in spans: one lies inside the long document, so it is empty
        assert any(not span_units for span_units in cut)
    if split:  # each range of a.txt.gz has its plain piece; the others read their files
        for unit in units:
            for (path, start, stop), piece in zip(unit.ranges, unit.pieces, strict=True):
                assert (piece is not None) == path.endswith(".gz")
                if piece:
                    assert pathlib.Path(piece).read_bytes() == gz_text.encode()[start:stop]
        gz = pathlib.Path(files[0])
        gz.rename(gz.with_suffix(".hidden"))  # units read only the pieces
    tokenize = instances.line_batch_tokenizer(tokenizer)
    try:
        got = [list(work_units.unit_documents(u, tokenize)) for u in units]
    finally:
        if split:
            gz.with_suffix(".hidden").rename(gz)
    assert all(len(documents) >= 2 for documents in got)  # NotNext needs another document
    assert [u.documents for u in units] == [len(documents) for documents in got]
    got = [d for documents in got for d in documents]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.ids.tolist() == b.ids.tolist()
        assert a.sentence_lengths.tolist() == b.sentence_lengths.tolist()
    if unit_bytes == 5000:
        assert len(units) > 20
    if unit_bytes == 10**9:
        assert len(units) == 1


def test_a_span_cut_twice_names_other_pieces_and_a_short_piece_is_one_line(corpus, tmp_path):
    """A retried or duplicated cut writes pieces of its own (a unit reads those its committed
    cut named); a piece that lost bytes is an error naming it, never fewer documents."""
    files, gz_text = corpus
    (span,) = [s for s in work_units.spans(files, 5000) if s.ranges[0][0] == files[0]]
    first, second = (work_units.cut_span(span, 5000, str(tmp_path)) for _ in range(2))
    pieces = [[p for u in units for p in u.pieces if p] for units in (first, second)]
    assert len(pieces[0]) > 1 and not set(pieces[0]) & set(pieces[1])
    for a, b in zip(*pieces, strict=True):
        assert pathlib.Path(a).read_bytes() == pathlib.Path(b).read_bytes()
    unit = next(u for u in first if u.pieces[0] is not None)
    (path, start, stop), piece = unit.ranges[0], unit.pieces[0]
    with open(piece, "r+b") as f:
        f.truncate(stop - start - 7)
    with pytest.raises(instances.DataError) as error:
        list(work_units.unit_lines(unit, chunk_bytes=1000))
    assert str(error.value) == (
        f"{piece}: ends after {stop - start - 7} of the {stop - start} bytes of {path} "
        f"from byte {start}"
    )
