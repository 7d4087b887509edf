"""The offline tool end to end; records parsed with the original run_pretraining.py spec."""

import gzip
import itertools

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from bertjax import cli, create_pretraining_data
from bertjax.data import bundled

LENGTH, PREDICTIONS = 64, 10


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
    assert sorted(tmp_path.iterdir()) == [bad, good]


def _shards(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_output_is_identical_for_one_and_two_worker_processes(corpus, tmp_path, capsys):
    common = [
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
    assert f"examples            {len(records)}" in capsys.readouterr().out
    assert len(set(r.numpy() for r in records)) == len(records)  # no unit written twice


def test_work_units_hold_exactly_the_corpus_documents(tmp_path):
    from bertjax.data import instances, sources, tokenization

    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f:
        text = "".join(itertools.islice(f, 1200))
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text[:20000].encode()))
    (tmp_path / "b.txt").write_text("\n\n  \nOne lone document.\nIn file b.\n\n\n")
    (tmp_path / "c.txt").write_text(text[20000:] + "\r\nlast line\r\n")
    (tmp_path / "d.txt").write_text("")
    files = sorted(str(p) for p in tmp_path.iterdir())
    tokenizer = tokenization.create_tokenizer("wordpiece", bundled.VOCAB, True)
    expected = list(instances.read_text_documents(files, tokenizer))
    tokenize = instances.line_batch_tokenizer(tokenizer)
    for unit_bytes in (1, 5000, 10**9):
        units = sources.work_units(files, unit_bytes)
        assert [u.index for u in units] == list(range(len(units)))
        got = [list(sources.unit_documents(u, tokenize)) for u in units]
        assert all(len(documents) >= 2 for documents in got)  # NotNext needs another document
        got = [d for documents in got for d in documents]
        assert len(got) == len(expected), unit_bytes
        for a, b in zip(got, expected, strict=True):
            assert a.ids.tolist() == b.ids.tolist()
            assert a.sentence_lengths.tolist() == b.sentence_lengths.tolist()
    assert len(sources.work_units(files, 5000)) > 3
    assert len(sources.work_units(files, 10**9)) == 1
