"""The kernel check at a run's start, at its shapes (``kernel_check.checked``): a fused kernel that
passes is kept, one that fails (here: the Pallas TPU kernel in interpret mode with its output
scaled by 1.02) gives 'xla' with one warning line and a record; the check runs once per process
and shapes, not at all for 'xla', with ``attention_check=False`` or for devices this process
cannot run, and never where a step is built (``sharding.bert_config_for`` is pure). The loops
check at the shapes their steps run (the gathered last layer, packed rows), and a kernel wrong
only there is caught."""

import re

import jax
import numpy as np
import pytest

from bertjax.model.attention import self_check, tpu
from bertjax.model.config import BertConfig
from bertjax.training import kernel_check
from bertjax.training import sharding as sh

CONFIG = BertConfig(
    vocab_size=64, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64,
    attention_impl="fused", attention_dropout_rate=0.1,
)  # fmt: skip
WARNING = re.compile(r"^WARNING: attention self-check failed: .*$", re.M)
SHAPES = self_check.Shapes(length=64, packed=0)


def _checked(config, mesh, shapes=SHAPES):
    return kernel_check.checked(sh.bert_config_for(config, mesh), mesh, shapes)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """What a new process starts with: no check run yet; counts the checks run."""
    monkeypatch.setattr(kernel_check, "_outcomes", {})
    monkeypatch.setattr(kernel_check, "_decisions", {})
    calls = []
    compare = self_check.compare

    def counted(*args, **kwargs):
        calls.append((args, kwargs))
        return compare(*args, **kwargs)

    monkeypatch.setattr(self_check, "compare", counted)
    return calls


def _wrong_kernel(monkeypatch):
    flash_attention = tpu.flash_attention
    monkeypatch.setattr(
        tpu, "flash_attention", lambda *args, **kwargs: flash_attention(*args, **kwargs) * 1.02
    )


def test_a_correct_kernel_is_kept_once_checked(fresh_process, capsys):
    mesh = sh.create_mesh((2, 2, 2))
    assert _checked(CONFIG, mesh).attention_impl == "tpu_interpret"
    assert _checked(CONFIG, mesh).attention_impl == "tpu_interpret"  # the eval step's
    assert len(fresh_process) == 1  # once per process
    (args, kwargs), = fresh_process  # fmt: skip
    assert args == ("tpu_interpret",) and kwargs["device"] == mesh.devices.flat[0]
    assert (kwargs["head_dim"], kwargs["dtype"], kwargs["dropout_rate"]) == (32, "float32", 0.1)
    assert kwargs["shapes"] == SHAPES
    record = kernel_check.record_for(CONFIG)
    assert record["passed"] and record["runs"] == "tpu_interpret"
    assert "WARNING" not in capsys.readouterr().out


def test_a_wrong_kernel_falls_back_to_xla_with_one_line(monkeypatch, capsys):
    _wrong_kernel(monkeypatch)
    causal = CONFIG.replace(attention="causal", dtype="bfloat16")
    fitted = _checked(causal, sh.create_mesh((1, 1, 1), jax.devices()[:1]))
    assert fitted.attention_impl == "xla" and fitted.cpu_forms
    out = capsys.readouterr().out
    assert len(WARNING.findall(out)) == 1 and len(out.splitlines()) == 1, out
    assert "'tpu_interpret' kernel's" in out and "differs from the float32 truth by" in out
    assert "attention_impl='xla'" in out
    record = kernel_check.record_for(causal)
    assert record == kernel_check.record_for(fitted)  # the record of the run as it runs
    assert not record["passed"] and record["runs"] == "xla" and record["causal"]
    assert record["kernel_error"] > record["allowed"] and record["dtype"] == "bfloat16"


def test_a_kernel_that_raises_falls_back_to_xla_with_one_line(monkeypatch, capsys):
    """On a device the kernel may not even compile (a Mosaic or Triton lowering error)."""

    def broken(*args, **kwargs):
        raise RuntimeError("Mosaic failed to compile TPU kernel: unsupported shape\nmore detail")

    monkeypatch.setattr(tpu, "flash_attention", broken)
    fitted = _checked(CONFIG, sh.create_mesh((1, 1, 1), jax.devices()[:1]))
    assert fitted.attention_impl == "xla"
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    expected = (
        "the 'tpu_interpret' kernel raised RuntimeError: Mosaic failed to compile TPU kernel: "
        "unsupported shape on cpu; this run uses attention_impl='xla'"
    )
    assert expected in out, out
    record = kernel_check.record_for(CONFIG)
    assert not record["passed"] and record["runs"] == "xla"
    assert record["error"].endswith("unsupported shape")


@pytest.mark.parametrize(
    "config",
    [CONFIG.replace(attention_check=False), CONFIG.replace(attention_impl="xla"),
     CONFIG.replace(attention_impl="auto")],  # XLA on CPU
)  # fmt: skip
def test_nothing_is_checked_without_a_fused_kernel_or_with_the_check_off(
    monkeypatch, fresh_process, config
):
    _wrong_kernel(monkeypatch)  # would fail, were it checked
    fitted = _checked(config, sh.create_mesh((1, 1, 1), jax.devices()[:1]))
    assert fitted.attention_impl == ("tpu_interpret" if config.attention_impl == "fused" else "xla")
    assert not fresh_process and kernel_check.record_for(config) is None


@pytest.mark.xdist_group("compile_test")  # one libtpu client per worker
def test_a_mesh_of_devices_this_process_cannot_run_is_not_checked(fresh_process, monkeypatch):
    """``python -m bertjax.compile``'s mesh of a TPU topology's devices."""
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")  # as bertjax.compile sets them
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topologies = pytest.importorskip("jax.experimental.topologies")
    try:
        devices = topologies.get_topology_desc("v5e:2x2", "tpu").devices
    except Exception as e:  # noqa: BLE001 - no libtpu here
        pytest.skip(f"no TPU topology: {e}")
    fitted = _checked(CONFIG, sh.create_mesh((4, 1, 1), devices))
    assert fitted.attention_impl == "tpu" and not fresh_process


def test_a_kernel_failing_on_another_process_makes_every_process_use_xla(monkeypatch, capsys):
    """All processes must compile the same step: one failure anywhere means 'xla' everywhere."""
    gathered = []

    def allgather(passed):
        gathered.append(int(passed))
        return [int(passed), 0]  # process 1's check failed

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(kernel_check.multihost_utils, "process_allgather", allgather)
    fitted = _checked(CONFIG, sh.create_mesh((1, 1, 1), jax.devices()[:1]))
    assert gathered == [1] and fitted.attention_impl == "xla"
    (line,) = capsys.readouterr().out.splitlines()
    assert WARNING.match(line) and "on processes [1]" in line, line
    assert kernel_check.record_for(CONFIG)["failed_processes"] == [1]


def test_building_a_step_checks_nothing(monkeypatch, fresh_process):
    """``sharding.bert_config_for`` (every step builder; compile's too) is pure: no device work."""
    _wrong_kernel(monkeypatch)
    fitted = sh.bert_config_for(CONFIG, sh.create_mesh((1, 1, 1), jax.devices()[:1]))
    assert fitted.attention_impl == "tpu_interpret" and not fresh_process
    assert kernel_check.record_for(CONFIG) is None


def test_the_loops_check_at_the_shapes_their_steps_run():
    """Pretraining: L, the gathered last layer's K + P queries, packed K; fine-tuning: a packed
    sentence head gathers its K [CLS] positions, a tagger none."""
    from bertjax.finetune import objective as finetune_objective
    from bertjax.pretrain import objective as pretrain_objective
    from tests.pretrain.step_test import tiny_config

    config = tiny_config().unlock()
    config.data.update(max_seq_length=48, max_predictions_per_seq=7, pack_sequences=True,
                       max_sequences_per_pack=3)  # fmt: skip
    bert_config = pretrain_objective.bert_config_from(config)
    assert bert_config.computes_only_output_positions
    shapes = pretrain_objective.attention_shapes(config, bert_config)
    assert shapes == self_check.Shapes(length=48, queries=3 + 7, packed=3)
    config.data.pack_sequences = False
    assert pretrain_objective.attention_shapes(config, bert_config) == self_check.Shapes(48, 8, 0)
    scanned = bert_config.replace(scan_layers=True)  # the scanned stack computes every position
    assert pretrain_objective.attention_shapes(config, scanned).queries == 0

    class Task:
        head = "classification"

    example = {"input_ids": np.zeros((4, 32), np.int32)}
    shapes = finetune_objective.attention_shapes(Task, example, 8, bert_config)
    assert shapes == self_check.Shapes(length=32, queries=8, packed=8)
    Task.head = "tagging"
    assert finetune_objective.attention_shapes(Task, example, 8, bert_config).queries == 0
    assert finetune_objective.attention_shapes(Task, example, 0, bert_config).packed == 0


def test_a_kernel_wrong_only_at_the_gathered_queries_is_caught_at_the_runs_shapes(monkeypatch):
    """A lowering bug of the gathered last layer (queries fewer than keys) that the full-length
    call never shows: the check at the run's shapes falls back to 'xla', one at L alone would
    not."""
    flash_attention = tpu.flash_attention

    def wrong_when_gathered(query, key, *args, **kwargs):
        out = flash_attention(query, key, *args, **kwargs)
        return out * 1.02 if query.shape[1] != key.shape[1] else out

    monkeypatch.setattr(tpu, "flash_attention", wrong_when_gathered)
    mesh = sh.create_mesh((1, 1, 1), jax.devices()[:1])
    assert _checked(CONFIG, mesh, self_check.Shapes(64, queries=0, packed=0)).attention_impl == (
        "tpu_interpret"
    )
    gathered = self_check.Shapes(64, queries=9, packed=0)
    assert _checked(CONFIG, mesh, gathered).attention_impl == "xla"
    assert kernel_check.record_for(CONFIG)["worst_queries"] == 9
