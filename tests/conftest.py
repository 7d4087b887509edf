"""Test set-up: 8 fake CPU devices for sharding tests, compiled cheaply (``tests/cpu_xla.py``)
and lowered without Python tracebacks in MLIR locations, TensorFlow kept off accelerators, one
JAX compilation cache for the run, a ``full_optimizations`` fixture for a test whose property
depends on how long a step takes and a ``tracebacks_in_locations`` one for a test that reads
them, one garbage collection when a worker ends, and a line per reader at the end of the
session with the inputs its fuzz tests tried (``tests/fuzzing.py``). The commands tests start
fork from a zygote (``tests/zygote.py``).

This runs before any test module imports JAX, so the flags take effect. Under ``pytest -n N``
the suite runs with ``--dist loadgroup`` (pyproject.toml): the tests of a module marked
``xdist_group`` share one worker, so its expensive module fixture (main_test's reference run,
train_test's single-device reference) is built once, not once per worker.
"""

import os

from tests import cpu_xla  # noqa: E402 - no JAX import

os.environ.setdefault("XLA_FLAGS", cpu_xla.xla_flags(8))
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # as bertjax.startup sets it for its commands
# No Python tracebacks in the MLIR locations of what JAX lowers (its default: every frame of the
# stack, pytest's included): metadata the suite never reads, 5% of a model test file's CPU.
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One JAX compilation cache for the whole run: pytest's controller makes the directory, and its
# xdist workers and every process a test starts inherit it (a test that sets its own keeps it).
# The suite compiles the same tiny steps in dozens of processes and modules; every compile is
# written once and read after (no minimum compile time: at -O0 most take well under JAX's 1 s
# default). Removed when the run ends.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile  # noqa: E402

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bertjax-tests-jax-cache-")
    os.environ["BERTJAX_TESTS_JAX_CACHE_OWNER"] = str(os.getpid())

try:  # noqa: SIM105 - Triton (the test extra; torch imports it too) must load before TensorFlow:
    # in the other order LLVM aborts the worker ("inconsistency in registered CommandLine
    # options"), e.g. a HF parity test running after any test that read data with TensorFlow.
    import triton  # noqa: F401, E402
except ImportError:
    pass

import pathlib  # noqa: E402

import pytest  # noqa: E402

TESTDATA = pathlib.Path(__file__).parent / "testdata"


@pytest.fixture
def testdata() -> pathlib.Path:
    return TESTDATA


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny pretraining run the command tests share, and its reference run, made once per
    session across xdist workers (``tests/commands/tiny_run.py``)."""
    from tests.commands import tiny_run as tiny_run_lib  # noqa: PLC0415

    base = tmp_path_factory.getbasetemp()
    session_root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return tiny_run_lib.shared(session_root)


@pytest.fixture
def tracebacks_in_locations(monkeypatch):
    """JAX's default back for one test and the processes it starts: Python tracebacks in the MLIR
    locations of what it lowers, which the compile report's byte breakdown reads."""
    from jax._src import config  # noqa: PLC0415 - after the environment above is set

    monkeypatch.setenv("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "1")
    with config.include_full_tracebacks_in_locations(True):
        yield


@pytest.fixture
def full_optimizations():
    """XLA's optimizations back on for one test (the suite compiles at -O0, ``tests/cpu_xla.py``):
    a test whose property depends on how long a step takes."""
    import jax  # noqa: PLC0415 - after the environment above is set

    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


def pytest_configure(config):
    """One garbage collection, not pytest's five, when a worker's session ends: on the heap of
    a worker that has run JAX, TensorFlow and torch each pass takes seconds. Only objects that
    need several passes to be freed go unchecked; each test's unraisable exceptions are still
    caught at its teardown."""
    from _pytest import unraisableexception  # noqa: PLC0415 - pinned pytest (constraints.txt)

    key = getattr(unraisableexception, "gc_collect_iterations_key", None)
    if key is not None:
        config.stash[key] = 1


@pytest.fixture(autouse=True)
def _xdist_group_holds(request):
    """Fails an ``xdist_group`` test whose node id lacks its ``@group`` suffix.

    ``--dist loadgroup`` sends a group to one worker by that suffix. pytest-xdist 3.8 sets it on
    ``item._nodeid``, which pytest 9.2 no longer reads (``nodeid`` is built from ``_id``): the
    groups then scatter silently, module fixtures are built once per worker (the notebook runs
    twice) and tests meant to run apart run side by side. constraints.txt pins a pytest it works
    with; with one it does not work with, the run fails instead of only slowing down.
    """
    item = request.node
    loadgroup = getattr(request.config.option, "loadgroup", False)  # set in xdist's workers
    if loadgroup and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(
            f"--dist loadgroup has no effect with pytest {pytest.__version__} (this test's node "
            "id lacks its @group suffix): install the pytest of constraints.txt"
        )


def pytest_sessionfinish(session):
    """Drops JAX's garbage-collection hook before pytest-xdist stops this worker.

    execnet stops a worker by interrupting its main thread; when that KeyboardInterrupt lands in
    ``jax._src.lib._xla_gc_callback`` (run by ``gc``), Python prints it as an unraisable
    exception after every passing run. The hook only frees XLA buffers early; at exit it is moot.
    """
    import gc  # noqa: PLC0415

    gc.callbacks[:] = [c for c in gc.callbacks if getattr(c, "__name__", "") != "_xla_gc_callback"]
    if os.environ.get("BERTJAX_TESTS_JAX_CACHE_OWNER") == str(os.getpid()):  # the controller
        import shutil  # noqa: PLC0415

        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


# Fuzz-test input counts (tests/fuzzing.py records them as test properties). Counted from the
# reports, not in the tests' processes, because under pytest-xdist only the controller prints
# the summary; the reports carry their properties to it.
_fuzz_inputs: dict[str, int] = {}
_FUZZ_PROPERTY = "fuzz inputs: "


def pytest_runtest_logreport(report):
    if report.when == "call":
        for name, value in report.user_properties:
            if name.startswith(_FUZZ_PROPERTY):
                reader = name[len(_FUZZ_PROPERTY) :]
                _fuzz_inputs[reader] = _fuzz_inputs.get(reader, 0) + int(value)


def pytest_terminal_summary(terminalreporter):
    for reader, count in sorted(_fuzz_inputs.items()):
        terminalreporter.write_line(f"fuzz: {count:5d} inputs tried on {reader}")
