"""Stage runners; importing this package registers them in `fedhet.pipeline.STAGES`."""

from fedhet.stages import partition, pseudo, train  # noqa: F401
from fedhet.stages import entk, regress  # noqa: F401
from fedhet.stages import virtual  # noqa: F401
