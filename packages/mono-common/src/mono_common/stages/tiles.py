"""Tile assignment of a persistent launch: every stage loops `for t in range(pid, ntiles, nprog)`.

  first_tile(pid, nprog, base) -> the first tile index >= base that program pid takes, so a
      stage whose tiles fall in consecutive ranges loops over each range apart with the same
      assignment as one loop over all
"""

import triton
import triton.language as tl  # noqa: F401 (the interpreter needs it in a jit function's globals)


@triton.jit
def first_tile(pid, nprog, base):
    """The first tile index >= base that program pid takes (t = pid mod nprog): stages whose
    tiles fall in consecutive ranges loop over each range apart with the same assignment."""
    return base + (pid + nprog - base % nprog) % nprog
