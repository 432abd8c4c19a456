"""The benchmark: streams, ledger, grader, notes audit, simulated reader, runner and reports."""
