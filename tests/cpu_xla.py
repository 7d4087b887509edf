"""How the suite's processes compile for the CPU: ``N`` fake devices and XLA's cheapest compile.

The suite's models are tiny and run a few steps, so compiling is most of its cost. Two settings
halve it, and every process of the suite has both (``tests/conftest.py`` sets them for the test
processes before JAX is imported; a test that starts a process with its own device count takes
:func:`environ`):

- ``JAX_DISABLE_MOST_OPTIMIZATIONS=1``: XLA's backend at -O0 and LLVM's expensive passes off;
- ``--xla_cpu_use_fusion_emitters=false``: XLA:CPU's elemental emitters for fusions, not the
  MLIR fusion emitters, which at -O0 cost more to compile than the -O0 saves.

Measured with ``bench/suite_cost.py`` (docs/benchmarks.md): the whole suite fell from 2,106 to
1,854 CPU s, and its compute-bound MiniLM tests got no slower. Numerics are XLA:CPU's either way:
every comparison in the suite holds at the tolerances it had.
"""

import os

FAST_COMPILES = "--xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` for a process with ``devices`` fake CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILES}"


def environ(devices: int, base: dict | None = None, **extra: str) -> dict:
    """``base`` (default ``os.environ``) for a process with ``devices`` fake CPU devices, compiled
    as the suite's (``extra`` added last)."""
    return {
        **(os.environ if base is None else base),
        "XLA_FLAGS": xla_flags(devices),
        "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
        **extra,
    }
