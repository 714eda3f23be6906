"""MONO_GLM53_FAULT, the layer kernel's injected wait fault: parsing and its refusals."""

import pytest

from mono_glm53.kernels.layer import fault_stage


def test_unset_means_no_fault():
    assert fault_stage(0, "") == -1


def test_stage_for_every_rank():
    assert fault_stage(0, "stage7") == 7
    assert fault_stage(3, "stage7") == 7


def test_stage_for_one_rank_only():
    assert fault_stage(1, "rank1:stage7") == 7
    assert fault_stage(0, "rank1:stage7") == -1


@pytest.mark.parametrize("bad", ["stage0", "stage21", "mla", "rank:stage3", "rankx:stage3", "rank1:7"])
def test_bad_values_say_what_is_expected(bad):
    with pytest.raises(ValueError, match="MONO_GLM53_FAULT"):
        fault_stage(0, bad)
