"""`mono bench glm53` with the monokernel column: registers the "mono" path, then runs the bench.

PYTHONPATH=packages/mono-common/src:packages/mono-glm53/src python3 \
    packages/mono-glm53/bench/bench_glm53_mono.py --out OUT --paths unfused,mono
"""

import sys

from mono_glm53.bench import main
from mono_glm53.kernels.bench_path import register

if __name__ == "__main__":
    register()
    sys.exit(main(sys.argv[1:]))
