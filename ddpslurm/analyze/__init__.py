"""ddpslurm analyze: the logs of a failed job -> the first failing rank, the cause, and what to do.

The stages are folders, data flowing down the list: `rules/` (TOML knowledge -> compiled signatures),
`read/` (paths -> files -> candidate lines), `parse/` (lines -> events), `diagnose/` (events -> verdict),
`report/` (verdict -> text, Markdown, JSON, HTML). `model.py` holds the types that cross stages; `api.py`
(`analyze_paths`, `find_job_folder`) is the library's entry point and `command.py` the CLI's.
"""
