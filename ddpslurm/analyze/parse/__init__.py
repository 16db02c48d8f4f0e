"""parse: lines -> typed events, one file at a time and in parallel across files.

In: a `SourceFile`, its candidate lines, the `SignatureSet`. Out: the file's `Event`s (failures, facts,
timeouts, exits) and its `FileSummary`. Here are the line prefixes and file names that tell who wrote a line,
timestamps, tracebacks and torchelastic blocks, ddpslurm's and torchelastic's records, stack dumps, flight-recorder
dumps, and the memoization of lines that differ only in their digits.
"""
