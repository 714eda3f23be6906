"""GPU (H200) test of `python -m mono_glm53.demo`: on a GPU it runs the tiny layer fused and
staged against the reference, then times the fused launch beside the floor (issue item 5)."""

import pytest

# No skipif here: the mono pytest plugin marks tests/kernels `gpu`, skips them without a GPU
# and fails them under --require-gpu (a skipif would turn a GPU-less GPU run into a pass).


@pytest.mark.parametrize("args", ([], ["--no-indexer"], ["--width", "4", "--rows", "3", "--ctx", "300"]))
def test_demo_runs_fused_and_prints_time_and_floor(args, capsys):
    from mono_glm53.demo import main

    rc = main(args)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fused+staged" in out and "numerics: PASS" in out, out
    assert "glm53_layer.fused_vs_staged.max_abs" in out, out
    line = [ln for ln in out.splitlines() if ln.startswith("fused: ")]
    assert len(line) == 1 and " us, floor " in line[0] and "of floor)" in line[0], out
    assert float(line[0].split()[1]) > 0.0, out
