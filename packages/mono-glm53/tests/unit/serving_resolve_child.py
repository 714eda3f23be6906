"""Child of test_serving_example.py: SGLang 0.5.23's whole startup resolution of one command line.

`python serving_resolve_child.py <isa> <sglang launch_server args...>` parses the arguments
with SGLang's own parser (`prepare_server_args`) and runs `ServerArgs.resolve_once()`, the
pipeline a launcher runs, `handle_amd_monokernel` (and so the spec's startup checks)
included. This machine has no GPU, so the three hardware facts the pipeline asks for are
given as an H200's: the device kind ("cuda"), the compute capability (9, 0) and the ISA the
monokernel binding sees (argv[1]). Prints one JSON line: {"ok": true, "resolved": {...}} or
{"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    isa, argv = sys.argv[1], sys.argv[2:]
    import torch
    from sglang.srt.arg_groups import serving_hook
    from sglang.srt.kernel_plugins.amd import binding
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    serving_hook.get_device = lambda *a, **k: "cuda"
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    binding.device_isa = lambda: isa
    load_plugins()  # as the launcher does: the mono_glm53 entry point registers the spec
    server_args = prepare_server_args(argv)
    try:
        server_args.resolve_once()
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return
    resolved = server_args.resolved_dict()
    keep = {k: v for k, v in resolved.items() if isinstance(v, (str, int, float, bool, type(None), list, dict))}
    print(json.dumps({"ok": True, "resolved": keep}, default=str))


if __name__ == "__main__":
    main()
