"""What every command shares, below the workloads' commands: ``common`` (the exit-2 group, option types, the run
helpers every measuring command uses: GPU, card, default paths, replacement checks) and ``impls`` (``--impl``:
resolved, checked against the oracle, refused where the run has no such stage). Imports nothing heavy at import
time: ``mxbench --help`` stays fast."""
