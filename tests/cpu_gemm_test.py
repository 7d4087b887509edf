"""The MKL GEMM kernel (bertjax/cpu_gemm.py) against references: numpy's matmul for values, JAX's
autodiff of ``jnp.matmul`` for gradients, and HF's PyTorch BertForPreTraining for a whole model's
outputs and parameter gradients with ``matmul='blas'``.
"""

import os
import pathlib
import platform
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bertjax import checkpoint, convert, cpu_gemm, train_inputs
from bertjax import sharding as sh
from bertjax.heads import BertForPreTraining

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "configs"))
import base as base_config  # noqa: E402
from heads_test import hf_pretraining_dir, pretraining_inputs  # noqa: E402

pytestmark = pytest.mark.xdist_group("cpu_gemm")


def test_kernel_is_available_where_mkl_is_a_dependency():
    # setup.cfg installs mkl on x86-64 Linux, and a C++ compiler is part of this platform's set-up;
    # here the kernel must load, or every 'auto' run silently falls back to XLA's slower dots.
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert cpu_gemm.available(), cpu_gemm.unavailable_reason()
    else:
        pytest.skip("mkl is only installed on x86-64 Linux")


def _op(x, trans):
    return np.swapaxes(x, -1, -2) if trans else x


# Small and odd shapes, shapes past the kernel's block threshold (so it splits the output by rows
# or, when N > M, by columns across threads), batched, and empty ones.
SHAPES = [(5, 7, 9), (100, 33, 70), (40, 17, 300), (1, 1, 1), (0, 4, 3), (3, 0, 5), (6, 4, 0)]


@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_dot_matches_numpy(batch, trans_a, trans_b):
    rng = np.random.default_rng(0)
    for m, k, n in SHAPES:
        a = rng.standard_normal((*batch, *((k, m) if trans_a else (m, k)))).astype(np.float32)
        b = rng.standard_normal((*batch, *((n, k) if trans_b else (k, n)))).astype(np.float32)
        out = jax.jit(lambda x, y: cpu_gemm.dot(x, y, trans_a, trans_b))(a, b)
        ref = np.matmul(_op(a, trans_a).astype(np.float64), _op(b, trans_b).astype(np.float64))
        assert out.shape == ref.shape and out.dtype == jnp.float32
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(k, 1) ** 0.5)


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_dot_gradients_match_jax_autodiff(batch, trans_a, trans_b):
    rng = np.random.default_rng(1)
    m, k, n = 37, 45, 66
    a = rng.standard_normal((*batch, *((k, m) if trans_a else (m, k)))).astype(np.float32)
    b = rng.standard_normal((*batch, *((n, k) if trans_b else (k, n)))).astype(np.float32)
    weights = rng.standard_normal((*batch, m, n)).astype(np.float32)

    def loss(dot, x, y):
        return jnp.sum(jnp.tanh(dot(x, y)) * weights)

    ours = jax.grad(lambda x, y: loss(lambda p, q: cpu_gemm.dot(p, q, trans_a, trans_b), x, y),
                    argnums=(0, 1))(a, b)  # fmt: skip
    ref = jax.grad(
        lambda x, y: loss(lambda p, q: jnp.matmul(_op(p, trans_a), _op(q, trans_b)), x, y),
        argnums=(0, 1),
    )(a, b)
    for got, want in zip(ours, ref, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dot_rejects_bad_operands():
    a = jnp.ones((4, 3), jnp.float32)
    with pytest.raises(TypeError, match="float32"):
        cpu_gemm.dot(a.astype(jnp.bfloat16), a.T.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="contracting dims"):
        cpu_gemm.dot(a, a)
    with pytest.raises(ValueError, match="rank 2 or 3"):
        cpu_gemm.dot(a[None], a.T)


def test_cpu_vendor_reads_proc_cpuinfo():
    vendor = cpu_gemm.cpu_vendor()
    if sys.platform == "linux":
        text = pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
        assert vendor and re.search(rf"^vendor_id\s*: {re.escape(vendor)}$", text, re.M), vendor
    else:
        assert vendor is None


def test_resolve(monkeypatch):
    # This test process has 8 (fake) CPU devices: 'auto' keeps XLA, which can shard.
    assert cpu_gemm.resolve("auto") == "xla"
    assert "8 devices" in cpu_gemm.auto_choice()[1]
    # One device: MKL on Intel CPUs only (it runs generic code paths elsewhere, slower than XLA).
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: "GenuineIntel")
    assert cpu_gemm.resolve("auto", num_devices=1) == "blas"
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: "AuthenticAMD")
    assert cpu_gemm.auto_choice(num_devices=1) == (
        "xla",
        "MKL is not optimised for this CPU, vendor AuthenticAMD",
    )
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: None)
    assert cpu_gemm.resolve("auto", num_devices=1) == "xla"
    assert cpu_gemm.describe("auto") == "xla (8 devices, the kernel runs on one)"
    assert cpu_gemm.describe("xla") == "xla (set in the config)"
    assert cpu_gemm.resolve("xla", num_devices=1) == "xla"
    assert cpu_gemm.resolve("blas") == "blas"
    with pytest.raises(ValueError, match=r"model.matmul='mkl': expected one of"):
        cpu_gemm.resolve("mkl")


def test_blas_with_a_multi_device_mesh_is_a_config_error():
    config = base_config.get_config()
    bert_config = model_config().replace(matmul="blas")
    mesh = sh.create_mesh((8, 1, 1))
    with pytest.raises(ValueError, match=r"config.model.matmul='blas' runs on one CPU device"):
        train_inputs.check_config(config, bert_config, mesh, 1)


def model_config():
    from bertjax.model import BertConfig

    return BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=4,
                      intermediate_size=32, max_position_embeddings=16)  # fmt: skip


def test_checkpoint_config_is_portable(tmp_path):
    # A checkpoint written by a CPU run must not carry 'blas' to the accelerator that reads it.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"t{i}\n" for i in range(40)))
    cfg = model_config().replace(matmul="blas")
    ids = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    abstract = jax.eval_shape(BertForPreTraining(cfg).init, jax.random.key(0), ids, ids, ids, ids)
    params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), abstract["params"])
    checkpoint.save_params(str(tmp_path / "ckpt"), jax.tree.map(np.asarray, params), cfg,
                           str(vocab), True)  # fmt: skip
    _, loaded, _ = checkpoint.load_params(str(tmp_path / "ckpt"))
    assert loaded.matmul == "xla" and loaded == cfg.replace(matmul="xla")


def test_pretraining_outputs_and_gradients_match_hf(tmp_path):
    hf = hf_pretraining_dir(tmp_path, "gelu")
    conv = convert.load(str(tmp_path), do_lower_case=True)
    cfg = conv.config.replace(matmul="blas", hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    ids, segments, mask, positions = pretraining_inputs()
    rng = np.random.default_rng(1)
    mlm_weights = rng.standard_normal((2, 3, 40)).astype(np.float32)
    nsp_weights = rng.standard_normal((2, 2)).astype(np.float32)

    def loss(params):
        out = BertForPreTraining(cfg).apply({"params": params}, ids, segments, mask, positions)
        return jnp.sum(out.mlm_logits * mlm_weights) + jnp.sum(out.nsp_logits * nsp_weights)

    value, grads = jax.jit(jax.value_and_grad(loss))(conv.params)

    hf.zero_grad()
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
             token_type_ids=torch.tensor(segments, dtype=torch.long),
             attention_mask=torch.tensor(mask, dtype=torch.long))  # fmt: skip
    mlm = out.prediction_logits[torch.arange(2)[:, None], torch.tensor(positions, dtype=torch.long)]
    ref = (mlm * torch.tensor(mlm_weights)).sum() + (
        out.seq_relationship_logits * torch.tensor(nsp_weights)
    ).sum()
    ref.backward()
    ref_value = float(ref.detach())
    assert abs(float(value) - ref_value) <= 1e-4 * max(1.0, abs(ref_value))
    layer = hf.bert.encoder.layer[1]
    encoder = grads["encoder"]
    pairs = {
        "word embeddings (tied decoder)": (
            encoder["embeddings"]["word_embeddings"]["embedding"],
            hf.bert.embeddings.word_embeddings.weight.grad.numpy(),
        ),
        "query": (
            encoder["layers"]["layer_1"]["attention"]["query"]["kernel"].reshape(16, 16),
            layer.attention.self.query.weight.grad.numpy().T,
        ),
        "intermediate": (
            encoder["layers"]["layer_1"]["intermediate"]["kernel"],
            layer.intermediate.dense.weight.grad.numpy().T,
        ),
        "mlm transform": (
            grads["mlm"]["transform"]["kernel"],
            hf.cls.predictions.transform.dense.weight.grad.numpy().T,
        ),
    }
    for name, (got, want) in pairs.items():
        scale = np.abs(want).max()
        assert np.abs(np.asarray(got) - want).max() <= 1e-4 * scale, name


def test_broken_compiler_falls_back_to_xla_with_the_reason(tmp_path):
    # A fresh cache (nothing built yet) and a compiler that fails: 'auto' must fall back to XLA's
    # dots, 'blas' must be a clear config error, and nothing may be left under the cached name.
    script = (
        "from bertjax import cpu_gemm\n"
        "print('reason:', cpu_gemm.unavailable_reason().splitlines()[0])\n"
        "print('auto:', cpu_gemm.resolve('auto', num_devices=1))\n"
        "try:\n"
        "    cpu_gemm.resolve('blas')\n"
        "except ValueError as e:\n"
        "    print('blas:', str(e).splitlines()[0])\n"
    )
    env = {**os.environ, "CXX": "false", "BERTJAX_CACHE_DIR": str(tmp_path / "cache")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reason: compiling" in out.stdout and "cpu_gemm.cc failed" in out.stdout
    assert "auto: xla" in out.stdout
    assert "blas: model.matmul='blas': compiling" in out.stdout
    assert not list((tmp_path / "cache").glob("*.so"))
