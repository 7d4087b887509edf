"""Random HF BERT models saved as HF directories, built once per session."""

import pytest

from tests.interop import references


@pytest.fixture(scope="session")
def base_pretraining(tmp_path_factory):
    """A seeded random BertForPreTraining at BERT-base size, saved as a HF directory."""
    model = references.random_pretraining(0)  # transformers' defaults are BERT-base
    return model, references.hf_dir(model, tmp_path_factory.mktemp("hf_base"))


@pytest.fixture(scope="session")
def small_pretraining(tmp_path_factory):
    model = references.random_pretraining(1, **references.SMALL)
    return model, references.hf_dir(model, tmp_path_factory.mktemp("hf_small"))
