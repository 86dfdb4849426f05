"""Stage runners; importing this package registers them in `fedhet.pipeline.STAGES`."""

from fedhet.stages import partition, train  # noqa: F401
