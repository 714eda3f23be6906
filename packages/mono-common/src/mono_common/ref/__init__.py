"""Plain-torch references of the stage library (`mono_common.stages`), one module per subject.

  fp8   block-FP8 weights and activations as SGLang quantises them (block_quant, per-token-group
        quant, act_quant, index-K quant, the block FP8 linear)
  rope  rotary embedding and the Hadamard rotation (SGLang's two rope layouts)
  gemv  the GEMV tiles' result in exact arithmetic, for checking `stages.gemv`

torch is imported by these modules; nothing in the package root imports them.
"""
