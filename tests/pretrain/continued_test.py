"""Continued pretraining from HF and TF1 checkpoints through ``python -m bertjax.main``.

Three small random checkpoints continue pretraining for a few steps through the real command
(``bertjax.main`` run as ``__main__`` in the test's process, its flags parsed by absl, as
``python -m`` runs it: ``tests.commands.in_process``) with ``configs/tiny.py`` and
no model or vocab flag (the architecture, vocab and casing come from the
checkpoint): a HF ``BertForPreTraining`` directory, a HF ``BertModel`` directory (fresh MLM and
NSP heads) and Google's TF1 layout of the same ``BertForPreTraining``. References: HF PyTorch's
``BertForPreTraining`` loss on the run's first batch (MLM mean over the masked positions + NSP
mean) equals the run's step-1 loss for the checkpoints with heads; the workdirs export back to HF
with ``convert`` and load in transformers with no missing keys; the encoder exported from the
``BertModel`` run is the one it started from (three warmup steps move no weight by 1e-4) and
its new heads are distributed as the original initialises them.
"""

import json
import math
import pathlib
import re
import shutil
import sys

import numpy as np
import pytest
import torch
import transformers

from bertjax.data import bundled
from bertjax.interop import formats
from bertjax.pretrain import continued, inputs
from bertjax.pretrain import objective as objective_lib
from bertjax.training import init_record
from bertjax.training import workdir as workdir_lib
from tests.commands import in_process, tiny_run
from tests.finetune.inputs_test import _sigterm_at_step
from tests.interop import references
from tests.interop.tf1_test import write_tf1_checkpoint

REPO = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(REPO / "configs"))
import tiny  # noqa: E402

pytestmark = pytest.mark.xdist_group("continued_test")  # the module's runs, built once
BATCH, STEPS = 8, 3
# Training-only flags: small and deterministic (no dropout, so the step-1 loss is HF's eval loss).
TRAIN_FLAGS = {
    "train.num_steps": STEPS,
    "train.global_batch_size": BATCH,
    "train.log_every": 1,
    "train.eval_every": 0,
    "checkpoint.every_steps": STEPS,
    "model.hidden_dropout_rate": 0.0,
    "model.attention_dropout_rate": 0.0,
}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> pathlib.Path:
    """A directory with a 40-chapter slice of the bundled corpus and a config file (tiny.py
    reading it, its data cache beside it)."""
    root = tmp_path_factory.mktemp("continued")
    tiny_run.write_env(root, cache_dir=root / "cache")
    return root


def _main(env, checkpoint, workdir, *extra, config=None, steps=STEPS):
    """``python -m bertjax.main`` on ``checkpoint`` with tiny.py's config (reading the corpus
    slice) or ``config``, for ``steps`` steps (one save, at the end), run in this process
    (``in_process.run_module``: the module as ``__main__``, a start-up of imports saved): a
    CompletedProcess."""
    values = {**TRAIN_FLAGS, "train.num_steps": steps, "checkpoint.every_steps": steps}
    flags = [f"--config.{k}={v}" for k, v in values.items()]
    config = config or env / "test_config.py"
    return in_process.run_module("bertjax.main", f"--config={config}",
                        f"--config.init_checkpoint={checkpoint}", f"--workdir={workdir}",
                        *flags, *extra)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(HF BertForPreTraining, its directory, its TF1 directory, HF BertModel, its directory)."""
    root = tmp_path_factory.mktemp("checkpoints")
    pretraining = references.random_pretraining(3, **references.SMALL)
    with torch.no_grad():  # HF's init leaves LayerNorms at 1 and 0 and the MLM bias at 0
        for parameter in pretraining.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    hf_dir = references.hf_dir(pretraining, root / "hf_pretraining")
    tf1_dir = root / "tf1"
    tf1_dir.mkdir()
    write_tf1_checkpoint(pretraining, tf1_dir)  # records no casing: the vocab implies it
    torch.manual_seed(4)
    encoder = transformers.BertModel(pretraining.config).eval()
    model_dir = references.hf_dir(encoder, root / "hf_model")
    return pretraining, hf_dir, tf1_dir, encoder, model_dir


@pytest.fixture(scope="module")
def runs(env, checkpoints):
    """The runs, side by side: {name: (workdir, returncode, stdout, stderr)}. 'hf', 'tf1' and
    'model' continue their checkpoint; 'tf1' also sets a model field on the command line that
    agrees with the checkpoint, 'refused' (on configs/continue.py) one that does not."""
    _, hf_dir, tf1_dir, _, model_dir = checkpoints
    out = {}
    for name, checkpoint, extra, config in (
        ("hf", hf_dir, (), None),
        ("tf1", tf1_dir, ("--config.model.hidden_size=32",), None),
        ("model", model_dir, (), None),
        ("refused", hf_dir, ("--config.model.num_layers=3",), REPO / "configs" / "continue.py"),
    ):
        workdir = env / f"run_{name}"
        out[name] = workdir, *_returned(_main(env, checkpoint, workdir, *extra, config=config))
    return out


def _returned(done) -> tuple[int, str, str]:
    return done.returncode, done.stdout, done.stderr


def _succeeded(run) -> tuple[pathlib.Path, str]:
    workdir, returncode, stdout, stderr = run
    assert returncode == 0, stderr[-3000:]
    return workdir, stdout


def _train_scalars(workdir: pathlib.Path, step: int) -> dict:
    """The ``train/*`` scalars the run wrote to TensorBoard at ``step`` (float32 precision)."""
    import tensorflow as tf

    values = {}
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value if event.step == step else ():
                values[value.tag] = float(tf.make_ndarray(value.tensor))
    return values


def _first_batch(env, checkpoint) -> dict:
    """The run's first train batch, rebuilt in this process from the same config."""
    config = tiny.get_config()
    config.data.input_files = config.data.eval_input_files = [str(env / "corpus.txt")]
    config.data.cache_dir = str(env / "cache")
    config.init_checkpoint = str(checkpoint)
    for key, value in TRAIN_FLAGS.items():
        section, field = key.split(".")
        config[section][field] = value
    run, _ = continued.resolve(config, {})
    bert_config = objective_lib.bert_config_from(run)
    return next(inputs.host_batches(run, bert_config, split="train", batch_size=BATCH))


def _hf_losses(model, batch) -> tuple[float, float, float]:
    """HF PyTorch's (total, MLM, NSP) pretraining loss on a bertjax batch: labels at the masked
    positions (weight 1), -100 elsewhere, so HF's loss is the MLM mean + the NSP mean."""
    labels = np.full(batch["input_ids"].shape, -100)
    for row, (positions, ids, weights) in enumerate(
        zip(
            batch["masked_lm_positions"],
            batch["masked_lm_ids"],
            batch["masked_lm_weights"],
            strict=True,
        )  # fmt: skip
    ):
        for position, token, weight in zip(positions, ids, weights, strict=True):
            if weight > 0:
                labels[row, position] = token
    tensors = references.torch_inputs(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    nsp_labels = torch.tensor(batch["next_sentence_labels"], dtype=torch.long)
    with torch.no_grad():
        out = model(**tensors, labels=torch.tensor(labels), next_sentence_label=nsp_labels)
    vocab = out.prediction_logits.shape[-1]
    mlm = torch.nn.functional.cross_entropy(out.prediction_logits.reshape(-1, vocab),
                                            torch.tensor(labels).reshape(-1))  # fmt: skip
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp_labels)
    return float(out.loss), float(mlm), float(nsp)


def _exported(workdir, tmp_path) -> transformers.BertForPreTraining:
    """The workdir's newest step converted to HF (what ``python -m bertjax.convert --src=WORKDIR
    --to=hf`` runs), loaded by transformers with no missing or unexpected keys."""
    dst = tmp_path / f"{workdir.name}_hf"
    formats.convert(str(workdir), str(dst), "hf")
    return references.loaded_cleanly(transformers.BertForPreTraining, dst)


def _max_diff(a: torch.nn.Module, b: torch.nn.Module, prefix_a="", prefix_b="") -> float:
    sa, sb = a.state_dict(), b.state_dict()
    names = [n for n in sb if n.startswith(prefix_b) and not n.endswith("position_ids")]
    assert names
    return max(float((sa[prefix_a + n[len(prefix_b) :]] - sb[n]).abs().max()) for n in names)


@pytest.mark.parametrize("name", ["hf", "tf1"])
def test_step_1_loss_equals_hf_and_the_run_exports_to_hf(name, env, checkpoints, runs, tmp_path):
    pretraining, hf_dir, tf1_dir, _, _ = checkpoints
    workdir, stdout = _succeeded(runs[name])
    source = hf_dir if name == "hf" else tf1_dir
    assert f"init_checkpoint {source} ({name}): loaded encoder, pooler, mlm, nsp; " \
        "initialised none\n" in stdout  # fmt: skip
    assert "optimizer: a fresh bert_adamw state with its own warmup (100 steps to 0.0005)" \
        in stdout  # fmt: skip
    assert "(vocab_size 7633 -> 30522, " in stdout and ", num_heads 2 -> 4, " in stdout
    got = _train_scalars(workdir, 1)
    total, mlm, nsp = _hf_losses(pretraining, _first_batch(env, source))
    print(f"\n{name}: step-1 loss {got['train/loss']:.7f}, HF PyTorch {total:.7f}")
    assert got["train/loss"] == pytest.approx(total, abs=references.TOL)
    assert got["train/mlm_loss"] == pytest.approx(mlm, abs=references.TOL)
    assert got["train/nsp_loss"] == pytest.approx(nsp, abs=references.TOL)
    exported = _exported(workdir, tmp_path)
    assert exported.config.num_hidden_layers == 2 and exported.config.hidden_size == 32
    moved = _max_diff(exported, pretraining)  # three warmup steps: trained, but only a little
    assert 0 < moved < 1e-4, moved


def test_bert_model_gets_fresh_heads_initialised_as_the_original(checkpoints, runs, tmp_path):
    _, _, _, encoder, model_dir = checkpoints
    workdir, stdout = _succeeded(runs["model"])
    assert f"init_checkpoint {model_dir} (hf): loaded encoder, pooler; initialised mlm, nsp as " \
        "the original does (truncated normal(0, 0.02) kernels" in stdout  # fmt: skip
    # Fresh heads on a small-embedding encoder predict near-uniformly: ln V and ln 2.
    got = _train_scalars(workdir, 1)
    assert got["train/mlm_loss"] == pytest.approx(math.log(30522), abs=0.05)
    assert got["train/nsp_loss"] == pytest.approx(math.log(2), abs=0.02)
    exported = _exported(workdir, tmp_path)
    assert _max_diff(exported, encoder, prefix_a="bert.") < 1e-4  # the checkpoint's encoder
    heads = {n: p.detach().numpy() for n, p in exported.cls.named_parameters()}
    # run_pretraining.py: truncated_normal_initializer(0.02) kernels (|x| < 2 stddev, standard
    # deviation 0.88 x 0.02 after truncation), zero biases, LayerNorm gamma 1 and beta 0.
    for kernel in ("predictions.transform.dense.weight", "seq_relationship.weight"):
        values = heads[kernel]
        assert np.abs(values).max() < 0.04 + 1e-4, kernel
        if values.size > 1000:
            assert np.std(values) == pytest.approx(0.88 * 0.02, rel=0.1), kernel
    for bias in ("predictions.bias", "predictions.transform.dense.bias", "seq_relationship.bias",
                 "predictions.transform.LayerNorm.bias"):  # fmt: skip
        assert np.abs(heads[bias]).max() < 1e-4, bias
    assert np.abs(heads["predictions.transform.LayerNorm.weight"] - 1).max() < 1e-4


def test_command_line_field_that_disagrees_is_one_line_and_writes_nothing(checkpoints, runs):
    _, hf_dir, *_ = checkpoints
    workdir, returncode, _, stderr = runs["refused"]
    assert returncode == 1
    assert stderr.strip().splitlines() == [
        f"main: error: --config.model.num_layers=3 disagrees with config.init_checkpoint="
        f"{hf_dir}, whose num_layers is 2 (the architecture comes from the checkpoint; drop "
        "the flag)"
    ]
    assert not workdir.exists()


def _resolve(checkpoint, **command_line):
    config = tiny.get_config()
    config.init_checkpoint = str(checkpoint)
    for key, value in command_line.items():
        section, field = key.split("__")
        config[section][field] = value
    return continued.resolve(config, {k.replace("__", "."): v for k, v in command_line.items()})


def test_vocab_casing_and_length_against_the_checkpoint(checkpoints, tmp_path):
    _, hf_dir, tf1_dir, _, _ = checkpoints
    with pytest.raises(ValueError) as error:
        _resolve(hf_dir, data__max_seq_length=128)
    assert str(error.value) == (
        f"config.data.max_seq_length=128 exceeds the max_position_embeddings=64 of {hf_dir}"
    )
    # data.vocab_file on the command line must be the checkpoint's vocab (by fingerprint).
    with pytest.raises(ValueError, match=f"vocab_file={bundled.VOCAB} has 7633 entries but "
                       f"{hf_dir}/vocab.txt, .* has 30522: sizes differ"):  # fmt: skip
        _resolve(hf_dir, data__vocab_file=bundled.VOCAB)
    copy = tmp_path / "vocab.txt"
    copy.write_bytes((hf_dir / "vocab.txt").read_bytes())
    run, _ = _resolve(hf_dir, data__vocab_file=str(copy))
    assert run.data.vocab_file == str(copy)
    # Casing: a recorded one wins over the config file, and the command line must agree with it.
    run, _ = _resolve(hf_dir)
    assert run.data.vocab_file == str(hf_dir / "vocab.txt") and run.data.do_lower_case
    with pytest.raises(ValueError, match="do_lower_case=False disagrees with .* lower-cased"):
        _resolve(hf_dir, data__do_lower_case=False)
    # TF1 records none: the command line's, else the vocab's (Google's cased vocabs hold 'The').
    assert not _resolve(tf1_dir, data__do_lower_case=False)[0].data.do_lower_case
    cased = tmp_path / "cased"
    cased.mkdir()
    for path in tf1_dir.iterdir():
        (cased / path.name).write_bytes(path.read_bytes())
    lines = (tf1_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lines[lines.index("the")] = "The"
    (cased / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert not _resolve(cased)[0].data.do_lower_case
    assert _resolve(tf1_dir)[0].data.do_lower_case


RESUMED_STEPS = 6  # steps enough after the first for a SIGTERM to land mid-run


def _flat(workdir) -> dict:
    params, *_ = workdir_lib.latest_params(workdir, log=lambda _: None)
    return dict(_leaves(params))


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield prefix + key, np.asarray(value)


def _without_a_verified_step(workdir, copy) -> pathlib.Path:
    """A copy of ``workdir`` as if killed before its first save was sealed: no manifests."""
    shutil.copytree(workdir, copy)
    for manifest in copy.glob("checkpoints/*/bertjax_manifest.json"):
        manifest.unlink()
    return copy


def test_a_resume_never_reads_the_init_checkpoint(env, checkpoints, tmp_path, monkeypatch):
    """A run from a copy of the HF checkpoint, stopped by SIGTERM after its first step (it saves
    and exits 0), then the copy deleted: the rerun of the same command restores the saved step
    without reading it (one line says so) and ends with the same params, bit for bit, as an
    uninterrupted run, and tokenizes nothing again. That run is the same workdir without a
    verified step, started with --config.init_checkpoint naming the original directory: a notice
    (the record wins), the checkpoint read because no step restores and checked against the
    recorded fingerprint (into the scanned layout too), the whole run from step 0. The same
    workdir with the copy gone is one line naming it."""
    _, hf_dir, *_ = checkpoints
    taken = formats.load(str(hf_dir)).params
    movable = tmp_path / "hf_copy"
    shutil.copytree(hf_dir, movable)
    workdir = tmp_path / "run"
    _sigterm_at_step(monkeypatch, 2)  # as it takes step 2's batch, after step 1's line
    first = _main(env, movable, workdir, steps=RESUMED_STEPS)
    monkeypatch.undo()
    out = first.stdout
    assert first.returncode == 0, first.stderr[-3000:]
    saved = int(re.search(r"^SIGTERM: saving step (\d+)$", out, re.M).group(1))
    assert 1 <= saved < RESUMED_STEPS, out[-2000:]
    record = json.loads((workdir / workdir_lib.META_FILE).read_text())
    assert record["format_version"] == 3 and record["init"] == {
        "source": str(movable), "format": "hf", "subtrees": ["encoder", "mlm", "nsp", "pooler"],
        "params_sha256": init_record.params_fingerprint(taken), "fresh": [],
    }  # fmt: skip
    shutil.rmtree(movable)
    moved = _without_a_verified_step(workdir, tmp_path / "moved")
    tables = sorted((env / "cache").iterdir())  # the corpus' instance tables, tokenized
    resumed = _succeeded((workdir, *_returned(_main(env, movable, workdir, steps=RESUMED_STEPS))))[
        1
    ]
    restarted = _succeeded((moved, *_returned(_main(env, hf_dir, moved, steps=RESUMED_STEPS))))[1]
    # With the copy gone and no verified step, the run's initial params (what
    # bertjax.training.start asks for when no step restores) are one line.
    missing = _without_a_verified_step(workdir, tmp_path / "missing")
    config = tiny.get_config()
    config.init_checkpoint = str(movable)
    run, resumed_from = continued.resolve(config, {}, str(missing))
    assert run.data.vocab_file == f"{missing}/vocab.txt" and run.model.vocab_size == 30522
    with pytest.raises(ValueError) as error:
        resumed_from.load()
    assert str(error.value) == (
        f"{movable}: no such checkpoint directory; {missing} holds no verified step, so its run "
        f"starts again from its init checkpoint (recorded: {movable}): put it back, or pass "
        "where it is now with --config.init_checkpoint"
    )
    config.init_checkpoint, config.model.scan_layers = str(hf_dir), True
    layers = continued.resolve(config, {}, str(missing))[1].load().params["encoder"]["layers"]
    for path, value in _leaves(taken["encoder"]["layers"]["layer_1"]):
        np.testing.assert_array_equal(dict(_leaves(layers["layer"]))[path][1], value)
    assert f"resuming {workdir}, continued from {movable} (hf): its record's architecture " \
        "replaces config.model's (vocab_size 7633 -> 30522, " in resumed  # fmt: skip
    assert f"restored step {saved} from " in resumed
    assert f"init_checkpoint {movable}: not read (step {saved} restored; {workdir}'s record " \
        "holds the architecture, vocab and casing)\n" in resumed  # fmt: skip
    assert "loaded encoder" not in resumed
    assert f"config.init_checkpoint={hf_dir}: {moved} records {movable} as its run's init " \
        "checkpoint, and the record wins" in restarted  # fmt: skip
    sha = record["init"]["params_sha256"][:16]
    assert f"init_checkpoint {hf_dir}: read, as {moved} holds no verified step; its params " \
        f"are the recorded ones (sha256 {sha}...)" in restarted  # fmt: skip
    assert f"init_checkpoint {hf_dir} (hf): loaded encoder, pooler, mlm, nsp; initialised " \
        "none" in restarted  # fmt: skip
    assert "restored step" not in restarted
    for run in (workdir, moved):
        assert (run / "checkpoints" / str(RESUMED_STEPS) / "bertjax_manifest.json").exists()
    # The workdir's copy of the vocab is the same vocab: nothing was tokenized again.
    assert sorted((env / "cache").iterdir()) == tables
    want, got = _flat(moved), _flat(workdir)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_the_data_stream_is_named_by_its_vocab_not_its_path(tmp_path):
    """A resumed continued run reads the workdir's copy of the vocab its first start read from
    the checkpoint: the same stream. A step saved when the path named the vocab still continues
    its stream on that path."""
    config, moved, changed = tiny.get_config(), tiny.get_config(), tiny.get_config()
    vocab = pathlib.Path(config.data.vocab_file).read_text(encoding="utf-8").splitlines()
    (tmp_path / "copy.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    moved.data.vocab_file = str(tmp_path / "copy.txt")
    vocab[100] = "zzzz"
    (tmp_path / "changed.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    changed.data.vocab_file = str(tmp_path / "changed.txt")
    signature = inputs.data_signature(config)
    assert inputs.data_signature(moved) == signature != inputs.data_signature(changed)
    # What data_signature wrote before (the reference: the code as it was).
    train = config.train
    before = {"data": config.data.to_dict(), "seed": config.seed,
              "synthetic": train.synthetic_data, "batch": train.global_batch_size}  # fmt: skip
    legacy = json.dumps(before, sort_keys=True, default=str)
    assert inputs.same_stream(legacy, signature, config)
    assert not inputs.same_stream(legacy, inputs.data_signature(moved), moved)
