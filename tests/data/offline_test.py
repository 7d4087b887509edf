"""The offline tool end to end; records parsed with the original run_pretraining.py spec."""

import collections
import gzip
import itertools

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from bertjax import cli, create_pretraining_data
from bertjax.data import bundled

LENGTH, PREDICTIONS = 64, 10
PACKED_LENGTH, PACKED_PREDICTIONS = 128, 20  # room for short instances to share rows


def _original_input_fn_features(max_seq_length, max_predictions_per_seq):
    # Written like google-research/bert run_pretraining.py's input_fn_builder name_to_features.
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _run(argv):
    values = flags.FlagValues()  # private flags: never clash with other tools in this process
    create_pretraining_data.define_flags(values)
    values(["create_pretraining_data", *argv])
    return cli.call(create_pretraining_data.run, values, prog="create_pretraining_data")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "corpus.txt.gz"
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f, gzip.open(path, "wt") as out:
        out.write("".join(itertools.islice(f, 800)))
    return path


def test_writes_shards_the_original_spec_parses(corpus, tmp_path, capsys):
    out = tmp_path / "out" / "train.tfrecord"
    code = _run(
        [
            f"--input_file={corpus}",
            f"--output_file={out}",
            "--num_output_shards=2",
            f"--vocab_file={bundled.VOCAB}",
            f"--max_seq_length={LENGTH}",
            f"--max_predictions_per_seq={PREDICTIONS}",
            "--dupe_factor=2",
            "--random_seed=7",
            "--num_workers=1",
        ]
    )
    assert code == 0
    shards = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in shards] == [f"train.tfrecord-0000{i}-of-00002" for i in range(2)]
    spec = _original_input_fn_features(LENGTH, PREDICTIONS)
    records = [
        tf.io.parse_single_example(r, spec)
        for r in tf.data.TFRecordDataset([str(p) for p in shards])
    ]
    assert len(records) > 200
    assert f"examples            {len(records)}" in capsys.readouterr().out
    labels = []
    for record in records:
        r = {k: v.numpy() for k, v in record.items()}
        n = int(r["input_mask"].sum())
        assert np.all(r["input_mask"][:n] == 1) and np.all(r["input_ids"][n:] == 0)
        weights = r["masked_lm_weights"] > 0
        positions = r["masked_lm_positions"][weights]
        assert np.all(np.diff(positions) > 0) and np.all(positions < n)
        assert not np.isin(r["masked_lm_ids"][weights], [0, 1, 2, 3, 4]).any()
        assert r["input_ids"][0] == 2 and r["input_ids"][n - 1] == 3
        labels.append(int(r["next_sentence_labels"][0]))
    assert set(labels) == {0, 1}  # the share against the original's: original_statistics_test


def test_bad_input_exits_non_zero_and_leaves_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not text\n")
    out = tmp_path / "out.tfrecord"
    good = tmp_path / "good.txt"
    good.write_text("One sentence.\nTwo.\n\nAnother document.\n\n" * 4)
    # Two units in two spawned workers: the error is raised in one and still ends as one line.
    argv = [
        f"--input_file={tmp_path}/*.txt",
        f"--output_file={out}",
        f"--vocab_file={bundled.VOCAB}",
    ]
    code = _run([*argv, "--num_workers=2", "--work_unit_bytes=10"])
    assert code == 1
    assert "bad.txt: not UTF-8 text (byte 0)" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == [bad, good]
    assert _run([f"--output_file={out}", f"--vocab_file={bundled.VOCAB}"]) == 1
    assert "--input_file is required" in capsys.readouterr().err
    # A failure before any output is opened (missing vocab) is the same one line, no traceback.
    assert _run([f"--input_file={good}", f"--output_file={out}", "--vocab_file=nope.txt"]) == 1
    assert "vocab file nope.txt: not found" in capsys.readouterr().err
    assert _run([*argv, "--pack_sequences", "--max_sequences_per_pack=0"]) == 1
    assert "--max_sequences_per_pack=0: need >= 1" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == [bad, good]


def _shards(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


PACKING = ["--pack_sequences", "--max_sequences_per_pack=3", "--short_seq_prob=0.5"]


def _identity_argv(corpus, packing):
    """The runs compared across worker counts: ~5 units of this 40 kB corpus, three shards."""
    return [
        *packing,
        f"--input_file={corpus}",
        "--num_output_shards=3",
        f"--vocab_file={bundled.VOCAB}",
        f"--max_seq_length={LENGTH}",
        f"--max_predictions_per_seq={PREDICTIONS}",
        "--dupe_factor=2",
        "--work_unit_bytes=8000",
    ]


@pytest.fixture(scope="module")
def fresh_two_worker_run(corpus, tmp_path_factory):
    """The unpacked identity run with two workers, as ``python -m bertjax.create_pretraining_data``
    in a fresh process (runpy, its module as ``__main__``): (its stdout, the output folder, and
    whether the command's own process imported TensorFlow)."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("fresh") / "w2"
    argv = [
        "create_pretraining_data", *_identity_argv(corpus, []),
        f"--output_file={folder / 'train.tfrecord'}", "--num_workers=2",
    ]  # fmt: skip
    script = (
        "import runpy, sys\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    runpy.run_module('bertjax.create_pretraining_data', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('exit', code, 'tensorflow', 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return result, folder


@pytest.mark.parametrize("packing", [[], PACKING], ids=["unpacked", "packed"])
def test_output_is_identical_for_one_and_two_worker_processes(
    corpus, tmp_path, capsys, packing, request
):
    """Unpacked, the two-worker run is the fresh process of ``fresh_two_worker_run`` (shared with
    the TensorFlow check below); packed, the command in this process with two spawned workers."""
    common = _identity_argv(corpus, packing)
    out = tmp_path / "w1" / "train.tfrecord"
    assert _run([*common, f"--output_file={out}", "--num_workers=1"]) == 0
    one_out = capsys.readouterr().out
    if packing:
        out = tmp_path / "w2" / "train.tfrecord"
        assert _run([*common, f"--output_file={out}", "--num_workers=2"]) == 0
        two_out, two_dir = capsys.readouterr().out, out.parent
    else:
        result, two_dir = request.getfixturevalue("fresh_two_worker_run")
        assert "exit 0 " in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
        two_out = result.stdout.rsplit("exit 0 ", 1)[0]  # less the script's own last line
    one, two = _shards(tmp_path / "w1"), _shards(two_dir)
    assert list(one) == [f"train.tfrecord-0000{i}-of-00003" for i in range(3)]
    assert one == two  # byte for byte
    records = list(tf.data.TFRecordDataset([str(tmp_path / "w1" / name) for name in one]))
    assert f"rows                {len(records)}  (" in one_out
    assert two_out[two_out.index("examples") :] == one_out[one_out.index("examples") :]
    assert len(set(r.numpy() for r in records)) == len(records)  # no unit written twice
    if packing:  # packed indeed: some row holds several instances
        parsed = [tf.io.parse_single_example(r, _packed_features(3)) for r in records]
        assert max(int(p["instance_weights"].numpy().sum()) for p in parsed) > 1


def _packed_features(k, length=LENGTH, predictions=PREDICTIONS):
    # The packed record's layout, written here from the TFRecord module's docstring.
    spec = _original_input_fn_features(length, predictions)
    spec["positions"] = tf.io.FixedLenFeature([length], tf.int64)
    spec["sequence_ids"] = tf.io.FixedLenFeature([length], tf.int64)
    spec["cls_positions"] = tf.io.FixedLenFeature([k], tf.int64)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([k], tf.int64)
    spec["instance_weights"] = tf.io.FixedLenFeature([k], tf.float32)
    return spec


def _parsed(folder, spec):
    files = [str(p) for p in sorted(folder.iterdir())]
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
        for r in tf.data.TFRecordDataset(files)
    ]


def _key(instance):
    return tuple(tuple(np.asarray(instance[k]).ravel().tolist()) for k in sorted(instance))


def _unpack(row, k, length, predictions):
    """One packed record -> its instances as unpacked records, checking each on the way."""
    ids = row["sequence_ids"]
    count = int(ids.max())
    assert count <= k and np.array_equal(row["input_mask"], (ids > 0).astype(int))
    assert np.all(np.diff(ids[ids > 0]) >= 0) and np.all(ids[int((ids > 0).sum()) :] == 0)
    for name in ("input_ids", "segment_ids", "positions"):
        assert np.all(row[name][ids == 0] == 0), name  # padding is zero
    weights = row["masked_lm_weights"] > 0
    predicted = row["masked_lm_positions"][weights]
    assert np.all(np.diff(predicted) > 0) and np.all(ids[predicted] > 0)
    assert np.array_equal(row["instance_weights"], (np.arange(k) < count).astype(float))
    assert np.all(row["next_sentence_labels"][count:] == 0)
    out = []
    for s in range(1, count + 1):
        span = np.flatnonzero(ids == s)
        start, n = int(span[0]), len(span)
        assert np.array_equal(span, start + np.arange(n))  # contiguous
        assert np.array_equal(row["positions"][span], np.arange(n))  # positions restart
        assert row["cls_positions"][s - 1] == start  # its own [CLS]
        assert row["input_ids"][start] == 2 and row["input_ids"][start + n - 1] == 3
        mine = (ids[row["masked_lm_positions"]] == s) & weights  # no prediction crosses
        m = int(mine.sum())
        instance = {
            "input_ids": np.pad(row["input_ids"][span], (0, length - n)),
            "input_mask": np.pad(np.ones(n, int), (0, length - n)),
            "segment_ids": np.pad(row["segment_ids"][span], (0, length - n)),
            "masked_lm_positions": np.pad(
                row["masked_lm_positions"][mine] - start, (0, predictions - m)
            ),
            "masked_lm_ids": np.pad(row["masked_lm_ids"][mine], (0, predictions - m)),
            "masked_lm_weights": np.pad(np.ones(m, np.float32), (0, predictions - m)),
            "next_sentence_labels": row["next_sentence_labels"][s - 1 : s],
        }
        out.append(instance)
    return out


@pytest.fixture(scope="module")
def packed_and_unpacked(corpus, tmp_path_factory):
    common = [
        f"--input_file={corpus}",
        "--num_output_shards=2",
        f"--vocab_file={bundled.VOCAB}",
        f"--max_seq_length={PACKED_LENGTH}",  # room for short instances to pair
        f"--max_predictions_per_seq={PACKED_PREDICTIONS}",
        "--dupe_factor=2",
        "--short_seq_prob=0.5",  # many short instances: rows of 2 and 3
        "--work_unit_bytes=8000",
        "--num_workers=1",
    ]
    folder = tmp_path_factory.mktemp("packing")
    packing = ["--pack_sequences", "--max_sequences_per_pack=3"]
    for name, extra in (("unpacked", []), ("packed", packing)):
        assert _run([*common, *extra, f"--output_file={folder / name / 'train.tfrecord'}"]) == 0
    return folder / "packed", folder / "unpacked"


def test_packed_rows_hold_exactly_the_unpacked_instances(packed_and_unpacked):
    packed, unpacked = packed_and_unpacked
    rows = _parsed(packed, _packed_features(3, PACKED_LENGTH, PACKED_PREDICTIONS))
    instances = [i for row in rows for i in _unpack(row, 3, PACKED_LENGTH, PACKED_PREDICTIONS)]
    expected = _parsed(unpacked, _original_input_fn_features(PACKED_LENGTH, PACKED_PREDICTIONS))
    assert collections.Counter(map(_key, instances)) == collections.Counter(map(_key, expected))
    counts = collections.Counter(int(row["sequence_ids"].max()) for row in rows)
    assert set(counts) == {1, 2, 3} and len(rows) < 0.9 * len(expected)  # packing saved rows


def test_the_command_process_never_imports_tensorflow_for_local_paths(fresh_two_worker_run):
    """The spawned workers import TensorFlow; the command's own process (units, appending) does
    not, with local paths: ``cli.run(..., tensorflow=False)``. The fresh process is the two-worker
    run of the identity test above."""
    result, out = fresh_two_worker_run
    assert "exit 0 tensorflow False" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        f"train.tfrecord-0000{i}-of-00003" for i in range(3)
    ]
    assert all(p.stat().st_size > 0 for p in out.iterdir())


def test_default_workers_are_every_core_but_no_more_than_the_units():
    from bertjax.data import offline

    assert offline.default_workers(4, cores=2) == 2  # the bundled corpus: 4 units
    assert offline.default_workers(1, cores=2) == 1
    assert offline.default_workers(1000, cores=16) == 16
    assert offline.default_workers(0, cores=16) == 1


class Damage:
    """Damages one scratch piece between the unit stage and the concatenation: a hook on
    ``shard_pieces.check``, which every concatenation (local and Beam) calls before it appends
    anything. ``how``: 'delete' or 'truncate' (its last 10 bytes). ``call``: the check (0: the
    first) whose first piece is damaged. ``expected``: the piece's bytes and records before."""

    def __init__(self, monkeypatch, how: str, call: int = 0):
        from bertjax.data import shard_pieces

        self.how, self.calls, self.path, self.expected = how, call, None, None
        check = shard_pieces.check

        def damaging(pieces):
            if pieces and self.path is None:
                if self.calls == 0:
                    self.damage(pieces[0].path)
                self.calls -= 1
            return check(pieces)

        monkeypatch.setattr(shard_pieces, "check", damaging)

    def damage(self, path):
        import os

        records = sum(1 for _ in tf.data.TFRecordDataset(path))
        self.path, self.expected = path, (os.path.getsize(path), records)
        if self.how == "delete":
            os.remove(path)
        else:
            with open(path, "r+b") as f:
                f.truncate(self.expected[0] - 10)

    def message(self, prog="create_pretraining_data") -> str:
        """The one line the command must print (the unit and shard are in the piece's name)."""
        size, records = self.expected
        found = "missing" if self.how == "delete" else f"{size - 10} bytes"
        name = self.path.rsplit("/", 1)[1]  # unit-UUUUUU-shard-SSSSS-ATTEMPT.tfrecord
        unit, shard = int(name.split("-")[1]), int(name.split("-")[3])
        return (
            f"{prog}: error: {self.path}: {found}, expected {size} bytes ({records} records) of "
            f"work unit {unit} for output shard {shard}; no output shard written\n"
        )


@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_a_lost_or_short_piece_is_one_line_and_no_output(
    corpus, tmp_path, capsys, monkeypatch, how
):
    """The check and the appending are the command process's (``_append_unit``), whoever wrote
    the units: here one worker, this process. (An error while spawned workers run, the pool then
    stopped, is test_bad_input_exits_non_zero_and_leaves_nothing's.)"""
    out = tmp_path / "out" / "train.tfrecord"
    damage = Damage(monkeypatch, how, call=1)  # the second unit: the first is appended already
    argv = [
        f"--input_file={corpus}", f"--output_file={out}", "--num_output_shards=3",
        f"--vocab_file={bundled.VOCAB}", f"--max_seq_length={LENGTH}",
        f"--max_predictions_per_seq={PREDICTIONS}", "--dupe_factor=1", "--work_unit_bytes=8000",
        "--num_workers=1",
    ]  # fmt: skip
    assert _run(argv) == 1
    assert damage.path is not None and "/unit-000001-shard-" in damage.path
    assert capsys.readouterr().err == damage.message()
    assert list(out.parent.iterdir()) == []  # no shard, no temporary


def test_only_the_committed_attempt_of_a_unit_is_read(corpus, tmp_path, monkeypatch):
    """Each unit runs twice (as Dataflow may run it): the first attempt's result is the one the
    runner keeps; the second is a late duplicate whose pieces end partial. The output is that of
    a run without duplicates."""
    from bertjax.data import offline

    argv = [
        f"--input_file={corpus}", "--num_output_shards=2", f"--vocab_file={bundled.VOCAB}",
        f"--max_seq_length={LENGTH}", f"--max_predictions_per_seq={PREDICTIONS}",
        "--dupe_factor=1", "--work_unit_bytes=8000", "--num_workers=1",
    ]  # fmt: skip
    assert _run([*argv, f"--output_file={tmp_path / 'once' / 'train.tfrecord'}"]) == 0
    write_unit = offline.write_unit

    def twice(unit):
        kept = write_unit(unit)
        late = write_unit(unit)
        for piece in late[1].pieces(offline._WORKER["job"].scratch_dir):
            with open(piece.path, "r+b") as f:
                f.truncate(piece.size // 2)
        return kept

    monkeypatch.setattr(offline, "write_unit", twice)
    assert _run([*argv, f"--output_file={tmp_path / 'twice' / 'train.tfrecord'}"]) == 0
    once, twice_ = _shards(tmp_path / "once"), _shards(tmp_path / "twice")
    assert len(once) == 2 and all(once.values())
    assert twice_ == once


def test_packing_holds_one_window_of_the_units_instances_at_a_time(corpus, tmp_path, monkeypatch):
    """With a window of 50 instances (``pipeline.PACK_WINDOW``), one unit and one shard: every
    packed row holds instances of one window of 50 consecutive unpacked records (the unit's
    shuffled order), windows in order, and together exactly the unpacked records."""
    from bertjax.data import pipeline

    window = 50
    monkeypatch.setattr(pipeline, "PACK_WINDOW", window)  # read by the worker: this process
    common = [
        f"--input_file={corpus}", f"--vocab_file={bundled.VOCAB}", "--num_workers=1",
        f"--max_seq_length={PACKED_LENGTH}", f"--max_predictions_per_seq={PACKED_PREDICTIONS}",
        "--dupe_factor=1", "--short_seq_prob=0.5", f"--work_unit_bytes={10**9}",
    ]  # fmt: skip
    packing = ["--pack_sequences", "--max_sequences_per_pack=3"]
    for name, extra in (("unpacked", []), ("packed", packing)):
        assert _run([*common, *extra, f"--output_file={tmp_path / name / 'train.tfrecord'}"]) == 0
    spec = _original_input_fn_features(PACKED_LENGTH, PACKED_PREDICTIONS)
    position = {_key(r): i for i, r in enumerate(_parsed(tmp_path / "unpacked", spec))}
    assert len(position) > 4 * window  # several windows, every record distinct
    rows = _parsed(tmp_path / "packed", _packed_features(3, PACKED_LENGTH, PACKED_PREDICTIONS))
    instances = [_unpack(row, 3, PACKED_LENGTH, PACKED_PREDICTIONS) for row in rows]
    windows = [{position[_key(i)] // window for i in row} for row in instances]
    assert all(len(w) == 1 for w in windows)  # no row crosses a window
    in_order = [min(w) for w in windows]
    assert in_order == sorted(in_order) and in_order[-1] == (len(position) - 1) // window
    packed = sorted(position[_key(i)] for row in instances for i in row)
    assert packed == list(range(len(position)))  # each record exactly once


def _random_replacement(rows, buffer_size, rng):
    """The reference: a list of rows, a random one out for each row in, the rest shuffled."""
    buffer = []
    for row in rows:
        if len(buffer) < buffer_size:
            buffer.append(row)
            continue
        i = rng.randrange(buffer_size)
        yield buffer[i]
        buffer[i] = row
    rng.shuffle(buffer)
    yield from buffer


@pytest.mark.parametrize("buffer_size", [1, 7, 100, 10_000])
def test_the_shuffle_buffer_is_random_replacement(buffer_size):
    import random

    from bertjax.data import offline

    generator = np.random.default_rng(0)
    blocks = [generator.integers(0, 99, (int(generator.integers(1, 30)), 6)) for _ in range(60)]
    rows = [row for block in blocks for row in block]
    want = list(_random_replacement(rows, buffer_size, random.Random(5)))
    got = list(offline.shuffled(blocks, buffer_size, random.Random(5)))
    assert np.array_equal(np.stack(got), np.stack(want))
