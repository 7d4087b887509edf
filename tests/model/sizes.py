"""The paper's model sizes as configs, and parameter counts, for tests that check them against
the paper and transformers."""

import math

import jax

from bertjax.model.config import SIZES, BertConfig


def config_for_size(size: str, **overrides) -> BertConfig:
    return BertConfig(**{**SIZES[size], **overrides})


def count_params(params) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))
