"""mono_common.widths: a spec's per-ISA width tables merged by TP size."""

from mono_common.widths import merge_widths_by_tp


def test_widths_merge_over_isas_sorted_and_once():
    table = {"gfx950": {4: (2, 4), 8: (8, 2, 4)}, "sm_90": {4: (8, 4, 2), 8: (2, 4, 8), 2: (2,)}}
    assert merge_widths_by_tp(table) == {4: (2, 4, 8), 8: (2, 4, 8), 2: (2,)}


def test_an_empty_table_serves_nothing():
    assert merge_widths_by_tp({}) == {}
    assert merge_widths_by_tp({"sm_90": {}}) == {}
