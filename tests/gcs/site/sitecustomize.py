"""Short tensorstore retry delays for the processes run in the hermetic GCS (tests only).

``Emulator.environ`` puts this folder first on ``PYTHONPATH``, so Python imports this module at
start-up in every process the GCS tests run. It does what ``GCS_RETRY_CONFIG_*`` does for
TensorFlow: tensorstore (under orbax) retries a failed GCS request after 1 s, doubling to 32 s,
and has no environment variable for it, so a run under the front's injected 503s and resets
waited about a second per fault (the fault-injected pretraining run: ~50 s of its 66 s). Here
the first retry waits 10 ms, at most 100 ms; the number of retries is tensorstore's own.

The delays go into the context every orbax checkpoint operation is opened with
(``tensorstore_utils.get_ts_context``), when orbax imports it: nothing is imported here.
"""

import importlib.abc
import importlib.util
import sys

TARGET = "orbax.checkpoint._src.serialization.tensorstore_utils"
RETRIES = {"gcs_request_retries": {"initial_delay": "10ms", "max_delay": "100ms"}}


def _shorten(module) -> None:
    contexts = [getattr(module, name, None) for name in ("_BASE_TS_CONTEXT",
                                                         "_DEFAULT_OCDBT_TS_CONTEXT")]  # fmt: skip
    if not all(isinstance(context, dict) for context in contexts):
        raise ImportError(f"tests/gcs/site: {TARGET} has no default contexts (orbax changed?)")
    for context in contexts:
        context.update(RETRIES)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_shorten`` on ``TARGET`` right after its module code, once."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _shorten(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
