"""bertjax's own formats through interop: a training workdir exported to HF, bit-exact against
the HF model its weights came from."""

import numpy as np
import transformers

from bertjax.interop import formats
from bertjax.model.encoder import stack_layers
from bertjax.training import workdir as workdir_lib
from tests.interop.references import loaded_cleanly, state_dicts_equal


def test_export_from_training_workdir_bit_exact(small_pretraining, tmp_path):
    """A workdir as the training loop writes it (scanned params in the state) -> HF directory."""
    model, path = small_pretraining
    conv = formats.load(str(path))
    workdir = tmp_path / "workdir"
    workdir_lib.write_record(workdir, conv.config.replace(scan_layers=True), conv.vocab_file,
                             True, "{}")  # fmt: skip
    scanned = {**conv.params, "encoder": stack_layers(conv.params["encoder"], 2)}
    checkpoints = workdir_lib.Checkpoints(workdir, keep=1, async_save=False)
    checkpoints.open_for_writing()
    state = {"params": scanned, "step": np.array(7, np.int32)}
    checkpoints.save(7, state, np.zeros(2, np.uint32), {"step": 7})
    checkpoints.finish()
    checkpoints.close()
    assert formats.detect_format(str(workdir)) == "workdir"
    formats.convert(str(workdir), str(tmp_path / "hf"), "hf")
    state_dicts_equal(model, loaded_cleanly(transformers.BertForPreTraining, tmp_path / "hf"))
