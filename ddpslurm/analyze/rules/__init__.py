"""rules: the analyzer's knowledge, loaded from TOML and compiled once.

In: `analyzer/signatures/*.toml`, `analyzer/causes.toml` and any site folders. Out: a `SignatureSet` (each
signature's compiled pattern, cause, role and advice; the prefilter's anchors; which patterns are blind to digits)
and the cause table. A bad file is an `AnalyzeInputError` that names the file and the signature.
"""
