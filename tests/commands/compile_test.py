"""``python -m bertjax.compile`` against the real TPU compiler (libtpu, from the test extra):
the tiny config on a small v5e slice for an fsdp mesh in bf16 with remat (through the command
itself, its ``--json`` report holding the documented keys) and a data x tensor mesh, the Pallas
flash kernel present in the TPU program (and absent with attention_impl='xla'), and one-line
errors for a config that cannot fit (a fresh ``python -m`` process: nothing else on its stderr,
libtpu's start-up lines included), an unknown topology and an indivisible parameter.

The command runs in this process where it can (:func:`_command`, ``tests.commands.in_process``):
libtpu is loaded here already, and each process start cost a start-up and a compile of its own."""

import functools
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax.pretrain import compile_for_slice
from bertjax.training import batch_schedule, compile_report
from tests.commands import in_process

REPO = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(REPO / "configs"))
import tiny  # noqa: E402

pytestmark = [
    pytest.mark.xdist_group("compile_test"),  # one libtpu client per worker
    pytest.mark.usefixtures("tracebacks_in_locations"),  # what users compile with
]


def _config(**model):
    config = tiny.get_config().unlock()
    config.model.update(model)
    return config.lock()


def _command(*args) -> tuple[int, str, str]:
    """``python -m bertjax.compile --config=configs/tiny.py ARGS`` in this process -> (exit
    status, stdout, stderr) (``tests.commands.in_process``: stdout and stderr captured at the file
    descriptors, so libtpu's own lines would show)."""
    done = in_process.run_module("bertjax.compile", f"--config={REPO}/configs/tiny.py", *args)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    "mesh_shape,model",
    [
        # FSDP in bf16 with remat, through the command with --json (its flags set the model)
        ((1, 4, 1), {"dtype": "bfloat16", "remat_policy": "dots"}),
        # vocab split over tensor; 2 micro-batches (a lax.scan: XLA counts its body once)
        ((2, 1, 2), {"vocab_size": 7680, "attention_impl": "xla"}),
    ],
)
def test_tiny_config_compiles_for_a_v5e_slice(mesh_shape, model):
    if "remat_policy" in model:  # the command's --json: the documented keys, as compile_for's
        shape = ",".join(map(str, mesh_shape))
        flags = [f"--config.mesh.shape={shape}"]
        flags += [f"--config.model.{name}={value}" for name, value in model.items()]
        code, out, err = _command("--topology=v5e:2x2", "--json", *flags)
        assert code == 0, err[-2000:]
        (line,) = out.splitlines()
        report = json.loads(line)
        assert set(compile_report.JSON_KEYS) <= set(report)
        assert report["topology"] == "v5litepod-4" and report["fits"] is True
    else:
        config = _config(**model).unlock()
        config.mesh.shape = mesh_shape
        config.train.grad_accum_steps = 2
        report = compile_for_slice.compile_for(config.lock(), "v5litepod-4")
    assert report["fits"] and report["chips"] == 4 and report["chip"] == "v5e"
    assert tuple(report["mesh"].values()) == mesh_shape
    assert 0 < report["needed_bytes"] < report["hbm_bytes_per_chip"]
    # The model's FLOPs are matmuls only; the compiler also counts softmax, LayerNorm, Adam...
    per_chip = report["model_flops_per_step"] / 4
    assert per_chip < report["step_flops_per_chip"] < 2 * per_chip
    micro = report["micro_batches"]
    assert micro == (2 if mesh_shape == (2, 1, 2) else 1)
    assert report["step_flops_per_chip"] == micro * report["compiler_flops_per_chip"]
    # (With 2 micro-batches, a compiler count of the whole step would make that > 2 x per_chip.)
    # Per real token: the step's rows x L slots at the bundled corpus's fill of unpacked rows.
    assert report["rows_per_step"] * report["max_seq_length"] == 64 * 64
    assert 0.5 < report["fill"] < 1 and report["real_tokens_per_step"] == pytest.approx(
        64 * 64 * report["fill"]
    )
    assert report["bound_seconds_per_real_token"] == pytest.approx(
        report["roofline_seconds"] / report["real_tokens_per_step"]
    )
    collectives = report["collectives"]
    assert collectives["all-reduce"] + collectives["reduce-scatter"] > 0  # gradients are summed
    if mesh_shape == (1, 4, 1):
        assert collectives["all-gather"] > 0  # FSDP gathers the weights it split
    assert report["params_bytes"] < 2 * report["optimizer_state_bytes"]  # Adam: two moments


def test_tpu_program_runs_the_pallas_flash_kernel_unless_xla_is_asked():
    """attention_impl='auto' traces the Mosaic kernel for a TPU mesh even on this CPU host, and
    the model gets no XLA:CPU forms there (build_steps fits the config to the mesh)."""
    from jax.experimental import topologies

    from bertjax.pretrain import objective as objective_lib
    from bertjax.training import sharding as sh

    devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
    for impl, expected in (("auto", True), ("xla", False)):
        config = _config(attention_impl=impl)
        steps = objective_lib.build_steps(config, sh.create_mesh(config.mesh.shape, devices))
        model_config = steps.trainer.objective.model.config
        assert model_config.attention_impl == ("tpu" if expected else "xla")
        assert not model_config.cpu_forms
        args, _ = compile_report.abstract_args(steps.trainer, steps.eval_batch)
        hlo = steps.trainer.train_step.lower(*args).as_text()
        assert ("tpu_custom_call" in hlo) is expected, impl


class _Built(Exception):
    """Stops ``bertjax.main``'s run once its steps are built (nothing is written)."""


def test_a_packed_config_compiles_the_shapes_main_runs(tmp_path, monkeypatch):
    """A packed config's batch counts instances (64); ``bertjax.main`` runs the rows that hold
    that many at the data's instances per row, and ``bertjax.compile`` lowers exactly those:
    the train and eval batches main builds its steps for (its real run, stopped before its
    workdir is taken) and the first batch its data gives have the shapes compile's steps take,
    on 8 data shards each (the 8 CPU devices; v5litepod-8)."""
    from bertjax.data import bundled
    from bertjax.pretrain import loop
    from bertjax.pretrain import start as start_lib

    config = _config().unlock()
    eval_corpus = bundled.bundled_paths().eval  # small: the instance table builds in a second
    # At L = 128 half the documents get a short target: 1.19 instances per row (at 64 KJV's
    # verses fill the rows alone).
    config.data.update(input_files=[eval_corpus], max_seq_length=128, max_predictions_per_seq=20,
                       short_seq_prob=0.5, pack_sequences=True, max_sequences_per_pack=4,
                       cache_dir=str(tmp_path / "cache"))  # fmt: skip
    config.train.update(global_batch_size=64, eval_batch_size=64)
    config.lock()

    built = {}

    def plan(resolved, steps, continued):
        built.update(config=resolved, steps=steps)
        raise _Built

    monkeypatch.setattr(start_lib, "plan", plan)
    with pytest.raises(_Built):
        loop.train_and_evaluate(config, str(tmp_path / "workdir"))
    main_args = compile_report.abstract_args(built["steps"].trainer, built["steps"].eval_batch)
    bert_config = built["steps"].bert_config
    schedule = batch_schedule.BatchSchedule(int(built["config"].train.global_batch_size))
    first = next(loop._train_batches(built["config"], bert_config, schedule, 0, 0))
    # compile counts the data's rows once (compile_for_slice.data_figures) and passes them on.
    figures = compile_for_slice.data_figures(config)
    from bertjax.data import pipeline

    monkeypatch.setattr(pipeline, "row_figures", lambda *_: pytest.fail("packed a second time"))
    monkeypatch.setattr(pipeline, "instances_per_row", lambda *_: pytest.fail("packed again"))
    _, _, *compile_args = compile_for_slice.steps_for_slice(config, "v5litepod-8", figures)
    assert figures["instances_per_row"] > 1 and 0.5 < figures["fill"] <= 1

    def shapes(batch):
        return {name: tuple(value.shape) for name, value in batch.items()}

    (_, train_batch, _), (_, eval_batch) = main_args
    assert shapes(compile_args[0][1]) == shapes(train_batch)
    assert shapes(compile_args[1][1]) == shapes(eval_batch)
    data = {name: np.shape(value) for name, value in first.items() if name in train_batch}
    assert data == shapes(train_batch)
    rows = train_batch["input_ids"].shape[0]
    assert rows < 64 and rows % 8 == 0 and train_batch["cls_positions"].shape == (rows, 4)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "bertjax.compile", f"--config={REPO}/configs/tiny.py", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )


def test_config_that_cannot_fit_is_one_line_with_advice():
    result = _cli("--topology=v5litepod-4", "--config.model.vocab_size=40000000")
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    line = result.stderr.strip()
    assert line.startswith("compile: error: the train step does not fit v5litepod-4: it needs ")
    assert "a v5e chip has 15.75 GiB" in line and "--config.mesh.shape=1,4,1 (FSDP" in line


def test_unknown_topology_and_indivisible_vocab_are_one_line_errors():
    code, out, err = _command("--topology=v5litepod-6")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "unknown TPU topology 'v5litepod-6'; known: v4-8," in err
    # vocab 7633 over tensor=2
    code, out, err = _command("--topology=v5e:2x2", "--config.mesh.shape=2,1,2")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith("compile: error: ")
    assert "not divisible by the 2 shards of mesh axes ('tensor',)" in err


def test_oom_messages_give_the_needed_bytes():
    first = "the total memory required for HLO temporaries (35.22G) exceeds available HBM (15.75G)"
    assert compile_report.oom_needed_bytes(first) == int(35.22 * (1 << 30))
    second = "Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 3.0K."
    assert compile_report.oom_needed_bytes(second) == int(15.75 * (1 << 30)) + 3 * 1024


@functools.cache
def _hlo_bytes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hlo_bytes", REPO / "bench" / "hlo_bytes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hlo_bytes_counts_moves_and_memory_spaces():
    """bench/hlo_bytes.py's rules on a hand-written entry computation: an async slice counts its
    whole operand (as the compiler does) but reads only the slice from HBM; arrays in memory
    space S(1) are not HBM traffic; a ConcatBitcast moves nothing."""
    hlo = """ENTRY %main (p: f32[1024,1024]) -> bf16[8,1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  %s = ((f32[1024,1024]{1,0}), f32[256,1024]{1,0:S(1)}, s32[]{:S(2)}) slice-start(%p), slice={[0:256], [0:1024]}
  %d = f32[256,1024]{1,0:S(1)} slice-done(%s)
  %c = f32[1024,1024]{1,0:S(1)} custom-call(%d), custom_call_target="ConcatBitcast"
  %f = bf16[8,1024]{1,0} fusion(%c), kind=kOutput, calls=%x, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/encoder/layers/layer_0/intermediate/dot_general"}
}"""  # noqa: E501
    module = _hlo_bytes()
    counted, hbm = module.breakdown(hlo)
    mib = 1 << 20
    prefetch = "async moves between HBM and on-chip memory"
    assert counted[prefetch] == 4 * mib + (mib + 4 * mib)  # slice: its operand; concat: in + out
    assert hbm[prefetch] == mib  # the 256 rows it reads from HBM
    ffn = "layers forward: feed-forward"
    assert counted[ffn] == 4 * mib + 8 * 1024 * 2 and hbm[ffn] == 8 * 1024 * 2


def test_fused_attention_needs_no_layout_copies_and_one_backward_kernel():
    """The kernels take q, k, v as [B, N*D, L], the layout the TPU compiler itself gives the
    [B, L, N, D] projections for D = 64, so it copies none of them, nor the context or the
    gradients, around the kernels (what it still copies is the position and mask rows, and the
    last layer's gathered MLM queries before their padding); with one key block dq, dk and dv
    come from a single backward kernel. Grouped as bench/hlo_bytes.py groups the HLO."""
    config = _config(dtype="bfloat16").unlock()
    config.mesh.shape = (4, 1, 1)
    config.data.max_seq_length = 128  # no padding: the kernels see the projections' arrays
    module = _hlo_bytes()
    compiled, _ = module.compile_train_step(config.lock(), "v5litepod-4")
    parts = [
        (module.part_of(opcode, op_name, line), size)
        for opcode, size, _, op_name, line in module.entry_instructions(compiled.as_text())
    ]
    per_chip = config.train.global_batch_size // 4
    activation = per_chip * 128 * config.model.hidden_size * 2  # one bf16 [B, L, N*D] array
    copies = [size for part, size in parts if part.endswith("attention layout copies")]
    assert max(copies, default=0) < activation / 4, copies
    layers = config.model.num_layers
    assert [p for p, _ in parts].count("layers forward: attention kernel") == layers
    assert [p for p, _ in parts].count("layers backward: attention kernel") == layers
