"""The top-k agreement metric (glm53_layer.topk.overlap_min): an exact tie at the reference's
k-th index score may be broken either way, anything else the kernel chose differently counts.

Found in session 38 and examined in session 39: at 1 row, ctx 40, 5 programs (tiny shape, top
16), seeds 12, 13 and 15 gave an overlap of 0.75-0.81 while the kernel's top-k was exact on its
own scores. For seed 12, twelve reference scores are exactly 0.0 (every head's ReLU zero) and
the k-th score is one of them: the kernel chose positions 8, 10, 11, torch.topk 27, 29, 33, all
scoring 0.0, so both sets are the top 16.
"""

import torch

from mono_glm53.kernels.harness import topk_overlap


def test_an_exact_tie_at_the_kth_score_may_resolve_either_way():
    sc = torch.tensor([0.9, 0.5, 0.0, 0.0, 0.0, 0.0, -0.2])
    # top 4 by the reference: 0, 1 and two of the four zeros
    assert topk_overlap({0, 1, 2, 3}, {0, 1, 4, 5}, sc) == (1.0, 2)
    assert topk_overlap({0, 1, 2, 5}, {0, 1, 4, 5}, sc) == (1.0, 1)
    assert topk_overlap({0, 1, 4, 5}, {0, 1, 4, 5}, sc) == (1.0, 0)


def test_a_position_outside_the_tie_is_a_miss():
    sc = torch.tensor([0.9, 0.5, 0.0, 0.0, 0.0, 0.0, -0.2])
    # 6 scores below the k-th: a real miss, not a tie
    assert topk_overlap({0, 1, 4, 6}, {0, 1, 4, 5}, sc) == (0.75, 0)
    # the reference's 0.5 missing and a tie member in its place: a miss, whatever ties exist
    assert topk_overlap({0, 2, 4, 5}, {0, 1, 4, 5}, sc) == (0.75, 0)
    # a near-tie is not a tie
    near = torch.tensor([0.9, 0.5, 1e-7, 0.0, 0.0, 0.0, -0.2])
    assert topk_overlap({0, 1, 3, 4}, {0, 1, 2, 4}, near) == (0.75, 0)


def test_sets_of_other_sizes_do_not_agree():
    sc = torch.tensor([0.9, 0.5, 0.0])
    assert topk_overlap({0, 1}, {0, 1, 2}, sc) == (0.0, 0)
    assert topk_overlap(set(), set(), sc) == (1.0, 0)
