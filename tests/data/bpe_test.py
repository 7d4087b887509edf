"""Byte-level BPE (``bertjax.data.tokenization.BPETokenizer``, ModernBERT's kind of tokenizer)
against transformers' fast tokenizer on the same ``tokenizer.json``.

The tokenizer is learnt here by ``python -m bertjax.vocab --type=bpe`` (in this process) on the
bundled eval split, cased and lower-cased: its ids, through ``tokenize`` in a batched
``tf.data`` map, equal ``PreTrainedTokenizerFast(tokenizer_file=...)``'s on the Unicode stress
file (accents, CJK, controls, emoji, zero-width characters, literal special tokens), whitespace
runs and long words; words pre-split (NER, SQuAD) equal its ``is_split_into_words`` pieces with
``add_prefix_space``; whole-word grouping and masking read 'Ġ'; pretraining batches come out of
the pipeline with it; bad files are one line.
"""

import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
import transformers

from bertjax.data import bundled, masking, pipeline, tokenization
from bertjax.training import checkpoint
from tests.commands import in_process

TESTDATA = pathlib.Path(__file__).parents[1] / "testdata"
HARD = [
    "  two  spaces\tand\ttabs\n\nnewlines  ",
    "x" * 300,
    "antidisestablishmentarianism " * 3,
    "a [MASK] b [CLS][SEP] c[PAD]d",
    "",
    " lead",
    "trail ",
    "\u00a0\u2003nbsp and em space\u200b zero width",
]


@pytest.fixture(scope="module", params=[False, True], ids=["cased", "uncased"])
def bpe(request, tmp_path_factory):
    """(bertjax's tokenizer, transformers' fast tokenizer, the file) of a BPE of 2,000."""
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    result = in_process.run_module(
        "bertjax.vocab", f"--input_file={bundled.bundled_paths().eval}",
        f"--output_file={path}", "--vocab_size=2000", "--type=bpe",
        f"--do_lower_case={request.param}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ours = tokenization.create_tokenizer("bpe", str(path), request.param)
    return ours, transformers.PreTrainedTokenizerFast(tokenizer_file=str(path)), path


def _lines() -> list[str]:
    with open(TESTDATA / "unicode_stress.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f] + HARD


def test_ids_equal_transformers_fast_tokenizer_in_a_batched_tf_data_map(bpe):
    ours, reference, _ = bpe
    lines = _lines()
    dataset = tf.data.Dataset.from_tensor_slices(lines).batch(64).map(ours.tokenize)
    got = [row for batch in dataset for row in batch.to_list()]
    want = [reference(line, add_special_tokens=False)["input_ids"] for line in lines]
    assert len(got) == len(want)
    for line, a, b in zip(lines, got, want, strict=True):
        assert a == b, line
    assert ours.vocab_size == len(reference) == checkpoint.vocab_fingerprint(bpe[2])["entries"]
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
    assert reference("a", "b")["input_ids"] == [2, *ours.encode(["a"])[0], 3,
                                                *ours.encode(["b"])[0], 3]  # fmt: skip


def test_words_are_grouped_at_g_and_presplit_words_take_a_prefix_space(bpe):
    ours, reference, path = bpe
    text = "Then Abraham rose up early, unbelievably"
    words = ours.tokenize_words(tf.constant([text])).to_list()[0]
    assert sum(words, []) == ours.encode([text])[0]
    assert [ours.vocab[w[0]][0] for w in words[1:]] == ["\u0120"] * (len(words) - 1)
    pieces = ours.encode_words(text.split())
    prefixed = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), add_prefix_space=True)
    encoded = prefixed(text.split(), is_split_into_words=True, add_special_tokens=False)
    assert sum(pieces, []) == encoded["input_ids"]
    assert [i for i, p in enumerate(pieces) for _ in p] == encoded.word_ids()
    table = masking.continuation_table(ours.vocab, "bpe")
    assert not table[ours.encode([" rose"])[0][0]] and not table[ours.mask_id]


def test_pretraining_batches_come_out_of_the_pipeline(bpe, tmp_path):
    ours, _, path = bpe
    config = _tiny_data_config(str(path), str(tmp_path / "cache"))
    dataset = pipeline.create_pretrain_dataset(
        config, batch_size=4, seed=0, process_index=0, process_count=1
    )
    batch = next(pipeline.numpy_batches(dataset, config))
    assert (batch["input_ids"][:, 0] == ours.cls_id).all()
    assert batch["input_ids"].max() < ours.vocab_size
    masked = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    assert masked.size and not np.isin(masked, list(ours.special_ids)).any()


def _tiny_data_config(vocab_file: str, cache_dir: str):
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "configs"))
    import tiny  # noqa: PLC0415

    config = tiny.get_config().unlock().data
    config.update(
        tokenizer="bpe", vocab_file=vocab_file, cache_dir=cache_dir, max_seq_length=32,
        max_predictions_per_seq=5, input_files=[bundled.bundled_paths().eval],
    )  # fmt: skip
    return config


@pytest.mark.parametrize(
    "content,expected",
    [
        ("not json", "not a HF tokenizer.json"),
        ('{"model": {"type": "BPE", "vocab": {"a": 1}, "merges": []}}', "no token has id 0"),
        (None, "missing special token(s) [MASK]"),
    ],
)
def test_bad_tokenizer_files_are_one_line(bpe, tmp_path, content, expected):
    path = tmp_path / "tokenizer.json"
    if content is None:  # a valid tokenizer whose id 4 is not [MASK]
        text = bpe[2].read_text().replace('"[MASK]"', '"[MASQUE]"')
        content, expected = text, "missing special token(s) [MASK]"
    path.write_text(content)
    with pytest.raises(tokenization.TokenizerError, match=re.escape(f"{path}: ")) as error:
        tokenization.create_tokenizer("bpe", str(path), False)
    assert expected in str(error.value) and "\n" not in str(error.value)
