"""``bertjax.training.init_record``: the fingerprint against its documented byte stream, the
record's entry in ``bertjax_workdir.json`` (written, read back, refused in one line naming the
file), and the resume policy: which start resumes from the record, the notice when the command
line names another checkpoint, and a re-read that finds the checkpoint gone or changed.

The end-to-end runs (a continued pretraining and a fine-tune resumed with their init checkpoint
deleted) are ``tests/pretrain/continued_test.py`` and ``tests/finetune/loop_test.py``.
"""

import hashlib
import json
import re

import numpy as np
import pytest

from bertjax.data import bundled
from bertjax.model.config import BertConfig
from bertjax.training import checkpoint, init_record
from bertjax.training import workdir as workdir_lib
from tests.fuzzing import check_one_line

TINY = BertConfig(vocab_size=7633, hidden_size=16, num_layers=2, num_heads=2,
                  intermediate_size=32, max_position_embeddings=16)  # fmt: skip
PARAMS = {
    "pooler": {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}},
    "encoder": {"scale": np.float32(1.5), "ids": np.array([7, -1], np.int32)},
}


def test_fingerprint_is_the_documented_byte_stream():
    # Reference: the docstring's format, written out by hand for PARAMS in sorted path order.
    stream = b"".join([
        b"encoder/ids\0int32\0(2,)\0", np.array([7, -1], "<i4").tobytes(),
        b"encoder/scale\0float32\0()\0", np.array(1.5, "<f4").tobytes(),
        b"pooler/dense/kernel\0float32\0(2, 3)\0", np.arange(6, dtype="<f4").tobytes(),
    ])  # fmt: skip
    assert init_record.params_fingerprint(PARAMS) == hashlib.sha256(stream).hexdigest()
    # Dict order and array memory layout do not matter; a value, dtype, shape or name does.
    reordered = {"encoder": dict(reversed(PARAMS["encoder"].items())), "pooler": PARAMS["pooler"]}
    fortran = {**PARAMS, "pooler": {"dense": {"kernel": np.asfortranarray(
        PARAMS["pooler"]["dense"]["kernel"])}}}  # fmt: skip
    same = init_record.params_fingerprint(PARAMS)
    assert init_record.params_fingerprint(reordered) == same
    assert init_record.params_fingerprint(fortran) == same
    flipped = np.arange(6, dtype=np.float32).reshape(2, 3)
    flipped.view(np.uint32)[1, 2] ^= 1  # the lowest bit of one weight
    for changed in (
        {**PARAMS, "pooler": {"dense": {"kernel": flipped}}},
        {**PARAMS, "encoder": {**PARAMS["encoder"], "ids": np.array([7, -1], np.int64)}},
        {**PARAMS, "encoder": {**PARAMS["encoder"], "ids": np.array([[7, -1]], np.int32)}},
        {**PARAMS, "encoder": {"scale": np.float32(1.5), "idz": np.array([7, -1], np.int32)}},
    ):
        assert init_record.params_fingerprint(changed) != same


def _record(**init) -> init_record.InitRecord:
    fields = dict(source="/ckpt", format="hf", params_sha256="ab" * 32, subtrees=("encoder",))
    return init_record.InitRecord(**{**fields, **init})


def test_the_record_round_trips_and_format_2_still_reads(tmp_path):
    init = init_record.InitRecord.of("/ckpt", "hf", PARAMS, fresh=["mlm", "nsp"])
    assert init.subtrees == ("encoder", "pooler") and init.fresh == ("mlm", "nsp")
    workdir_lib.write_record(tmp_path, TINY, bundled.VOCAB, True, "{}", init=init)
    meta = json.loads((tmp_path / workdir_lib.META_FILE).read_text())
    assert meta["format_version"] == 3
    assert meta["init"] == {"source": "/ckpt", "format": "hf", "subtrees": ["encoder", "pooler"],
                            "params_sha256": init_record.params_fingerprint(PARAMS),
                            "fresh": ["mlm", "nsp"]}  # fmt: skip
    assert workdir_lib.read_record(tmp_path)["init"] == init
    # A format-2 record (no "init") still reads, and resumes as before: by reading the checkpoint.
    old = {k: v for k, v in meta.items() if k != "init"} | {"format_version": 2}
    (tmp_path / workdir_lib.META_FILE).write_text(json.dumps(old))
    record = workdir_lib.read_record(tmp_path)
    assert record["format_version"] == 2 and record["init"] is None
    assert init_record.resumed(record, "/ckpt", tmp_path) is None


@pytest.mark.parametrize(
    "entry, message",
    [
        ("missing", "no 'init' entry"),
        ({"source": "/ckpt"}, "init={'source': '/ckpt'}, expected null or"),
        ({**_record().to_json(), "params_sha256": "AB" * 32}, "(64 hex digits)"),
        ({**_record().to_json(), "subtrees": "encoder"}, "lists of names"),
        ({**_record().to_json(), "source": ""}, "expected null or"),
        ([], "init=[], expected null or"),
    ],
    ids=["missing", "fields", "upper-case hex", "subtrees a string", "no source", "a list"],
)
def test_a_bad_init_entry_is_one_line_naming_the_file(tmp_path, entry, message):
    workdir_lib.write_record(tmp_path, TINY, bundled.VOCAB, True, "{}", init=_record())
    path = tmp_path / workdir_lib.META_FILE
    meta = json.loads(path.read_text())
    if entry == "missing":
        del meta["init"]
    else:
        meta["init"] = entry
    path.write_text(json.dumps(meta))
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(message)) as error:
        workdir_lib.read_record(tmp_path)
    check_one_line(error.value, path)


def test_which_start_resumes_from_the_record(tmp_path, capsys):
    record = {"format_version": 3, "init": _record()}
    assert init_record.resumed(None, "/ckpt", tmp_path) is None  # a first start
    assert init_record.resumed(record, "/ckpt", tmp_path) == _record()
    assert init_record.resumed(record, "", tmp_path) == _record()  # no flag: the recorded one
    assert capsys.readouterr().out == ""
    # Another path: a notice, and the record wins.
    assert init_record.resumed(record, "/moved", tmp_path) == _record()
    assert capsys.readouterr().out == (
        f"config.init_checkpoint=/moved: {tmp_path} records /ckpt as its run's init checkpoint, "
        "and the record wins (architecture, vocab, casing); /moved is read only if no step "
        "restores, and must hold the same params (sha256 abababababababab...)\n"
    )
    # A run from a fresh init: resumes as such, and refuses to become a continued run.
    fresh = {"format_version": 3, "init": None}
    assert init_record.resumed(fresh, "", tmp_path) is None
    with pytest.raises(checkpoint.CheckpointError) as error:
        init_record.resumed(fresh, "/ckpt", tmp_path)
    assert str(error.value) == (
        f"{tmp_path} holds a run that started from a fresh init (its record names no init "
        "checkpoint); config.init_checkpoint=/ckpt would start another run: drop it to resume, "
        "or use a new workdir (nothing was changed)"
    )


def test_a_reread_checks_the_params_and_names_a_missing_checkpoint(tmp_path, capsys):
    init = init_record.InitRecord.of("/ckpt", "hf", {"encoder": PARAMS["encoder"]})
    with_heads = {**PARAMS, "mlm": {"bias": np.zeros(3, np.float32)}}
    # Only the recorded subtrees are taken, from the path given, else the recorded one.
    read = []
    got = init_record.reread(init, "", tmp_path, lambda path: read.append(path) or with_heads)
    assert read == ["/ckpt"] and list(got) == ["encoder"] and got["encoder"] is PARAMS["encoder"]
    assert capsys.readouterr().out.startswith(f"init_checkpoint /ckpt: read, as {tmp_path} ")
    init_record.reread(init, "/moved", tmp_path, lambda path: read.append(path) or with_heads)
    assert read[-1] == "/moved"

    def missing(path):
        raise ValueError(f"{path}: no such checkpoint directory")

    with pytest.raises(checkpoint.CheckpointError) as error:
        init_record.reread(init, "", tmp_path, missing)
    assert str(error.value) == (
        f"/ckpt: no such checkpoint directory; {tmp_path} holds no verified step, so its run "
        "starts again from its init checkpoint (recorded: /ckpt): put it back, or pass where it "
        "is now with --config.init_checkpoint"
    )
    changed = {"encoder": {**PARAMS["encoder"], "scale": np.float32(1.25)}}
    other = init_record.params_fingerprint(changed)[:16]
    for params, here in ((changed, f"sha256 {other}..."), ({"pooler": {}}, "no encoder")):
        with pytest.raises(checkpoint.CheckpointError) as error:
            init_record.reread(init, "/other", tmp_path, lambda path, p=params: p)
        assert str(error.value) == (
            f"/other: not the params {tmp_path}'s run started from (its record: /ckpt, encoder "
            f"with sha256 {init.params_sha256[:16]}...; here: {here}): pass that checkpoint, or "
            "use a new workdir (nothing was changed)"
        )
