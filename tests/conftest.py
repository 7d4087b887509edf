"""Test set-up: 8 fake CPU devices for sharding tests, TensorFlow kept off accelerators.

This runs before any test module imports JAX, so the flags take effect.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib  # noqa: E402

import pytest  # noqa: E402

TESTDATA = pathlib.Path(__file__).parent / "testdata"


@pytest.fixture
def testdata() -> pathlib.Path:
    return TESTDATA
