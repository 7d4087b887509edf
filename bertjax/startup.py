"""A quiet start: which platform JAX uses, and TensorFlow without its start-up noise.

Importing ``bertjax`` calls :func:`set_platform_defaults` once, before JAX or TensorFlow load;
every variable it sets is left alone when the user has set it:

* ``JAX_PLATFORMS=cpu`` on a machine with no accelerator device files (``/dev/accel*`` and
  ``/dev/vfio/<n>`` on Cloud TPU VMs, ``/dev/nvidia<n>`` with an NVIDIA driver). Without it JAX
  probes for CUDA and, when ``libtpu`` is installed (the ``tpu`` and ``test`` extras), for a TPU,
  and prints what it did not find.
* ``TF_CPP_MIN_LOG_LEVEL=3``: TensorFlow only runs the host input pipeline; its C++ INFO, WARNING
  and ERROR lines (``cuInit`` failures on CPU machines, CPU-feature notices) are not for users.
  Python exceptions still carry TensorFlow's errors.
* ``GCS_STAT_CACHE_MAX_AGE=0``: TensorFlow's ``gs://`` filesystem otherwise answers metadata
  queries from a 5 s cache, so a checkpoint step deleted a moment ago still "exists" and orbax
  refuses to save it again (``tests/gcs/``). Each stat is then one request, at checkpoints only.

TensorFlow's CUDA-enabled wheel also prints a few lines before its logging is initialised, which
no variable silences; :func:`import_tensorflow` imports it with those lines filtered out at the
file-descriptor level. The commands call it after parsing flags (so ``--help`` never loads
TensorFlow); any other line TensorFlow prints while importing is passed through.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import sys
import tempfile

_TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*",)
_TENSORFLOW_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on|"
    r"cudart_stub\.cc|Could not find cuda drivers|cpu_feature_guard\.cc|"
    r"^To enable the following instructions|failed call to cuInit"
)


def has_tpu_devices() -> bool:
    """Whether this machine exposes Cloud TPU device files (a TPU VM)."""
    return any(glob.glob(pattern) for pattern in _TPU_DEVICE_FILES)


def has_accelerator_devices() -> bool:
    """Whether this machine exposes TPU or NVIDIA GPU device files."""
    return has_tpu_devices() or any(glob.glob(pattern) for pattern in _GPU_DEVICE_FILES)


def set_platform_defaults() -> None:
    """Sets the module docstring's defaults in ``os.environ`` (never overriding the user)."""
    if "JAX_PLATFORMS" not in os.environ and not has_accelerator_devices():
        os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GCS_STAT_CACHE_MAX_AGE", "0")


def import_tensorflow():
    """``import tensorflow``, with the lines it prints before its logging starts filtered out.

    Returns the module. Later imports anywhere get the same module, already quiet.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    return filtered_stderr(_TENSORFLOW_NOISE, importlib.import_module, "tensorflow")


def filtered_stderr(noise: re.Pattern, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the lines matching ``noise`` that native code writes to
    stderr (file descriptor 2) dropped; every other line is passed through afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            return fn(*args, **kwargs)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", errors="replace").splitlines()
            kept = [line for line in lines if not noise.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def hide_accelerators_from_tensorflow() -> None:
    """TensorFlow would otherwise grab GPU/TPU memory that JAX needs; it only runs the host
    pipeline."""
    tf = import_tensorflow()
    tf.config.set_visible_devices([], "GPU")
    if tf.config.list_physical_devices("TPU"):
        tf.config.set_visible_devices([], "TPU")


def initialize_distributed(coordinator: str | None, num_processes: int | None,
                           process_id: int | None, mode: str) -> None:  # fmt: skip
    """``jax.distributed.initialize``: with an explicit ``coordinator`` (CPU processes get gloo,
    the cross-process collectives jaxlib ships), or by the cluster's auto-detection when ``mode``
    is ``"true"``, or ``"auto"`` on a Cloud TPU VM (one host is a cluster of one)."""
    import jax  # noqa: PLC0415

    if coordinator:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes, process_id)
    elif mode == "true" or (mode == "auto" and has_tpu_devices()):
        jax.distributed.initialize()
