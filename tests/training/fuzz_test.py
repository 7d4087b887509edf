"""Fuzz tests of the checkpoint metadata readers: ``bertjax_checkpoint.json`` and
``bert_config.json`` of a params-only checkpoint (``checkpoint.load_params``), a training
workdir's ``bertjax_workdir.json`` (``workdir.latest_params``), ``BertConfig.from_dict``, and a
HuggingFace ``config.json`` (``bertjax.interop.hf.read``). Each read gives data or a one-line
error naming the file (tests/fuzzing.py). The manifest reader has its own fuzz tests in
checkpoint_manifest_test.py.
"""

import json
import re
import shutil

import hypothesis.strategies as st
import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.interop import hf
from bertjax.interop.converted import ConvertError
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint, checkpoint_manifest, init_record
from bertjax.training import workdir as workdir_lib
from tests.fuzzing import JSON, check_one_line, file_contents, fuzz, json_mutated

TINY = BertConfig(
    vocab_size=7633,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)
META = {
    "format_version": 2,
    "do_lower_case": True,
    "heads": ["pooler"],
    "vocab": {"entries": 7633, "sha256": "0" * 64},
}
HF_CONFIG = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "vocab_size": 7633,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 16,
    "type_vocab_size": 2,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
    "is_decoder": False,
}


def json_files(document: dict):
    """Bytes of ``document`` with its JSON tree mutated, or its text mutated, or random JSON."""
    text = json.dumps(document, indent=2).encode()
    trees = json_mutated(document).map(lambda tree: json.dumps(tree).encode())
    return st.one_of(
        trees, trees, file_contents(text, b","), JSON.map(lambda v: json.dumps(v).encode())
    )


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A params-only checkpoint whose params are a stand-in tree (the readers under test only
    look at its layer names): building the real model would cost seconds of compiling."""
    layer = {"output": {"bias": np.zeros(2, np.float32)}}
    params = {"encoder": {"layers": {"layer_0": layer, "layer_1": layer}}, "pooler": layer}
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    checkpoint.save_params(path, params, TINY, bundled.VOCAB, True)
    return path


def test_params_checkpoint_metadata(tiny_checkpoint, tmp_path, record_property):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    cases = st.tuples(
        st.sampled_from([checkpoint.META_FILE, checkpoint.CONFIG_FILE]),
        st.booleans(),
    ).flatmap(
        lambda case: st.tuples(
            st.just(case[0]),
            st.just(case[1]),
            json_files(META if case[0] == checkpoint.META_FILE else TINY.portable().to_dict()),
        )
    )

    def check(case):
        name, scan_layers, contents = case
        for other in (checkpoint.META_FILE, checkpoint.CONFIG_FILE):
            shutil.copy(tiny_checkpoint / other, path / other)
        (path / name).write_bytes(contents)
        checkpoint_manifest.write_manifest(path, overwrite=True)  # sealed as a buggy writer would
        try:
            params, config, meta = checkpoint.load_params(path, scan_layers=scan_layers)
        except checkpoint.CheckpointError as e:
            check_one_line(e, path / name)
        else:
            assert isinstance(meta["do_lower_case"], bool) and config.scan_layers == scan_layers

    fuzz(
        record_property,
        "bertjax checkpoint metadata (checkpoint.load_params)",
        cases,
        check,
        max_examples=80,
    )


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory):
    """A training workdir with one verified step whose state is a stand-in tree: a 2-layer
    scanned encoder (leading axis 2), a pooler and a step counter; its record names an init
    checkpoint (``init_record``), whose entry the fuzzer mutates too."""
    layer = {"output": {"bias": np.arange(4, dtype=np.float32).reshape(2, 2)}}
    state = {
        "params": {"encoder": {"layers": {"layer": layer}}, "pooler": {"bias": np.ones(2)}},
        "step": np.int32(1),
    }
    path = tmp_path_factory.mktemp("workdir") / "run"
    init = init_record.InitRecord.of("/ckpt", "hf", state["params"], fresh=["mlm", "nsp"])
    workdir_lib.write_record(path, TINY, bundled.VOCAB, True, "{}", init=init)
    checkpoints = workdir_lib.Checkpoints(path, keep=1, async_save=False, log=lambda _: None)
    checkpoints.open_for_writing()
    checkpoints.save(1, state, np.zeros(2, np.uint32), {"step": 1})
    checkpoints.finish()
    checkpoints.close()
    return path


def _workdir_copy(tiny_workdir, tmp_path):
    path = tmp_path / "run"
    shutil.copytree(tiny_workdir, path)
    return path


def test_workdir_metadata(tiny_workdir, tmp_path, record_property):
    """Mutated metadata beside a checkpoint that verifies, so the reader goes on to the params:
    it gives the checkpoint's 2 layers with a config that says 2, or one line naming the file."""
    workdir = _workdir_copy(tiny_workdir, tmp_path)
    originals = {
        name: (workdir / name).read_bytes()
        for name in (workdir_lib.META_FILE, checkpoint.CONFIG_FILE)
    }
    documents = {
        workdir_lib.META_FILE: json.loads(originals[workdir_lib.META_FILE]),
        checkpoint.CONFIG_FILE: TINY.portable().to_dict(),
    }
    cases = st.sampled_from(sorted(documents)).flatmap(
        lambda name: st.tuples(st.just(name), json_files(documents[name]))
    )

    def check(case):
        name, contents = case
        for other, original in originals.items():
            (workdir / other).write_bytes(original)
        (workdir / name).write_bytes(contents)
        try:
            params, config, _, do_lower_case = workdir_lib.latest_params(workdir, log=print)
        except checkpoint.CheckpointError as e:
            check_one_line(e, workdir / name)
        else:
            meta = json.loads((workdir / workdir_lib.META_FILE).read_text())
            assert do_lower_case is meta["do_lower_case"]
            assert config.num_layers == 2
            layers = params["encoder"]["layers"]
            assert sorted(layers) == ["layer_0", "layer_1"]
            np.testing.assert_array_equal(layers["layer_1"]["output"]["bias"], [2, 3])

    fuzz(
        record_property,
        "workdir metadata (workdir.latest_params)",
        cases,
        check,
        max_examples=100,
    )
    # The fuzzer rarely writes a valid flipped casing; the check above must see one.
    flipped = {**documents[workdir_lib.META_FILE], "do_lower_case": False}
    check((workdir_lib.META_FILE, json.dumps(flipped).encode()))


def test_bert_config_from_dict(record_property):
    values = st.one_of(json_mutated(TINY.to_dict()), json_mutated(TINY.to_dict()), JSON)

    def check(value):
        try:
            config = BertConfig.from_dict(value, source="my/bert_config.json")
        except ValueError as e:
            check_one_line(e, "my/bert_config.json")
        else:
            assert BertConfig.from_dict(config.to_dict()) == config

    fuzz(record_property, "BertConfig.from_dict", values, check, max_examples=300)


def test_hf_config_json(tmp_path, record_property):
    """Only config.json is there: a readable one ends in "no model.safetensors", anything else
    in an error naming the file."""

    def check(contents):
        (tmp_path / "config.json").write_bytes(contents)
        with pytest.raises(ConvertError) as error:
            hf.read(str(tmp_path))
        if "no model.safetensors" not in str(error.value):
            check_one_line(error.value, tmp_path / "config.json")

    fuzz(
        record_property,
        "HF config.json (interop.hf.read)",
        json_files(HF_CONFIG),
        check,
        max_examples=200,
    )


@pytest.mark.parametrize(
    "name, document, scan_layers, message",
    [
        # bool("false") is True: the casing was silently flipped for fine-tuning and export.
        (checkpoint.META_FILE, {**META, "do_lower_case": "false"}, False, "do_lower_case='false'"),
        (checkpoint.META_FILE, [META], False, "expected a JSON object, got list"),  # AttributeError
        # 3 layers in the config, 2 in the params: stack_layers raised KeyError 'layer_2'.
        (checkpoint.CONFIG_FILE, {**TINY.to_dict(), "num_layers": 3}, True, "has 2 encoder layers"),
        (checkpoint.CONFIG_FILE, 0, False, "expected a JSON object, got int"),  # AttributeError
    ],
    ids=["casing as a string", "meta not an object", "layer count", "config not an object"],
)
def test_checkpoint_regressions(tiny_checkpoint, tmp_path, name, document, scan_layers, message):
    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    (path / name).write_text(json.dumps(document))
    checkpoint_manifest.write_manifest(path, overwrite=True)
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(message)) as error:
        checkpoint.load_params(path, scan_layers=scan_layers)
    check_one_line(error.value, path / name)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"is_decoder": "false"}, "is_decoder='false', expected true or false"),  # was causal
        ({"hidden_act": ["gelu"]}, "hidden_act=['gelu']"),  # TypeError: unhashable list
        ({"layer_norm_eps": None}, "layer_norm_eps=None"),  # accepted: BertConfig did not check it
    ],
    ids=["is_decoder as a string", "hidden_act a list", "eps null"],
)
def test_hf_config_regressions(tmp_path, changes, message):
    (tmp_path / "config.json").write_text(json.dumps({**HF_CONFIG, **changes}))
    with pytest.raises(ConvertError, match=re.escape(message)) as error:
        hf.read(str(tmp_path))
    check_one_line(error.value, tmp_path / "config.json")


@pytest.mark.parametrize(
    "name, contents, message",
    [
        (workdir_lib.META_FILE, '{"format_version": 2}', "do_lower_case=None"),  # KeyError
        (checkpoint.CONFIG_FILE, '{"hidden_dropout_rate": "0.1"}', "hidden_dropout_rate='0.1'"),
        (checkpoint.CONFIG_FILE, "", "not a JSON file"),  # json.JSONDecodeError
        # The checkpoint holds 2 layers: 3 raised IndexError, 1 silently dropped a layer.
        (checkpoint.CONFIG_FILE, {**TINY.to_dict(), "num_layers": 3}, "has 2 encoder layers"),
        (checkpoint.CONFIG_FILE, {**TINY.to_dict(), "num_layers": 1}, "has 2 encoder layers"),
    ],
    ids=["no casing", "rate as a string", "empty config", "3 layers", "1 layer"],
)
def test_workdir_regressions(tiny_workdir, tmp_path, name, contents, message):
    workdir = _workdir_copy(tiny_workdir, tmp_path)
    text = contents if isinstance(contents, str) else json.dumps(contents)
    (workdir / name).write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(message)) as error:
        workdir_lib.latest_params(workdir, log=lambda _: None)
    check_one_line(error.value, workdir / name)
