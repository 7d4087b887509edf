"""The host pipeline: batch contract, determinism, resume, host shares, eval padding, sources."""

import collections
import gzip
import itertools

import numpy as np
import pytest

from bertjax.data import bundled, pipeline
from bertjax.data.instances import DataError
from configs import base

LENGTH, PREDICTIONS = 64, 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first ~1500 lines of the bundled corpus (about 60 documents)."""
    folder = tmp_path_factory.mktemp("corpus")
    with gzip.open(bundled.TRAIN_CORPUS, "rt") as f:
        lines = list(itertools.islice(f, 1500))
    (folder / "train.txt").write_text("".join(lines))
    with gzip.open(bundled.EVAL_CORPUS, "rt") as f:
        (folder / "eval.txt").write_text("".join(itertools.islice(f, 300)))
    return folder


def _config(corpus, **overrides):
    config = base.get_config().data
    config.input_files = [str(corpus / "train.txt")]
    config.eval_input_files = [str(corpus / "eval.txt")]
    config.cache_dir = str(corpus / "cache")
    config.max_seq_length, config.max_predictions_per_seq = LENGTH, PREDICTIONS
    config.update(overrides)
    return config


def _batches(config, count, **kwargs):
    args = dict(batch_size=8, seed=0, process_index=0, process_count=1)
    dataset = pipeline.create_pretrain_dataset(config, **{**args, **kwargs})
    return list(dataset.take(count).as_numpy_iterator())


def _original_ids(batch):
    ids = batch["input_ids"].copy()
    r, c = np.nonzero(batch["masked_lm_weights"])
    ids[r, batch["masked_lm_positions"][r, c]] = batch["masked_lm_ids"][r, c]
    return ids


def _table(config):
    from bertjax.data import sources

    tokenizer = sources.create_tokenizer(config)
    return sources.open_or_build(config, tokenizer, "train", 0)


def _check_host_seconds(batch):
    """The batch's host work: one float32 scalar, positive, and less than a second here."""
    seconds = batch[pipeline.HOST_SECONDS]
    assert seconds.shape == () and seconds.dtype == np.float32, seconds
    assert 0 < seconds < 1, seconds


def test_batch_contract(corpus):
    batch = _batches(_config(corpus), 1)[0]
    shapes = {
        "masked_lm_positions": (8, PREDICTIONS),
        "masked_lm_ids": (8, PREDICTIONS),
        "masked_lm_weights": (8, PREDICTIONS),
        "next_sentence_labels": (8,),
        "example_weight": (8,),
    }
    for name in pipeline.FEATURES:
        assert batch[name].shape == shapes.get(name, (8, LENGTH)), name
        float_names = ("masked_lm_weights", "example_weight")
        assert batch[name].dtype == (np.float32 if name in float_names else np.int32), name
    _check_host_seconds(batch)
    for row in range(8):
        n = batch["input_mask"][row].sum()
        assert np.all(batch["input_mask"][row, :n] == 1) and np.all(
            batch["input_ids"][row, n:] == 0
        )
        seps = np.flatnonzero(_original_ids(batch)[row] == 3)
        assert _original_ids(batch)[row, 0] == 2 and len(seps) == 2 and seps[1] == n - 1
        np.testing.assert_array_equal(batch["segment_ids"][row, : seps[0] + 1], 0)
        np.testing.assert_array_equal(batch["segment_ids"][row, seps[0] + 1 : n], 1)
        np.testing.assert_array_equal(batch["segment_ids"][row, n:], 0)


def test_same_seed_same_batches_and_exact_resume(corpus):
    config = _config(corpus)
    size = _table(config).num_rows
    count = size // 8 + 6  # crosses the first epoch boundary
    full = _batches(config, count)
    again = _batches(config, count)
    resumed = _batches(config, count - 20, start_batch=20)
    for a, b in zip(full, again, strict=True):
        for name in pipeline.FEATURES:  # host_seconds is a timing
            np.testing.assert_array_equal(a[name], b[name])
    for a, b in zip(full[20:], resumed, strict=True):
        for name in pipeline.FEATURES:
            np.testing.assert_array_equal(a[name], b[name])
    other = _batches(config, 1, seed=1)[0]
    assert not np.array_equal(other["input_ids"], full[0]["input_ids"])


def test_hosts_get_disjoint_slices_of_the_global_batch_covering_the_corpus(corpus):
    config = _config(corpus)
    table = _table(config)
    size = table.num_rows
    steps = -(-size // 16)
    single = _batches(config, steps, batch_size=16)
    hosts = [_batches(config, steps, process_index=h, process_count=2) for h in range(2)]
    for k in range(steps):
        for name in pipeline.FEATURES:
            merged = np.concatenate([hosts[0][k][name], hosts[1][k][name]])
            np.testing.assert_array_equal(merged, single[k][name])
    seen = np.concatenate([_original_ids(b) for b in single])[:size]  # exactly one epoch
    rows = table.read(np.arange(size))[:, :LENGTH]
    assert sorted(map(tuple, seen)) == sorted(map(tuple, rows))


def _order_statistics(perm):
    """(fixed points, successors kept, rank correlation with the identity) of a permutation."""
    index = np.arange(len(perm))
    return (
        int((perm == index).sum()),
        int((np.diff(perm) == 1).sum()),
        float(np.corrcoef(index, perm)[0, 1]),
    )


def test_feistel_permutation_shuffles_like_a_random_permutation():
    """A bijection that is also a shuffle: its order statistics are those of numpy's uniformly
    random permutation (the reference), each key gives another order, and over many keys every
    element lands on every position about equally often (the identity, a rotation by the key, a
    reversal or a key-independent shuffle each fail one of these)."""
    for size in (1, 2, 7, 100, 1000, 4097):
        perm = pipeline.feistel_permutation(np.arange(size), size, key=12345)
        assert sorted(perm.tolist()) == list(range(size))
    size = 1000
    reference = _order_statistics(np.random.default_rng(0).permutation(size))
    assert reference[0] <= 5 and reference[1] <= 5 and abs(reference[2]) < 0.1
    orders = [pipeline.feistel_permutation(np.arange(size), size, key=k) for k in range(20)]
    for perm in orders:
        fixed, successors, correlation = _order_statistics(perm)
        assert fixed <= 5 and successors <= 5 and abs(correlation) < 0.15
    assert max((a == b).sum() for a, b in itertools.combinations(orders, 2)) <= 10
    # Where elements land over 1000 keys, in tenths of the range: 100 expected, sd ~9.5. (On
    # tables of a few rows, a 16-entry network, the 4 rounds are measurably uneven.)
    elements, counts = np.array([0, 1, 998, 999]), np.zeros((4, 10), dtype=np.int64)
    for key in range(1000):
        landed = pipeline.feistel_permutation(elements, size, key=key)
        counts[np.arange(4), landed * 10 // size] += 1
    assert np.abs(counts - 100).max() < 45


def test_dynamic_masks_change_between_epochs_static_do_not(corpus):
    for masking, expect_same in (("dynamic", False), ("static", True)):
        config = _config(corpus, masking=masking)
        size = _table(config).num_rows
        rows = np.concatenate([b["input_ids"] for b in _batches(config, 2 * size // 8 + 1)])
        epochs = [set(map(tuple, rows[e * size : (e + 1) * size])) for e in range(2)]
        assert (epochs[0] == epochs[1]) == expect_same, masking


def test_eval_is_finite_padded_and_equal_across_hosts(corpus):
    config = _config(corpus)
    hosts = [
        _batches(config, 10_000, split="eval", process_index=h, process_count=3) for h in range(3)
    ]
    assert len({len(h) for h in hosts}) == 1
    weights = np.concatenate([b["example_weight"] for h in hosts for b in h])
    from bertjax.data import sources

    tokenizer = sources.create_tokenizer(config)
    num_rows = sources.open_or_build(config, tokenizer, "eval", 0).num_rows
    assert weights.sum() == num_rows and len(weights) >= num_rows
    for batch in (b for h in hosts for b in h):
        padded = batch["example_weight"] == 0
        assert np.all(batch["masked_lm_weights"][padded] == 0)
    assert np.array_equal(
        hosts[0][0]["input_ids"], _batches(config, 1, split="eval", process_count=3)[0]["input_ids"]
    )


def test_ltr_and_no_nsp(corpus):
    config = _config(corpus, objective="ltr", nsp=False, max_predictions_per_seq=LENGTH)
    batch = _batches(config, 1)[0]
    assert batch["masked_lm_positions"].shape == (8, LENGTH)
    assert np.all(batch["segment_ids"] == 0) and np.all(batch["next_sentence_labels"] == 0)
    ids, weights = batch["input_ids"], batch["masked_lm_weights"]
    np.testing.assert_array_equal(
        batch["masked_lm_ids"][:, :-1][weights[:, :-1] > 0], ids[:, 1:][weights[:, :-1] > 0]
    )
    assert not np.any(ids == 4)  # nothing masked
    with pytest.raises(DataError, match="max_predictions_per_seq"):
        pipeline.check_data_config(_config(corpus, objective="ltr", nsp=False))


def test_tfrecord_source(corpus, tmp_path):
    from bertjax.data import offline

    config = _config(corpus, dupe_factor=1)
    paths = [str(tmp_path / f"r-{i}.tfrecord") for i in range(3)]
    offline.write_tfrecords(config, paths, seed=0, shuffle_buffer=100)
    record_config = _config(
        corpus,
        source="tfrecord",
        input_files=[str(tmp_path / "*.tfrecord")],
        eval_input_files=[str(tmp_path / "*.tfrecord")],
    )
    batch = _batches(record_config, 1)[0]
    assert batch["input_ids"].shape == (8, LENGTH) and batch["input_ids"].dtype == np.int32
    _check_host_seconds(batch)
    import tensorflow as tf

    total = sum(1 for _ in tf.data.TFRecordDataset(paths))
    hosts = [
        _batches(record_config, 1000, split="eval", process_index=h, process_count=2)
        for h in range(2)
    ]
    assert len(hosts[0]) == len(hosts[1])
    assert sum(b["example_weight"].sum() for h in hosts for b in h) == total
    for batch in hosts[1]:  # eval pads rows, not the batch's scalar
        _check_host_seconds(batch)
    with pytest.raises(DataError, match="input_ids has 64 values but data.max_seq_length=128"):
        pipeline.check_data_config(
            _config(
                corpus,
                source="tfrecord",
                input_files=[str(tmp_path / "*.tfrecord")],
                max_seq_length=128,
            )
        )


def test_bad_inputs_give_clear_errors(corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="no documents"):
        _batches(_config(corpus, input_files=[str(empty)]), 1)
    with pytest.raises(DataError, match="data.input_files=.*no file matches"):
        _batches(_config(corpus, input_files=[str(tmp_path / "missing-*.txt")]), 1)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(t for t in open(bundled.VOCAB).read().split("\n") if t != "[MASK]"))
    with pytest.raises(DataError, match=r"data.vocab_file.*\[MASK\]"):
        _batches(_config(corpus, vocab_file=str(vocab)), 1)
    model = base.get_config().model
    with pytest.raises(DataError, match="model.vocab_size=30522 but data.vocab_file"):
        pipeline.check_data_config(_config(corpus), model)


# Most instances short (random target lengths): rows of 1 and 2 instances (KJV sentences are
# long, so three rarely fit in 128).
SHORT = dict(short_seq_prob=0.9, max_seq_length=128, max_predictions_per_seq=20)
PACKED = dict(pack_sequences=True, max_sequences_per_pack=3, **SHORT)
PACKED_NAMES = (*pipeline.FEATURES, *pipeline.PACKED_FEATURES)


def _rows_of(batch):
    """A batch's real rows as dicts (eval padding rows, example_weight 0, left out)."""
    real = np.flatnonzero(batch["example_weight"] > 0)
    return [{name: batch[name][r] for name in batch if np.ndim(batch[name])} for r in real]


@pytest.mark.parametrize("window", [None, 50])
def test_online_packed_rows_hold_exactly_the_unpacked_instances(corpus, window, monkeypatch):
    """Eval (every unit once, static masks keyed by table row): every packed row unpacks into
    contiguous instances with restarting positions, their own [CLS] and predictions (checked by
    offline_test's unpacker), and together they are exactly the unpacked stream's instances;
    also when the table is packed in several windows."""
    from tests.data.offline_test import _key, _unpack

    if window:
        monkeypatch.setattr(pipeline, "PACK_WINDOW", window)

    train_file = [str(corpus / "train.txt")]  # as the eval split: ~60 documents
    unpacked = _batches(_config(corpus, **SHORT, eval_input_files=train_file), 1000, split="eval")
    packed = _batches(_config(corpus, **PACKED, eval_input_files=train_file), 1000, split="eval")
    rows = [row for batch in packed for row in _rows_of(batch)]
    got = [i for row in rows for i in _unpack(row, 3, 128, 20)]
    want = []
    for row in (r for batch in unpacked for r in _rows_of(batch)):
        instance = {k: row[k] for k in ("input_ids", "input_mask", "segment_ids")}
        instance.update({k: row[k] for k in row if k.startswith("masked_lm")})
        instance["next_sentence_labels"] = np.asarray([row["next_sentence_labels"]])
        want.append(instance)
    assert collections.Counter(map(_key, got)) == collections.Counter(map(_key, want))
    counts = collections.Counter(int(row["sequence_ids"].max()) for row in rows)
    assert counts[2] > 100 and len(rows) < 0.8 * len(want), counts  # rows saved
    for batch in packed:
        assert batch["next_sentence_labels"].shape == (8, 3)
        assert batch["positions"].dtype == batch["sequence_ids"].dtype == np.int32


def test_online_packing_windows_draw_from_the_whole_table(corpus, monkeypatch):
    """The instance table is document-major (a document's instances together): the online
    pipeline packs its rows in an order permuted with the run's seed, so each window of
    ``PACK_WINDOW`` instances (50 here, of about 800) holds instances from all over the table,
    and a row's instances are not neighbours; in table order every row's instances would lie
    within 50 consecutive table rows. Every instance is in one row; the same seed packs the
    same rows, another seed others."""
    from bertjax.data import sources

    monkeypatch.setattr(pipeline, "PACK_WINDOW", 50)
    config = _config(corpus, **PACKED)
    table = _table(config)
    spec = pipeline.masking_spec(config, sources.create_tokenizer(config))
    packs = pipeline.pack_table(table, config, spec, seed=0)
    members, n = packs[packs >= 0], table.num_rows
    assert n > 16 * 50 and sorted(members.tolist()) == list(range(n))
    first_window = members[:50]  # rows come out in window order: the first window's instances
    assert set((first_window * 4 // n).tolist()) == {0, 1, 2, 3}  # from every quarter
    shared = packs[(packs >= 0).sum(axis=1) > 1]
    spans = np.where(shared >= 0, shared, shared.max(axis=1, keepdims=True))
    far = (spans.max(axis=1) - spans.min(axis=1)) >= 50
    assert len(shared) > 100 and far.mean() > 0.8, far.mean()
    np.testing.assert_array_equal(packs, pipeline.pack_table(table, config, spec, seed=0))
    assert not np.array_equal(packs, pipeline.pack_table(table, config, spec, seed=1))


@pytest.mark.parametrize("stub_share", [0.0, 0.47], ids=["wikipedia-like", "many-stubs"])
def test_default_packing_pads_under_5_percent_at_128_and_512(tmp_path, stub_share):
    """configs/base.py's packing defaults, as ``bertjax.main`` packs a split online: under 5% of
    the slots are padding at L = 128 and 512 (only L, P and the corpus set), on the
    Wikipedia-like corpus and on one of many short documents (``bench/wikipedia_like_corpus.py``,
    600 articles; with stubs, about 10% of the instances at 512 under 25 tokens and 37% over
    256, where at most 3 instances per row leave 17% padding). Counted from the rows
    themselves: real tokens over L x rows."""
    from bench import wikipedia_like_corpus
    from bertjax.data import sources

    docs = wikipedia_like_corpus.with_stubs(wikipedia_like_corpus.documents(600, 0), stub_share, 0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    for length, predictions in ((128, 20), (512, 80)):
        config = base.get_config().data
        config.update(input_files=[str(corpus)], cache_dir=str(tmp_path / "cache"),
                      max_seq_length=length, max_predictions_per_seq=predictions,
                      pack_sequences=True)  # fmt: skip
        tokenizer = sources.create_tokenizer(config)
        table = sources.open_or_build(config, tokenizer, "train", 0)
        packs = pipeline.pack_table(table, config, pipeline.masking_spec(config, tokenizer), 0)
        tokens = table.num_tokens()
        real = np.where(packs >= 0, tokens[np.maximum(packs, 0)], 0).sum(axis=1)
        assert real.max() <= length and real.sum() == tokens.sum()
        padding = 1 - real.sum() / (length * len(packs))
        assert padding < 0.05, (stub_share, length, padding)
        if stub_share and length == 512:  # the corpus is what the docstring says
            assert 0.05 < (tokens < 25).mean() and 0.3 < (tokens > 256).mean()


def test_online_packed_stream_resumes_exactly_and_hosts_share_it(corpus):
    """Train (dynamic masks keyed by stream position and slot): the same seed gives the same
    packed batches, a resumed stream continues exactly, and two hosts' shares make the one-host
    global batch."""
    config = _config(corpus, **PACKED)
    full = _batches(config, 12)
    resumed = _batches(config, 4, start_batch=8)
    for a, b in zip(full[8:], resumed, strict=True):
        for name in PACKED_NAMES:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    single = _batches(config, 3, batch_size=16)
    hosts = [_batches(config, 3, process_index=h, process_count=2) for h in range(2)]
    for k in range(3):
        for name in PACKED_NAMES:
            merged = np.concatenate([hosts[0][k][name], hosts[1][k][name]])
            np.testing.assert_array_equal(merged, single[k][name], err_msg=name)
    # The recipe's factor: the train split's instances per packed row, against one epoch of
    # the train stream counted here (its first R positions, R = the packed rows).
    per_row = pipeline.instances_per_row(config, seed=0)
    instances = _table(_config(corpus, **SHORT)).num_rows
    epoch = round(instances / per_row)
    stream = _batches(config, -(-epoch // 8))
    counted = np.concatenate([b["instance_weights"].sum(axis=1) for b in stream])[:epoch]
    assert counted.sum() == instances and per_row > 1.25
