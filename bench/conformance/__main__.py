"""`python -m bench.conformance [VERSION ...]`: see bench/conformance/matrix.py."""

import sys

from bench.conformance.matrix import main

sys.exit(main(sys.argv[1:]))
