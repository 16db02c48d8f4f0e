"""The scanner's compiled bulk path, where it was built: the extension module `_bulk` (C, `_bulk.c`, compiled by
the build hook, hatch_build.py), else None, and the pure-Python path is taken. `DDPSLURM_PURE_SCAN=1` asks for the
pure path anyway (the differential test runs both). What `_bulk` does, each beside its pure twin, the reference:

- `newlines(buf, start, end)`: `buf.count(b"\\n", start, end)` (read/line_count.py);
- `shape(raw)`: a line's digits as 0, each date's century kept (parse/line_recipes.py `masked_shape`);
- `channel_key(buf, start, end)`: the key of NCCL's channel line there (parse/channel_lines.py `line_channel_key`);
- `next_line(...)`: a block's next candidate line to read in Python, the told channel lines and plainly inert
  shapes passed over (parse/file_scan.py `_scan_block`, whose pure loop is the reference).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("DDPSLURM_PURE_SCAN", "") not in ("", "0"):
        return None
    try:
        from ddpslurm.analyze.read import _bulk
    except ImportError:  # not built (no compiler where it was installed), or built for another interpreter
        return None
    return _bulk


#: the compiled module, or None: the pure path
BULK: ModuleType | None = _load()
