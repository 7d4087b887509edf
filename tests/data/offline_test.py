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


@pytest.mark.parametrize("packing", [[], ["--pack_sequences", "--short_seq_prob=0.5"]])
def test_output_is_identical_for_one_and_two_worker_processes(corpus, tmp_path, capsys, packing):
    common = [
        *packing,
        f"--input_file={corpus}",
        "--num_output_shards=3",
        f"--vocab_file={bundled.VOCAB}",
        f"--max_seq_length={LENGTH}",
        f"--max_predictions_per_seq={PREDICTIONS}",
        "--dupe_factor=2",
        "--work_unit_bytes=8000",  # ~5 units in this 40 kB corpus
    ]
    for workers in (1, 2):
        out = tmp_path / f"w{workers}" / "train.tfrecord"
        assert _run([*common, f"--output_file={out}", f"--num_workers={workers}"]) == 0
    one, two = _shards(tmp_path / "w1"), _shards(tmp_path / "w2")
    assert list(one) == [f"train.tfrecord-0000{i}-of-00003" for i in range(3)]
    assert one == two  # byte for byte
    records = list(tf.data.TFRecordDataset([str(tmp_path / "w1" / name) for name in one]))
    assert f"rows                {len(records)}  (" in capsys.readouterr().out
    assert len(set(r.numpy() for r in records)) == len(records)  # no unit written twice
    if packing:  # packed indeed: some row holds several instances
        parsed = [tf.io.parse_single_example(r, _packed_features(3)) for r in records]
        assert max(int(p["next_sentence_weights"].numpy().sum()) for p in parsed) > 1


def _packed_features(k, length=LENGTH, predictions=PREDICTIONS):
    # The packed record's layout, written here from the TFRecord module's docstring.
    spec = _original_input_fn_features(length, predictions)
    spec["positions"] = tf.io.FixedLenFeature([length], tf.int64)
    spec["sequence_ids"] = tf.io.FixedLenFeature([length], tf.int64)
    spec["next_sentence_positions"] = tf.io.FixedLenFeature([k], tf.int64)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([k], tf.int64)
    spec["next_sentence_weights"] = tf.io.FixedLenFeature([k], tf.float32)
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
    assert np.array_equal(row["next_sentence_weights"], (np.arange(k) < count).astype(float))
    assert np.all(row["next_sentence_labels"][count:] == 0)
    out = []
    for s in range(1, count + 1):
        span = np.flatnonzero(ids == s)
        start, n = int(span[0]), len(span)
        assert np.array_equal(span, start + np.arange(n))  # contiguous
        assert np.array_equal(row["positions"][span], np.arange(n))  # positions restart
        assert row["next_sentence_positions"][s - 1] == start  # its own [CLS]
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
    for name, extra in (("unpacked", []), ("packed", ["--pack_sequences"])):
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


def test_the_command_process_never_imports_tensorflow_for_local_paths(corpus, tmp_path):
    """The spawned workers import TensorFlow; the command's own process (units, appending) does
    not, with local paths: ``cli.run(..., tensorflow=False)``."""
    import subprocess
    import sys

    out = tmp_path / "train.tfrecord"
    argv = [
        "create_pretraining_data", f"--input_file={corpus}", f"--output_file={out}",
        f"--vocab_file={bundled.VOCAB}", f"--max_seq_length={LENGTH}",
        f"--max_predictions_per_seq={PREDICTIONS}", "--num_workers=2", "--work_unit_bytes=100000",
    ]  # fmt: skip
    script = (
        "import runpy, sys\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    runpy.run_module('bertjax.create_pretraining_data', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('exit', code, 'tensorflow', 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "exit 0 tensorflow False" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert out.stat().st_size > 0


def test_default_workers_are_every_core_but_no_more_than_the_units():
    from bertjax.data import offline

    assert offline.default_workers(4, cores=2) == 2  # the bundled corpus: 4 units
    assert offline.default_workers(1, cores=2) == 1
    assert offline.default_workers(1000, cores=16) == 16
    assert offline.default_workers(0, cores=16) == 1
