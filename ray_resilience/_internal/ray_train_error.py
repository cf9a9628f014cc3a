"""`fit()`'s failure as Ray Train's exception too, so a ported driver's
`except ray.train.TrainingFailedError` still catches it. Imported only once the driver itself
imported `ray.train` (it is slow to import)."""

from __future__ import annotations

import ray.train

from ray_resilience.errors import TrainingFailedError


class RayTrainingFailedError(TrainingFailedError, ray.train.TrainingFailedError):
    """A `ray_resilience.errors.TrainingFailedError` that is also a
    `ray.train.TrainingFailedError`."""
