"""Reports: paper-style tables, plots and evaluation of stored runs."""
