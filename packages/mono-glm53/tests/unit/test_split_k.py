"""The split-K factors of the layer kernel's GEMVs (`layer._pick_ks`, `make_plan`)."""

import pytest

from mono_glm53.config import REAL, tiny
from mono_glm53.kernels.layer import _pick_ks, make_plan


def test_first_rule_takes_the_smallest_divisor_covering_the_grid():
    # qkv_a of a TP8 shard: 41 column tiles, 48 K blocks, 264 programs: 41 * 8 >= 264
    assert _pick_ks(41, 48, 264) == 8
    assert _pick_ks(41, 48, 132) == 4
    assert _pick_ks(320, 16, 264) == 1  # already enough tiles
    assert _pick_ks(3, 7, 264) == 7  # a prime K: its only divisors are 1 and 7


def test_balanced_rule_minimises_the_busiest_programs_blocks():
    # 41 tiles x ks on 264 programs: ks 6 -> 1 round of 8 blocks; ks 8 -> 2 rounds of 6 = 12;
    # ks 12 -> 2 x 4 = 8; ks 16 -> 3 x 3 = 9: 6 and 12 tie at 8, the fewer tiles win
    assert _pick_ks(41, 48, 264, rule="balanced") == 6
    # q_b + index q of a TP8 shard: 96 tiles, 16 blocks: ks 8 -> 3 x 2 = 6 (ks 4 -> 2 x 4 = 8)
    assert _pick_ks(96, 16, 264, rule="balanced") == 8
    for ntiles, kblocks, target in [(41, 48, 264), (96, 16, 264), (7, 8, 3), (256 + 64, 16, 264)]:
        got = _pick_ks(ntiles, kblocks, target, rule="balanced")
        cost = -(-ntiles * got // target) * (kblocks // got)
        for ks in range(1, min(kblocks, 16) + 1):
            if kblocks % ks == 0:
                assert cost <= -(-ntiles * ks // target) * (kblocks // ks), (ntiles, kblocks, ks)


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="split-K rule 'fast'"):
        _pick_ks(41, 48, 264, rule="fast")


def test_plan_default_is_the_first_rule_and_balanced_moves_only_dense_gemvs():
    s = REAL.tp_shard(8, 0)
    first = make_plan(s, 2, True, 264)
    assert (first.KS1, first.KS3, first.KS9, first.KSR, first.KSG) == (8, 4, 4, 8, 4)
    bal = make_plan(s, 2, True, 264, "balanced")
    assert (bal.KS1, bal.KS3, bal.KS9) == (6, 8, 8)
    assert (bal.KSR, bal.KSG) == (first.KSR, first.KSG)
    t = make_plan(tiny(), 2, True, 3, "balanced")
    assert t.KS1 != make_plan(tiny(), 2, True, 3).KS1  # the interp test runs a different split
