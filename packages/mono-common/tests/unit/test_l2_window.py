"""mono_common.l2_window: the window a layer's weights get, and the driver struct's layout."""

import ctypes

from mono_common.l2_window import SKIP_BYTES, _Window, weight_window

MB = 1 << 20


def test_the_window_spans_the_small_weights_from_the_lowest_address():
    spans = [(1000 * MB, 16 * MB), (1020 * MB, 4 * MB), (900 * MB, 2 * MB)]
    assert weight_window(spans, 128 * MB) == (900 * MB, 124 * MB)


def test_the_window_is_cut_at_the_device_limit():
    spans = [(0, 16 * MB), (200 * MB, 16 * MB)]
    assert weight_window(spans, 128 * MB) == (0, 128 * MB)


def test_the_expert_stacks_stay_out_of_the_window():
    # a TP8 rank's 256 routed experts: ~1.2 GB in one stack, between the attention weights
    # and the shared expert
    spans = [(0, 50 * MB), (50 * MB, 1200 * MB), (1250 * MB, 5 * MB)]
    base, n = weight_window(spans, 128 * MB)
    assert base == 0 and n == 128 * MB  # from the attention weights on, clamped
    assert weight_window([(0, SKIP_BYTES)], 128 * MB) == (0, 0)


def test_no_window_without_a_device_limit_or_weights():
    assert weight_window([(0, 16 * MB)], 0) == (0, 0)
    assert weight_window([], 128 * MB) == (0, 0)
    assert weight_window([(0, 0)], 128 * MB) == (0, 0)


def test_the_window_struct_fills_the_drivers_64_byte_attribute_value():
    assert ctypes.sizeof(_Window) == 64
    assert _Window.nbytes.offset == 8 and _Window.hit_ratio.offset == 16
    assert _Window.hit_prop.offset == 20 and _Window.miss_prop.offset == 24
