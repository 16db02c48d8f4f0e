"""The scanner's compiled bulk path, where it was built: the extension module `_bulk` (C, `_bulk.c`, compiled by
the build hook, hatch_build.py), else None, and the pure-Python path is taken. `DDPSLURM_PURE_SCAN=1` asks for the
pure path anyway (the differential test runs both). What `_bulk` does, each beside its pure twin, the reference:

- `newlines(buf, start, end)`: the line ends in `buf[start:end]` (read/line_count.py `pure_newlines`);
- `control_bytes(buf)`: the control bytes `is_binary` counts (read/files.py `control_bytes`);
- `shape(raw)`: a line's digits as 0, each date's century kept (parse/line_recipes.py `masked_shape`);
- `channel_key(buf, start, end)`: the key of NCCL's channel line there (parse/channel_lines.py `line_channel_key`);
- `next_line(...)`: a block's next candidate line to read in Python, the told channel lines and plainly inert
  shapes passed over (parse/file_scan.py `_scan_block`, whose pure loop is the reference);
- `line_starts(block, size, runs)`: the prefilter's candidate lines from its automata's matches
  (read/prefilter.py `line_starts`);
- `last_lines(block, count, end, cut, window)`: a block's last lines, each cut (parse/file_summary.py `last_lines`);
- `tail_marks(lines, shown, own)`: the marks of a file's last lines' shapes and its last line's shape
  (parse/file_summary.py `line_marks` of `byte_shapes`, and `last_shown`), with `crc32(data)` (`zlib.crc32`);
- `replay(state, plan, text, lineno)`: a remembered line shape's reading replayed, its event made
  (parse/line_recipes.py `RememberedShapes.replay`, from the recipe's `compiled_plan`; `_bulk_replay.h`), once
  `replay_setup` was given what the Python path reads (new_event, the shared values' memo, the limits).
"""

from __future__ import annotations

import os
from types import ModuleType

#: a job at least this big read on the pure path without being asked to gets a note (`pure_path_note`)
BIG_JOB_FILES = 1024
BIG_JOB_BYTES = 1 << 30


def _asked_pure() -> bool:
    return os.environ.get("DDPSLURM_PURE_SCAN", "") not in ("", "0")


def _load() -> tuple[ModuleType | None, bool]:
    """The compiled module where it is there and offers the interface this file expects (`INTERFACE`, `_bulk.c`'s),
    else None; and whether a module was there but of another interface (a build left from an older source)."""
    if _asked_pure():
        return None, False
    try:
        from ddpslurm.analyze.read import _bulk
    except ImportError:  # not built (no compiler where it was installed), or built for another interpreter
        return None, False
    if getattr(_bulk, "INTERFACE", None) != INTERFACE:
        return None, True
    return _bulk, False


#: the interface of `_bulk.c` this file calls (its `INTERFACE`)
INTERFACE = 5
#: the compiled module, or None: the pure path; and whether one was found out of date
BULK, STALE = _load()


def pure_path_note(files: int, size: int, built: bool | None = None, asked: bool | None = None,
                   stale: bool | None = None) -> str | None:
    """The diagnosis's one line for a big job read on the pure-Python path because the compiled scanner is not
    built here, or was built from an older source (not when DDPSLURM_PURE_SCAN asked for it); None otherwise. Pure
    given `built`, `asked` and `stale`."""
    built = BULK is not None if built is None else built
    asked = _asked_pure() if asked is None else asked
    stale = STALE if stale is None else stale
    if built or asked or (files < BIG_JOB_FILES and size < BIG_JOB_BYTES):
        return None
    why = ("was built from an older source than this ddpslurm's" if stale else
           "was not built where it was installed (no C compiler then)")
    return (f"read on the pure-Python path ({files:,} files, {size / (1 << 20):,.0f} MB): ddpslurm's compiled scanner "
            f"{why}; for a faster analyze, reinstall it where gcc and the Python headers are (pip install "
            "--force-reinstall --no-deps /path/to/ddpslurm); the answer is the same")
