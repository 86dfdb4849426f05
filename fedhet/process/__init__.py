"""Utilities of the running process, below everything else: signals as an exception, a lock
file that works across machines, heap settings, available memory. Imports nothing of fedhet."""
