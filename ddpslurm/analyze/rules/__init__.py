"""rules: the analyzer's knowledge, loaded from TOML and compiled once.

In: `analyzer/signatures/*.toml`, `analyzer/causes.toml` and any site folders. Out: a `SignatureSet` (each
signature's compiled pattern, cause, role and advice; the prefilter's anchors; which patterns are blind to digits)
and the cause table. A bad file is an `AnalyzeInputError` that names the file and the signature. Modules: `loading`
reads and validates the files; `literals` derives prefilter literals from a pattern; `signatures` is the compiled
set and its matching; `match_cache` what the set derives and learns to match fast; `digit_shape` which patterns
cannot tell lines apart by their digits.
"""
