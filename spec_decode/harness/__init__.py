"""The measurement harness: alpha, step and loop costs, walltime, reports."""
