"""Running the runs of a spec: planning them once, the scheduler over their stage DAG, where
its nodes are computed (in order in this process, local worker processes, Ray tasks), and the
one entry point every mode of `fedhet train` goes through (fedhet.execution.train)."""
