"""bench/stall_profile.py's attribution of a kernel's instructions to the layer's stages, on
disassembly text shaped as `nvdisasm -gi` writes it (the real source lines of this tree), and
its refusal of a profile that other sources built."""

import gzip
import json
import pathlib
import re
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import stall_profile as SP  # noqa: E402


def _line(path, pattern):
    """The 1-based line of the first match of `pattern` in the source file at `path`."""
    return next(i + 1 for i, ln in enumerate(open(path).read().split("\n")) if re.search(pattern, ln))


def _frame(path, line):
    return f'\t//## File "{path}", line {line}'


def test_instructions_go_to_their_stage_the_handoffs_to_sync_and_shared_code_to_the_stage_before():
    import mono_common.device.guard as guard
    import mono_common.stages.gemv as gemv
    import mono_common.stages.topk as topk
    from mono_glm53.kernels import stages as S

    st = S.__file__
    qb_block = _line(st, r"^    if FIRST <= 3 and LAST >= 3:")
    insn = iter(range(0, 1 << 16, 16))

    def i():
        return f"        /*{next(insn):04x}*/                   NOP ;"

    dis = "\n".join([
        _frame(st, _line(st, r"^def layer_kernel") + 1), i(),            # before any stage
        _frame(st, _line(st, r"^def stage_addnorm") + 1), i(),           # a stage's own function
        _frame(gemv.__file__, _line(gemv.__file__, r"^def gemv_span")), i(), i(),  # shared: addnorm's
        _frame(st, _line(st, r"^def _sync_now") + 3), i(),               # a hand-off
        _frame(guard.__file__, 10), i(),                                  # the guard's wait: sync too
        _frame(gemv.__file__, 50), i(),                                   # shared after sync: addnorm's still
        # a Triton 3.8 chain, innermost first: gemv -> stage_qb -> layer_kernel's qb block
        _frame(gemv.__file__, 50), _frame(st, _line(st, r"^def stage_qb") + 5), _frame(st, qb_block + 1), i(),
        _frame(topk.__file__, _line(topk.__file__, r"^def topk_count") + 3), i(),
    ])
    got = SP.attribute(dis, SP.StageMap())
    assert got == ["pre", "addnorm", "addnorm", "addnorm", "sync", "sync", "addnorm", "qb", "tkcount"]


def test_table_refuses_a_profile_of_other_sources(tmp_path):
    rep = tmp_path / "stalls_w1"
    rep.with_suffix(".json").write_text(json.dumps({"width": 1, "ctx": 4096, "knobs": {}, "sources": "0" * 16}))
    with gzip.open(str(rep) + ".csv.gz", "wt") as f:
        f.write('"Kernel Name","layer_kernel"\n')
    with pytest.raises(SystemExit, match=r"collected from other sources than these \(digest 0{16}, here [0-9a-f]{16}\)"):
        SP.table(str(rep))
