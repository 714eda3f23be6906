"""mono-common: the shared runtime of the mono SGLang monokernel plugins.

Importing this package is cheap on purpose: SGLang runs every plugin entry
point in every process, so nothing here imports torch, triton or sglang at
import time. The device helpers live in `mono_common.device` and import
triton only when a kernel module imports them.
"""

from mono_common.__about__ import __version__

__all__ = ["__version__"]
