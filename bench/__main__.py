"""`python -m bench` (what scripts/bench runs from the repository root)."""

from bench.cli import main

raise SystemExit(main())
