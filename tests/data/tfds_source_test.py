"""The TFDS source on a real prepared dataset: a tiny ``GeneratorBasedBuilder`` is prepared into a
temporary ``data_dir`` and read back by name, as a Wikipedia builder prepared elsewhere would be."""

import gzip
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data import bundled, instances, pipeline, sources
from bertjax.data.instances import DataError
from configs import base

HANDMADE = "In the beginning. God said (twice)! Was it so?  Yes.\nA new line 'quoted.' End"


class BertjaxTinyDocs(tfds.core.GeneratorBasedBuilder):
    """One example per document: chapters of the bundled corpus as running text."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        text = tfds.features.Text()
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"text": text, "title": text})
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing is downloaded
        return {
            "train": self._generate_examples(0, 40),
            "validation": self._generate_examples(40, 44),
        }

    def _generate_examples(self, start, stop):
        for index, text in enumerate(_texts()[start:stop], start):
            yield index, {"text": text, "title": f"chapter {index}"}


def _texts():
    """44 chapters, verses joined by spaces; the first one is a hand-made edge case."""
    with gzip.open(bundled.TRAIN_CORPUS, "rt", encoding="utf-8") as f:
        chapters = f.read().split("\n\n")[:43]
    return [HANDMADE] + [" ".join(c.split("\n")) for c in chapters]


def _sentences(text):
    """The documented rule, transcribed with Python's ``re``: split after ``.?!`` (and closing
    quotes/brackets) followed by whitespace; newlines always split."""
    return re.sub(r"([.?!][\"')\]]*)\s+", "\\1\n", text).split("\n")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tfds"))
    builder = BertjaxTinyDocs(data_dir=path)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
    return path


def _config(data_dir, tmp_path, **overrides):
    config = base.get_config().data
    config.update(
        source="tfds",
        tfds_name="bertjax_tiny_docs",
        tfds_data_dir=data_dir,
        cache_dir=str(tmp_path / "cache"),
        max_seq_length=64,
        max_predictions_per_seq=10,
    )
    config.update(overrides)
    return config


def test_documents_are_split_into_sentences_and_tokenized(data_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")  # the Rust core of HF BertTokenizerFast
    hf = tokenizers.BertWordPieceTokenizer(bundled.VOCAB, lowercase=True)
    lines = instances.tfds_line_dataset("bertjax_tiny_docs", "train", data_dir, "text")
    lines = [x.decode() for x in lines.as_numpy_iterator()]
    by_first = {}
    for text in _texts()[:40]:
        by_first[_sentences(text)[0]] = _sentences(text)
    documents_text, current = [], []
    for line in lines:  # blank line = end of document
        if line:
            current.append(line)
        else:
            documents_text.append(current)
            current = []
    assert len(documents_text) == 40
    for sentences in documents_text:
        assert sentences == by_first[sentences[0]]
    assert by_first["In the beginning."] == [
        "In the beginning.",
        "God said (twice)!",
        "Was it so?",
        "Yes.",
        "A new line 'quoted.'",
        "End",
    ]
    config = _config(data_dir, tmp_path)
    tokenizer = sources.create_tokenizer(config)
    documents, source = sources.read_documents(config, tokenizer, "train")
    assert source == "tfds bertjax_tiny_docs:train"
    for document, sentences in zip(documents, documents_text, strict=True):
        ids = [hf.encode(s, add_special_tokens=False).ids for s in sentences]
        assert document.sentence_lengths.tolist() == [len(i) for i in ids if i]
        assert document.ids.tolist() == sum(ids, [])
    with pytest.raises(DataError, match="tfds_text_field='body'"):
        instances.tfds_line_dataset("bertjax_tiny_docs", "train", data_dir, "body")
    with pytest.raises(DataError, match="tfds_name='no_such_dataset'"):
        instances.tfds_line_dataset("no_such_dataset", "train", data_dir, "text")


def test_two_hosts_get_disjoint_shares_covering_the_dataset(data_dir, tmp_path):
    config = _config(data_dir, tmp_path)
    tokenizer = sources.create_tokenizer(config)
    for split in ("train", "eval"):
        table = sources.open_or_build(config, tokenizer, split, 0)
        steps = pipeline.num_eval_batches(table.num_rows, 8, 2)
        hosts = []
        for host in range(2):
            dataset = pipeline.create_pretrain_dataset(
                config, batch_size=8, seed=0, process_index=host, process_count=2, split=split
            )
            hosts.append(list(dataset.take(steps).as_numpy_iterator()))
        assert len(hosts[0]) == len(hosts[1]) == steps
        seen = []
        for k in range(steps):  # global batch k = host 0's rows, then host 1's
            for batch in (hosts[0][k], hosts[1][k]):
                ids = batch["input_ids"].copy()
                r, c = np.nonzero(batch["masked_lm_weights"])
                ids[r, batch["masked_lm_positions"][r, c]] = batch["masked_lm_ids"][r, c]
                seen.extend(map(tuple, ids[batch["example_weight"] > 0]))
        # Train: the first table.num_rows stream positions are one epoch; eval is unpadded rows.
        rows = table.read(np.arange(table.num_rows))[:, :64]
        assert sorted(seen[: table.num_rows]) == sorted(map(tuple, rows)), split
        assert len(seen) == table.num_rows or split == "train"
