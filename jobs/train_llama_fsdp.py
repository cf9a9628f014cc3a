"""The example job: train a Hugging Face Llama with FSDP2 on Ray, surviving faults.

The code lives in the package (`ray_resilience/examples/train_llama.py`, also run by
`ray-resilience train`); this file keeps `python jobs/train_llama_fsdp.py ...` working for
`ray job submit --working-dir .` and the RayJob manifests. `--help` lists the arguments.
"""

import sys

from ray_resilience.examples.train_llama import main

if __name__ == "__main__":
    sys.exit(main())
