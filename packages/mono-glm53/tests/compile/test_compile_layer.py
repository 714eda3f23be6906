"""Every variant of the GLM-5.3 layer kernel compiles for gfx950 and sm_90 on the CPU.

Variants: shape (TP1 whole layer, TP8 rank shard) x width (2, 4, 8) x indexer / no indexer,
fused launch, grid = one program per SM (132, H200) or CU (256, MI355X). The test prints the
resources and enforces: LDS/shared memory within one program per SM/CU, at least one
resident program. Spills are reported; zero spills is NOT met yet (sm_90: 48 spilled
bytes-slots at 255 registers, gfx950: 418 VGPR spills, TP8 width 2) and is an xfail.
A compile takes 1.5-3.5 minutes on a 2-core CPU; `-k` picks a subset.
"""

import pytest

from mono_common.compilecheck import compile_kernel, format_resources

SHAPES = ("tp8", "tp1")
WIDTHS = (2, 4, 8)
ISAS = ("sm_90", "gfx950")
GRID = {"sm_90": 132, "gfx950": 256}
LIMIT = {"sm_90": 227 * 1024, "gfx950": 160 * 1024}

_SIG = {}


def _sig():
    if not _SIG:
        from mono_glm53.kernels.layer import kernel_signature

        _SIG.update(kernel_signature())
    return _SIG


def _shape(name):
    from mono_glm53.config import REAL

    return REAL.tp_shard(8, 0) if name == "tp8" else REAL


_RES = {}


def _compile(isa, sname, width, indexer):
    key = (isa, sname, width, indexer)
    if key not in _RES:
        from mono_glm53.kernels.layer import variant_constexprs
        from mono_glm53.kernels.stages import layer_kernel

        ce = variant_constexprs(_shape(sname), width, indexer, GRID[isa], isa)
        _RES[key] = compile_kernel(layer_kernel, _sig(), ce, isa, num_warps=4)
        print(f"{sname} w{width} indexer={indexer}: {format_resources(_RES[key])}")
    return _RES[key]


@pytest.mark.parametrize("indexer", (True, False))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("sname", SHAPES)
@pytest.mark.parametrize("isa", ISAS)
def test_variant_compiles_within_budget(isa, sname, width, indexer):
    r = _compile(isa, sname, width, indexer)
    assert r.shared_bytes <= LIMIT[isa], format_resources(r)
    assert r.max_resident() >= 1, format_resources(r)


@pytest.mark.xfail(strict=True, reason="known: the fused kernel spills (sm_90 48, gfx950 418 at TP8 w2)")
@pytest.mark.parametrize("isa", ISAS)
def test_no_spills_tp8_w2(isa):
    r = _compile(isa, "tp8", 2, True)
    assert r.spills == 0, format_resources(r)
