"""``bertjax.data.shard_pieces``: an attempt's pieces land only when it commits, under its own
names, holding what it says (counted here with ``tf.data.TFRecordDataset``); a piece that is
missing, short or not whole TFRecords is one line naming it. The commands' runs with damaged
pieces: tests/data/offline_test.py, offline_beam_test.py and tests/gcs/commands_test.py."""

import io
import os

import pytest
import tensorflow as tf

from bertjax.data import shard_pieces
from bertjax.data.instances import DataError

RECORDS = [b"x" * n for n in (0, 1, 7, 8, 9, 300, 4000)]  # lengths around the 8-byte header


def _write(scratch, unit, records_per_shard, fail=False):
    with shard_pieces.Attempt(str(scratch), unit) as attempt:
        for shard, records in records_per_shard.items():
            for record in records:
                attempt.write(shard, record)
        if fail:
            raise RuntimeError("the unit failed after writing")
        return attempt.commit()


def test_a_failed_attempt_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        _write(tmp_path, 3, {0: RECORDS, 2: RECORDS[:2]}, fail=True)
    assert list(tmp_path.iterdir()) == []  # no piece, no spool


def test_a_committed_attempt_says_what_each_piece_holds(tmp_path):
    result = _write(tmp_path, 3, {0: RECORDS, 2: RECORDS[:2]})
    pieces = result.pieces(str(tmp_path))
    assert [p.path for p in pieces] == [
        f"{tmp_path}/unit-000003-shard-{s:05d}-{result.attempt}.tfrecord" for s in (0, 2)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        os.path.basename(p.path) for p in pieces
    )  # the pieces and nothing else
    for piece, records in zip(pieces, [RECORDS, RECORDS[:2]], strict=True):
        read = [r.numpy() for r in tf.data.TFRecordDataset(piece.path)]
        assert read == records
        assert (piece.records, piece.size) == (len(records), os.path.getsize(piece.path))


@pytest.mark.parametrize("chunk", [1, 5, 13, 1 << 22])
def test_append_copies_the_piece_and_counts_its_records(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(shard_pieces, "_COPY_BYTES", chunk)  # headers split between chunks
    (piece,) = _write(tmp_path, 0, {1: RECORDS}).pieces(str(tmp_path))
    shard_pieces.check([piece])
    output = io.BytesIO()
    shard_pieces.append(piece, output)
    with open(piece.path, "rb") as f:
        assert output.getvalue() == f.read()


def test_two_attempts_write_their_own_pieces_and_each_reads_its_own(tmp_path):
    first = _write(tmp_path, 5, {0: RECORDS})
    second = _write(tmp_path, 5, {0: RECORDS})  # Dataflow ran the unit twice
    assert first.attempt != second.attempt
    (kept,), (other,) = first.pieces(str(tmp_path)), second.pieces(str(tmp_path))
    with open(other.path, "r+b") as f:
        f.truncate(10)  # the other attempt's piece is partial: never read
    shard_pieces.check([kept])
    output = io.BytesIO()
    shard_pieces.append(kept, output)
    assert [r.numpy() for r in tf.data.TFRecordDataset(kept.path)] == RECORDS


def _piece(tmp_path):
    (piece,) = _write(tmp_path, 4, {2: RECORDS}).pieces(str(tmp_path))
    return piece


def _expected(piece):
    return (
        f"expected {piece.size} bytes (7 records) of work unit 4 for output shard 2; "
        "no output shard written"
    )


def test_a_missing_piece_is_one_line_naming_it(tmp_path):
    piece = _piece(tmp_path)
    os.remove(piece.path)
    with pytest.raises(DataError) as check:
        shard_pieces.check([piece])
    with pytest.raises(DataError) as append:  # gone after the check: the same line
        shard_pieces.append(piece, io.BytesIO())
    assert str(check.value) == str(append.value) == f"{piece.path}: missing, {_expected(piece)}"


@pytest.mark.parametrize("keep", [0, 5, -1])
def test_a_short_piece_is_one_line_naming_it(tmp_path, keep):
    piece = _piece(tmp_path)
    size = piece.size + keep if keep < 0 else keep
    with open(piece.path, "r+b") as f:
        f.truncate(size)
    with pytest.raises(DataError) as check:
        shard_pieces.check([piece])
    with pytest.raises(DataError) as append:
        shard_pieces.append(piece, io.BytesIO())
    line = f"{piece.path}: {size} bytes, {_expected(piece)}"
    assert str(check.value) == str(append.value) == line


def test_a_piece_of_its_size_but_other_records_is_one_line(tmp_path):
    piece = _piece(tmp_path)
    with open(piece.path, "r+b") as f:
        f.write((2**40).to_bytes(8, "little"))  # the first length now runs past the end
    shard_pieces.check([piece])  # the size is right
    with pytest.raises(DataError) as append:
        shard_pieces.append(piece, io.BytesIO())
    assert str(append.value) == f"{piece.path}: not whole TFRecords, {_expected(piece)}"


def test_the_first_bad_piece_is_named(tmp_path):
    result = _write(tmp_path, 9, {s: RECORDS for s in range(4)})
    pieces = result.pieces(str(tmp_path))
    os.remove(pieces[3].path)
    with open(pieces[1].path, "r+b") as f:
        f.truncate(3)
    with pytest.raises(DataError, match=f"^{pieces[1].path}: 3 bytes, expected"):
        shard_pieces.check(pieces)
