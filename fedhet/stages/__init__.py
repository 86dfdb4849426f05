"""Stage runners; importing this package registers them in `fedhet.pipeline.STAGES`."""

from fedhet.stages import entk, partition, pseudo, regress, train, virtual  # noqa: F401
