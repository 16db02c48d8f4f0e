"""read: the paths given to analyze -> the files to read -> byte blocks and their candidate lines.

In: paths (folders, files, pipes). Out: `SourceFile`s (discovery: every file, with what was skipped and why),
blocks of bytes cut at line ends, read ahead where the file system is slow, and the offsets of the lines that hold
one of the rules' anchors (the prefilter). Nothing here knows a log format.
"""
