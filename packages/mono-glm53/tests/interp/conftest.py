"""The interp tests run the kernel's staged mode under the Triton interpreter on the CPU."""

import os

# Must be set before triton (and the kernel modules) are imported.
os.environ["TRITON_INTERPRET"] = "1"
