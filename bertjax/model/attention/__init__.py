"""Scaled dot-product attention behind one function, :func:`attention`, dropout included.

Per example b, head n, query q and key k (the query already scaled by 1 / sqrt(D)):

    logits = query . key + bias        in float32 (the product accumulated in float32, never
                                       rounded to dtype); bias: 0 allowed, MASK_VALUE masked
    u = exp(logits - stop_gradient(max_k logits)),  row_sum = sum_k u
    context = (sum_k dropout(dtype(u)) value) / row_sum

``key_mask`` <int32>[B, L] holds each token's **sequence id**: 0 on padding, else the instance
the token belongs to (1 for every real token of an unpacked row, 1..k in a row packed with k
instances; ``bertjax.data.pipeline``'s packed-row contract). A query's id is its position's.
Key ``k`` is allowed for query ``q`` when ``id[k] > 0`` and ``id[k] == id[q]`` (a packed row's
instances never see each other; a padding query, id 0, sees every real key, as in an unpacked
row) and, for causal attention, ``k <= query_positions[b, q]`` (row positions: causal within
each instance), and, on a local layer with a window w ('modernbert'), ``|k - q's row| <= w``.
``MASK_VALUE`` is finite, so a row whose keys are all masked (a padding-only example) is
uniform over the L keys instead of NaN. Dropout is the counter hash of ``dropout.py`` over the
global [B, N, Q, L] positions.

Kernels (``BertConfig.attention_impl`` once resolved; all compute that function):

* ``xla``: the formula as XLA ops (``xla.py``); the [B, N, Q, L] scores go through memory.
* ``tpu``: the Pallas TPU flash kernel (``tpu/``), dropout included, never writing the scores.
* ``gpu``: cuDNN's fused attention (``gpu/cudnn.py``) for calls it can run (no dropout, 16-bit),
  else the Pallas GPU (Triton) flash kernel (``gpu/``) with the same dropout: a choice made per
  call from its dropout and dtype.
* ``tpu_interpret``, ``gpu_interpret``: the Pallas kernels in interpret mode, on any platform
  (the tests run them on CPU).

The flash kernels skip the key blocks that share no instance with a query block (a packed row's
other instances; the padding after a row's last real key) or lie outside its window, forward and
backward (``common.py``): a local layer's work grows with its window, not with L.
Under a mesh a flash kernel runs per (batch, heads) shard with the mesh axes of the logical
rules for ``act_batch`` and ``act_heads``; ``common.py`` holds what the kernels share.

The run config asks with ``'auto' | 'xla' | 'fused'``; :func:`resolve` turns the ask into a
kernel for a platform, once, where a step is built for its mesh
(``bertjax.training.sharding.bert_config_for``); nothing here reads the platform. ``'auto'``:
the flash kernels on TPU and GPU, XLA on CPU; ``'fused'``: the same on TPU and GPU, the TPU
kernel in interpret mode on CPU. A model applied with an unresolved ask (shape evaluation, a
model used outside a step) runs the XLA path.
"""

from __future__ import annotations

import jax
from flax import linen as nn

from bertjax.model import axes
from bertjax.model.attention import gpu, tpu
from bertjax.model.attention.common import CHECKPOINT_NAMES, MASK_VALUE
from bertjax.model.attention.gpu import cudnn
from bertjax.model.attention.xla import xla_attention
from bertjax.model.config import ATTENTION_KERNELS, ATTENTION_REQUESTS

__all__ = ["CHECKPOINT_NAMES", "MASK_VALUE", "attention", "resolve"]


def resolve(impl: str, platform: str) -> str:
    """The kernel (``ATTENTION_KERNELS``) that ``impl`` runs on ``platform`` ('cpu', 'gpu',
    'tpu', ...): an ask (``ATTENTION_REQUESTS``) is chosen per the module docstring, a kernel
    is kept if the platform can run it. ValueError for a kernel the platform cannot run."""
    if impl in ATTENTION_KERNELS:
        if impl in ("tpu", "gpu") and platform != impl:
            raise ValueError(f"attention_impl={impl!r} runs on {impl} only, not {platform}")
        return impl
    if impl not in ATTENTION_REQUESTS:
        raise ValueError(f"attention_impl={impl!r}: expected one of {ATTENTION_REQUESTS}")
    if platform in ("tpu", "gpu"):
        return platform
    if impl == "fused":  # no native kernel here: the TPU kernel's interpreter
        return "tpu_interpret"
    return "xla"


def attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    key_mask: jax.Array,
    *,
    causal: bool,
    query_positions: jax.Array | None,
    dropout_rate: float,
    dropout_seed: jax.Array | None,
    kernel: str = "xla",
    window: int | None = None,
) -> jax.Array:
    """Softmax(query · key) · value with masking and attention dropout (module docstring).

    Args:
      query: <dtype>[B, Q, N, D], already scaled by 1 / sqrt(D).
      key, value: <dtype>[B, L, N, D].
      key_mask: <int32>[B, L], sequence ids: 0 = padding, > 0 = the token's instance
        (an unpacked row's input mask is its sequence ids).
      causal: the left-to-right ablation's mask (key position <= query position).
      query_positions: <int32>[B, Q], the sequence position of each query (for the causal
        mask), or None when the queries are every position (Q == L).
      dropout_rate: attention dropout rate; applied when ``dropout_seed`` is given.
      dropout_seed: <uint32>[2] or None (no dropout).
      kernel: a resolved ``BertConfig.attention_impl`` (an unresolved ask runs 'xla').
      window: a local layer's window (``BertConfig.window``): query row q sees key row k only
        when |q - k| <= window (rows: ``query_positions``, else 0..L-1). None: global. The flash
        kernels visit only the key blocks within it of each query block.

    Returns:
      <dtype>[B, Q, N, D].
    """
    if query_positions is None and query.shape[1] != key.shape[1]:
        raise ValueError(f"{query.shape[1]} queries need query_positions for {key.shape[1]} keys")
    if dropout_rate <= 0.0:
        dropout_seed = None
    args = (query, key, value, key_mask)
    if kernel not in ("tpu", "gpu", "tpu_interpret", "gpu_interpret"):
        return xla_attention(*args, causal, query_positions, dropout_rate, dropout_seed, window)
    if kernel == "gpu" and cudnn.runs(dropout_seed is not None, query.dtype):
        return cudnn.cudnn_attention(*args, causal, query_positions, window=window)
    flash = tpu.flash_attention if kernel.startswith("tpu") else gpu.flash_attention
    options = dict(
        causal=causal,
        query_positions=query_positions,
        dropout_rate=dropout_rate,
        dropout_seed=dropout_seed,
        interpret=kernel.endswith("_interpret"),
        window=window,
    )
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return flash(*args, **options)
    batch_axes, head_axes = (
        () if names is None else (names,) if isinstance(names, str) else tuple(names)
        for names in nn.logical_to_mesh_axes((axes.ACT_BATCH, axes.ACT_HEADS))
    )
    return flash(*args, mesh=mesh, batch_axes=batch_axes, head_axes=head_axes, **options)
