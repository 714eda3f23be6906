"""Every variant of the GLM-5.3 layer kernel compiles for gfx950 and sm_90 on the CPU.

Variants (fused launch, grid = `layer.PROGRAMS_PER_SM` programs per SM (2 x 132, H200) or CU
(1 x 256, MI355X)): the ones the product launches, per ISA the served TP sizes and widths of
`spec.WIDTHS_BY_TP` (a TP8 or TP4 rank, world 8 or 4, with the indexer, as `build` makes them)
with the GLM-5.x checkpoints' interleaved indexer rope (SGLang's fused indexer path, what a
served checkpoint launches), and per ISA the widest TP8 rank with the HF config's default
indexer (neox rope: the unfused path with the Hadamard rotation, the bench's and the GPU tests'
default shape), which SGLang accepts too. The single-rank variants the bench and the GPU tests
run (the whole layer, one TP8 shard alone, no indexer) are compiled on the H200 by those runs
and not here: CI time goes to what is served.
Each is compiled as a launch compiles it (`layer.launch_options`, `layer._codegen_scope`):
pointers 16-byte aligned (the kernel's one pointer argument, the table; the pointers read from
it carry the same hint), the launch's num_stages, no AMD buffer ops, and maxnreg 255 on sm_90.
The test records the resources (printed at the end of the run) and enforces: as many resident programs per SM/CU as the grid
puts there (registers, LDS/shared memory and warps), and no spills: no VGPR or SGPR spills on gfx950 (an SGPR spill
goes to a VGPR lane or scratch), no spill bytes on sm_90; and on sm_90, no volatile load of a table word.
A compile takes 1-3 minutes on a 2-core CPU; `-k` picks a subset.
"""

import re

import pytest

from mono_common.compilecheck import format_resources
from mono_glm53.kernels.layer import PROGRAMS_PER_SM
from mono_glm53.spec import RESIDENT_BLOCKS

# (shape name, tp_size of the shape, world of the launch)
# names as `mono_glm53.config.SHAPE_NAMES`: an "i", the checkpoints' interleaved indexer rope
SHAPES = {"tp4i": (4, 4), "tp8i": (8, 8), "tp8": (8, 8)}
ISAS = ("sm_90", "gfx950")
PER_SM = {"sm_90": PROGRAMS_PER_SM["cuda"], "gfx950": PROGRAMS_PER_SM["hip"]}
GRID = {isa: RESIDENT_BLOCKS[isa] * PER_SM[isa] for isa in PER_SM}
LIMIT = {"sm_90": 227 * 1024, "gfx950": 160 * 1024}

def _served():
    """(isa, shape name, width, indexer): "tpNi" the checkpoints' interleaved indexer rope, "tp8"
    the HF default's (the Hadamard path) at the widest TP8 width only."""
    from mono_glm53.spec import WIDTHS_BY_TP

    served = [(isa, f"tp{tp}i", w, True) for isa in ISAS for tp, ws in sorted(WIDTHS_BY_TP[isa].items()) for w in ws]
    return served + [(isa, "tp8", max(WIDTHS_BY_TP[isa][8]), True) for isa in ISAS]


VARIANTS = _served()


def _shape(name):
    from mono_glm53.config import REAL, REAL_INTERLEAVED

    tp, _ = SHAPES[name]
    base = REAL_INTERLEAVED if name.endswith("i") else REAL
    return base.tp_shard(tp, 0) if tp > 1 else base


_RES = {}


def _compile(isa, sname, width, indexer):
    key = (isa, sname, width, indexer)
    if key not in _RES:
        from mono_glm53.kernels.layer import compile_variant

        _RES[key] = compile_variant(_shape(sname), width, indexer, isa, world=SHAPES[sname][1])
    return _RES[key]


@pytest.mark.parametrize("isa,sname,width,indexer", VARIANTS)
def test_variant_compiles_within_budget(isa, sname, width, indexer, record_property):
    r = _compile(isa, sname, width, indexer)
    # printed at the end of the run by the mono pytest plugin (a print from an xdist worker is lost)
    record_property("resources", f"{sname} w{width} indexer={indexer} grid={GRID[isa]}: {format_resources(r)}")
    assert r.shared_bytes <= LIMIT[isa], format_resources(r)
    assert r.max_resident() >= PER_SM[isa], format_resources(r)
    if isa == "gfx950":
        for kind in ("vgpr", "sgpr"):
            n = int(re.search(rf"\.{kind}_spill_count:\s*(\d+)", r.asm["amdgcn"]).group(1))
            assert n == 0, f"{kind} spills: " + format_resources(r)
        scratch = int(re.search(r"\.private_segment_fixed_size:\s*(\d+)", r.asm["amdgcn"]).group(1))
        assert scratch == 0, f"scratch {scratch} B: " + format_resources(r)
    else:
        # every pointer-table word through the read-only cache (`stages._ld_word`): one volatile
        # table load left would pay an L2 round trip after each hand-off again
        ptx = r.asm["ptx"]
        assert "ld.global.nc.b64" in ptx
        assert "ld.volatile.global" not in ptx, "a pointer-table word is loaded volatile on sm_90"
    assert r.spills == 0, format_resources(r)
