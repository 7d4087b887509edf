"""Attention on NVIDIA GPUs: Pallas GPU (Triton) flash kernels (``flash.py``, the entry point
and its ``custom_vjp``; ``kernels.py``, the kernel bodies) and cuDNN's fused attention for the
calls it can run (``cudnn.py``)."""

from bertjax.model.attention.gpu.flash import flash_attention

__all__ = ["flash_attention"]
