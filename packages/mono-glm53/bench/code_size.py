"""The layer kernel's sm_90 code per stage, on the CPU: what a launch fetches.

A fused launch runs each stage's code once, and straight-line SASS beyond the SM's instruction
cache runs at ~0.09 us a KB from the L2 and up to ~0.25 us a KB after a weight stream has pushed
it to HBM (`packages/mono-common/bench/code_fetch.py`, H200, session 21). This compiles one
variant for sm_90 (as `tests/compile` does), disassembles it with line information (Triton's
bundled `nvdisasm -gi`) and attributes every instruction to the stage whose block of
`stages.layer_kernel` holds its outermost source line ("pre": before the first stage; "other":
functions outside the kernel body, such as a called failure path). The top-k stages sit in
helpers called after the index scores' block, so their code counts as "iscore". Run it with
Triton 3.8 (sglang's): Triton 3.6's line tables carry no inlining chains, and every
instruction then lands in "other".

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 \
    packages/mono-glm53/bench/code_size.py [--shape tp8i] [--width 2] [--knobs '{"hw_quant": false}']
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

_INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/")
_FRAME = re.compile(r'"([^"]+)", line (\d+)')
_BLOCK = re.compile(r"\s*(?:el)?if FIRST <= (\d+) and LAST >= \1")
_LOOP = re.compile(r"\s*for s in tl\.static_range\((\d+), (\d+)\)")
# the radix passes' runtime loop (Plan.TKL) sits in the `if TKL:` branch before their unrolled form
_TKL = re.compile(r"\s*if TKL:")


def stage_blocks(stages_src: str, names) -> tuple[int, list[tuple[int, str]]]:
    """(first line of layer_kernel's body, [(line, stage name)] where each stage's block starts),
    1-based lines of `stages_src`; a `for s in tl.static_range(a, b)` over stages (the top-k's
    radix passes, and their runtime loop in the `if TKL:` before it) is one block named after
    its first and last stage."""
    lines = stages_src.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("def layer_kernel")) + 1
    blocks = []
    for i in range(start, len(lines)):
        if m := _BLOCK.match(lines[i]):
            blocks.append((i + 1, names[int(m.group(1))]))
        elif _TKL.match(lines[i]):
            blocks.append((i + 1, f"{names[6]}..{names[9]}"))
        elif m := _LOOP.match(lines[i]):
            blocks.append((i + 1, f"{names[int(m.group(1))]}..{names[int(m.group(2)) - 1]}"))
    return start, blocks


def attribute(dis: str, stages_file: str, start: int, blocks: list[tuple[int, str]]) -> dict[str, int]:
    """Bytes of SASS per block name from `nvdisasm -gi` text: consecutive `//##` lines form one
    inlining chain (innermost first), which holds for the instructions after it."""
    size: collections.Counter[str] = collections.Counter()
    chain: list[tuple[str, str]] = []
    fresh = True
    for line in dis.split("\n"):
        if "//## File" in line:
            frames = _FRAME.findall(line)
            chain = frames if fresh else chain + frames
            fresh = False
        elif _INSN.match(line):
            fresh = True
            where = "other"
            if chain and chain[-1][0].endswith(stages_file) and int(chain[-1][1]) >= start:
                ln = int(chain[-1][1])
                where = "pre"
                for b, name in blocks:
                    if ln >= b:
                        where = name
            size[where] += 16
    return dict(size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tp8i", choices=("tp8i", "tp8", "tp4i", "tp4", "tp1i", "tp1"),
                    help="a TP rank's shard or the whole layer (tp1); with an i the checkpoints' indexer rope "
                         "(config.named_shape: what a served checkpoint launches)")
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--knobs", default="{}", help="GlmLayerKernel knobs as JSON (kernels.layer.KNOBS)")
    ap.add_argument("--world", type=int, default=None,
                    help="ranks of the launch (default: the shape's TP size, the served build; 1: the "
                         "bench's shard alone, without its all-reduces)")
    ap.add_argument("--json", action="store_true", help="print the sizes as JSON")
    a = ap.parse_args(argv)
    import triton

    from mono_common.compilecheck import nvidia_tool
    from mono_glm53.config import REAL
    from mono_glm53.kernels import layer as L
    from mono_glm53.kernels import stages as S

    tp = int(a.shape[2:].rstrip("i"))
    base = dataclasses.replace(REAL, indexer_rope_interleave=True) if a.shape.endswith("i") else REAL
    s = base.tp_shard(tp, 0) if tp > 1 else base
    knobs = json.loads(a.knobs)
    res = L.compile_variant(s, a.width, True, "sm_90", world=tp if a.world is None else a.world, knobs=knobs)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.asm["cubin"])
        f.flush()
        dis = subprocess.run([nvidia_tool("nvdisasm"), "-gi", "-c", f.name], capture_output=True, text=True,
                             check=True).stdout
    src = open(S.__file__).read()
    start, blocks = stage_blocks(src, S.STAGE_NAMES)
    size = attribute(dis, os.path.basename(S.__file__), start, blocks)
    if a.json:
        print(json.dumps(size))
        return 0
    total = sum(size.values())
    print(f"{a.shape} width {a.width} world {tp if a.world is None else a.world} knobs {knobs}: {total / 1024:.1f} KB of sm_90 SASS, {res.registers} registers, "
          f"{res.spills} spilled bytes (Triton {triton.__version__})")
    for name, b in size.items():
        print(f"  {name:18s} {b / 1024:6.1f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
