"""A broken plug-in: it registers a method under a name fedhet already has."""

from fedhet.core.registry import Method

METHOD = Method("fedavg")
