"""GLM-5.3 persistent decoder-layer kernel in Triton.

`stages.py`: the stage bodies and `layer_kernel` (fused: one persistent launch, stages linked
by epoch counters; staged: one launch a stage, runs under TRITON_INTERPRET=1); `layer.py`: the
launcher (`GlmLayerKernel`: buffers, counters, grid, fused/staged) and the compile-check
signature; `numerics.py`: the NUMERICS bounds; `harness.py`: kernel vs reference runs and
GPU timing helpers; `bench_path.py`: the "mono" path for `mono bench glm53`.
"""
