"""Flash attention as Pallas TPU (Mosaic) kernels: ``flash.py`` (the entry point and its
``custom_vjp``), ``calls.py`` (grids and BlockSpecs), ``kernels.py`` (the kernel bodies)."""

from bertjax.model.attention.tpu.flash import flash_attention

__all__ = ["flash_attention"]
