"""`python -m raytrain.cli ...`: the `raytrain` command where no console script is on the PATH (the RayJob
entrypoints, scripts/ray-cluster)."""

import sys

from raytrain.cli import main

sys.exit(main())
