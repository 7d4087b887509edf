"""The BiLSTM head against PyTorch: ``nn.LSTM(bidirectional=True, num_layers=2, batch_first=True)``
with the same weights, on padded sequences through ``pack_padded_sequence``, gives the same
outputs at every real token and the same final states (``h_n``); a packed row gives each of its
instances what that instance gives alone; the parameters carry their logical axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.model import bilstm
from bertjax.model.config import BertConfig
from tests.model import lstm_reference

CONFIG = BertConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
RNN = bilstm.BiLSTMConfig(hidden_size=5, num_layers=2)
FEATURES, LENGTH = 6, 7


def _params(seed=0):
    """BiLSTM params redrawn at scale 0.5 (BERT's 0.02 would hide a wrong gate in the noise)."""
    ids = jnp.zeros((1, LENGTH, FEATURES))
    shapes = jax.eval_shape(bilstm.BiLSTM(CONFIG, RNN).init, jax.random.key(seed), ids, ids[..., 0])
    leaves, treedef = jax.tree.flatten(nn.unbox(shapes)["params"])
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    drawn = [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, drawn)


def _reference(params, x: np.ndarray, lengths) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's outputs <float32>[N, T, 2R] (0 on padding) and final states <float32>[N, 2R]."""
    lstm = lstm_reference.torch_lstm(params, FEATURES, RNN.hidden_size, RNN.num_layers)
    return lstm_reference.run(lstm, x, lengths)


def _inputs(lengths, seed=0):
    x = np.random.default_rng(seed).normal(size=(len(lengths), LENGTH, FEATURES))
    mask = (np.arange(LENGTH)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    return x.astype(np.float32), mask


def test_padded_sequences_match_torch_lstm():
    lengths = [7, 3, 1, 5]
    x, mask = _inputs(lengths)
    x[mask == 0] = 100.0  # padding that leaked into a real token would show
    params = _params()
    outputs, final = jax.jit(bilstm.BiLSTM(CONFIG, RNN).apply)({"params": params}, x, mask)
    ref_outputs, ref_final = _reference(params, x, lengths)
    assert outputs.shape == (4, LENGTH, 2 * RNN.hidden_size) and final.shape == (4, 10)
    np.testing.assert_allclose(np.asarray(outputs), ref_outputs, atol=2e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(final), ref_final, atol=2e-6, rtol=0)


def _packed_row(instance_lengths: list[list[int]], k: int):
    """sequence_ids <int32>[B, L] of rows holding instances of these lengths, in order."""
    ids = np.zeros((len(instance_lengths), LENGTH), np.int32)
    for row, lengths in enumerate(instance_lengths):
        offsets = np.cumsum([0, *lengths])
        for slot, (begin, end) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
            ids[row, begin:end] = slot + 1
    assert all(len(lengths) <= k for lengths in instance_lengths)
    return ids


def test_packed_rows_read_each_instance_alone():
    rows = [[3, 2, 2], [4], [1, 5]]  # full, padded, and a 1-token instance
    k = 3
    sequence_ids = _packed_row(rows, k)
    x, _ = _inputs([LENGTH] * len(rows), seed=1)
    x[sequence_ids == 0] = 100.0
    params = _params(seed=2)
    outputs, final = jax.jit(bilstm.BiLSTM(CONFIG, RNN).apply, static_argnums=3)(
        {"params": params}, x, sequence_ids, k
    )
    assert outputs.shape == (3, LENGTH, 10) and final.shape == (3, k, 10)
    for row, lengths in enumerate(rows):
        offsets = np.cumsum([0, *lengths])
        for slot, (begin, end) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
            alone = np.zeros((1, LENGTH, FEATURES), np.float32)
            alone[0, : end - begin] = x[row, begin:end]
            ref_outputs, ref_final = _reference(params, alone, [end - begin])
            got = np.asarray(outputs[row, begin:end])
            np.testing.assert_allclose(got, ref_outputs[0, : end - begin], atol=2e-6, rtol=0)
            np.testing.assert_allclose(np.asarray(final[row, slot]), ref_final[0], atol=2e-6)
        assert not np.asarray(final[row, len(lengths) :]).any()  # empty slots
    assert not np.asarray(outputs)[sequence_ids == 0].any()  # padding


def test_params_are_named_with_logical_axes():
    ids = jnp.zeros((1, LENGTH, FEATURES))
    boxed = jax.eval_shape(bilstm.BiLSTM(CONFIG, RNN).init, jax.random.key(0), ids, ids[..., 0])
    specs = nn.get_partition_spec(boxed)["params"]
    first = specs["layer_0"]["forward_rnn"]["cell"]
    second = specs["layer_1"]["backward_rnn"]["cell"]
    assert tuple(first["ii"]["kernel"]) == ("embed", "rnn")
    assert tuple(second["ii"]["kernel"]) == (None, "rnn")  # reads the 2R below, not the encoder
    assert tuple(first["hf"]["kernel"]) == (None, "rnn")
    assert tuple(first["hf"]["bias"]) == ("rnn",)


@pytest.mark.parametrize("field", ["hidden_size", "num_layers"])
def test_config_refuses_a_size_below_one(field):
    with pytest.raises(ValueError, match=f"BiLSTMConfig.{field}=0: expected a positive integer"):
        bilstm.BiLSTMConfig(**{"hidden_size": 4, "num_layers": 1, field: 0})
