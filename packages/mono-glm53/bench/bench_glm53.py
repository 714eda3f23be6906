"""Benchmark script for `mono bench glm53`: times the GLM-5.3 decode layer paths on the GPU.

Run from the repository root, e.g.
`PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 packages/mono-glm53/bench/bench_glm53.py --out OUT`
(or `--device cpu --tiny` for a CPU smoke test). All options: `mono_glm53.bench.main --help`.
"""

import sys

from mono_glm53.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
