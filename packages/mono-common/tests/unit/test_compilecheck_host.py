"""compilecheck's resource arithmetic and the source digest (no compilation here)."""

import pytest

from mono_common import compilecheck as cc


def _res(target, regs, warps=4, shared=0, sgprs=None, agprs=None):
    return cc.Resources(target, "k", warps, 64 if target == "gfx950" else 32, regs, sgprs, agprs, shared, 0)


@pytest.mark.parametrize("regs,warps,shared,expect", [
    (32, 4, 0, 16),      # 64-warp limit: 16 programs of 4 warps
    (128, 4, 0, 4),      # 128*32 = 4096 regs/warp -> 16 warps -> 4 programs
    (255, 4, 0, 2),      # 255 -> 8192/warp -> 8 warps -> 2 programs
    (32, 4, 100 * 1024, 2),  # shared: 228 KiB / (100 KiB + 1 KiB)
    (16, 1, 0, 32),      # block limit 32
])
def test_max_resident_sm90(regs, warps, shared, expect):
    assert cc.max_resident(_res("sm_90", regs, warps, shared)) == expect


@pytest.mark.parametrize("vgpr,agpr,sgpr,warps,lds,expect", [
    (64, 0, 32, 4, 0, 8),       # 512/64 = 8 waves/SIMD -> 32 waves/CU -> 8 programs of 4
    (128, 0, 32, 4, 0, 4),      # 4 waves/SIMD
    (128, 128, 32, 4, 0, 2),    # unified file: 256 -> 2 waves/SIMD
    (10, 0, 32, 4, 0, 8),       # capped at 8 waves/SIMD
    (64, 0, 32, 4, 64 * 1024, 2),  # LDS 160 KiB / 64 KiB
    (32, 0, 106, 4, 0, 7),      # SGPRs: 800 / 112 = 7 waves/SIMD
])
def test_max_resident_gfx950(vgpr, agpr, sgpr, warps, lds, expect):
    assert cc.max_resident(_res("gfx950", vgpr, warps, lds, sgpr, agpr)) == expect


def test_unknown_target_rejected():
    with pytest.raises(ValueError, match="unknown target"):
        cc.gpu_target("sm_42")


def test_source_digest_order_independent_and_sensitive(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    d1 = cc.source_digest(str(a), str(b))
    assert d1 == cc.source_digest(str(b), str(a))
    assert len(d1) == 64
    b.write_text("y = 3\n")
    assert cc.source_digest(str(a), str(b)) != d1
    assert cc.source_digest(str(a), str(b), extra="triton-3.6") != cc.source_digest(str(a), str(b))


def test_source_digest_of_functions_changes_with_source():
    def f():
        return 1

    def g():
        return 2

    assert cc.source_digest(f) != cc.source_digest(g)
    assert cc.source_digest(f, g) == cc.source_digest(g, f)


def test_constexprs_with_defaults_take_them_and_others_must_be_given():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def k(x_ptr, N: tl.constexpr, FAST: tl.constexpr = False, DEPTH: tl.constexpr = 3):
        tl.store(x_ptr + tl.arange(0, N), tl.zeros([N], tl.float32) + FAST + DEPTH)

    src = cc._ast_source(k, {"x_ptr": "*fp32"}, {"N": 16, "DEPTH": 2})
    # keyed by argument position (Triton 3.6 / 3.8): N given, FAST its default, DEPTH given
    assert dict(src.constants) == {(1,): 16, (2,): False, (3,): 2}
    with pytest.raises(ValueError, match=r"no type or constexpr value for \['N'\]"):
        cc._ast_source(k, {"x_ptr": "*fp32"}, {})
