import sys

from ray_resilience.cli import main

sys.exit(main())
