"""diagnose: events -> a verdict.

In: every file's events and summaries. Out: a `Verdict` (the first failing rank or none, the cause, confidence,
the votes behind it). Stages: `resolve` gives each event its global rank and host; `engine` refines events
(teardown kills, cut lines); `timeline` builds each rank's story; `producers` turn it into weighted votes; one
`combiner` weighs them.
"""
