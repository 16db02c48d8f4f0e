"""Render the standalone sbatch templates (`ddpslurm template`), and keep `sbatch_templates/` as their golden output.

Each template has ONE source, `ddpslurm/template_sources/<name>.sbatch.in`. Placeholders are
`@@NAME@@` (upper case, digits, underscores): `@@` never occurs in the shell the sources contain, so
a placeholder cannot be mistaken for shell syntax and no shell syntax is ever substituted.
`@@BLOCK_X@@` inserts the shared snippet `_x.in` (rendered with the same values), so the NCCL
settings and the failure list exist once for all templates.

Every value is validated against the parameter table (`PARAMS`) before it reaches a script: numbers
have a minimum, names a conservative regex, paths are shell-quoted; anything else is a one-line
`TemplateError` that names the option and a valid example.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpslurm.errors import TemplateError, UsageError
from ddpslurm.launch.spec import SIGNAL_RESOLUTION_S, signal_delay_fix
from ddpslurm.sbatch_values import check_sbatch_value, parse_time


class TemplateUsageError(TemplateError, UsageError):
    """A template name, option or value that is wrong on the command line: exit 2, as every usage error."""

    exit_code = 2


SOURCE_DIR = Path(__file__).resolve().parent / "template_sources"
GOLDEN_SUFFIX = ".sbatch"
PLACEHOLDER = re.compile(r"@@([A-Z][A-Z0-9_]*)@@")

Value = int | str | tuple[str, ...]

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_IFACE = r"[A-Za-z0-9_.-]+"


@dataclass(frozen=True)
class Param:
    """One template parameter: its option name, type, and what a valid value looks like."""

    name: str
    help: str
    kind: type = str
    minimum: int | None = None
    pattern: str | None = None
    example: str = ""
    optional: bool = False  # "" is allowed and means "leave the #SBATCH line switched off"

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("nodes", "number of nodes", int, minimum=1, example="2"),
    Param("gpus_per_node", "GPUs per node (one rank each); 0 renders without a GPU request", int, minimum=0,
          example="4"),
    Param("tasks_per_node", "processes per node when no GPUs are used", int, minimum=1, example="2"),
    Param("cpus_per_task", "CPU cores per process", int, minimum=1, example="8"),
    Param("time", "wall-clock limit in a Slurm time format", example="04:00:00"),
    Param("partition", "partition(s), comma separated", pattern=rf"{_NAME}(,{_NAME})*", example="gpu",
          optional=True),
    Param("account", "account to charge", pattern=_NAME, example="proj123", optional=True),
    Param("qos", "quality of service", pattern=_NAME, example="normal", optional=True),
    Param("mem", "memory per node (0 = all of it)", pattern=r"\d+[KMGT]?", example="64G", optional=True),
    Param("job_name", "job name", pattern=_NAME, example="ddp-train"),
    Param("max_requeues", "how many times the job may requeue itself", int, minimum=0, example="3"),
    Param("signal_delay", "seconds before the time limit that Slurm sends USR2", int, minimum=10, example="90"),
    Param("array", "job-array index spec", pattern=r"\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*(%\d+)?",
          example="0-7%2"),
    Param("script", "your training script", example="train.py"),
    Param("python", "Python interpreter", example="python3"),
    Param("log_dir", "folder for the per-job log folders", example="logs"),
    Param("checkpoint_dir", "folder for the per-job checkpoint folders", example="checkpoints"),
    Param("nccl_socket_ifname", "NCCL_SOCKET_IFNAME (bootstrap interface; '' = NCCL's own choice)",
          pattern=rf"\^?=?{_IFACE}(,{_IFACE})*", example="ib0", optional=True),
    Param("nccl_ib_hca", "NCCL_IB_HCA (InfiniBand adapters; '' = every active one)",
          pattern=rf"\^?=?{_IFACE}(:\d+)?(,{_IFACE}(:\d+)?)*", example="mlx5", optional=True),
    Param("gloo_socket_ifname", "GLOO_SOCKET_IFNAME ('' = let gloo pick the hostname's interface)",
          pattern=rf"{_IFACE}(,{_IFACE})*", example="eth0", optional=True),
)}

#: text parameters that become `#SBATCH --<option>=` lines -> that sbatch option
SBATCH_OPTIONS = {"time": "time", "partition": "partition", "account": "account", "qos": "qos", "mem": "mem",
                  "job_name": "job-name", "array": "array"}

_GPU = ("gpus_per_node", "nccl_socket_ifname", "nccl_ib_hca")
_COMMON = ("cpus_per_task", "time", "partition", "account", "qos", "mem", "job_name", "script", "python", "log_dir")
_BASE_DEFAULTS: dict[str, Value] = {
    "nodes": 2, "gpus_per_node": 4, "tasks_per_node": 2, "cpus_per_task": 8, "time": "01:00:00",
    "partition": "", "account": "", "qos": "", "mem": "", "max_requeues": 3, "signal_delay": 90,
    "array": "0-2", "script": "train.py", "python": "python3", "log_dir": "logs", "checkpoint_dir": "checkpoints",
    "nccl_socket_ifname": "", "nccl_ib_hca": "", "gloo_socket_ifname": "",
}


@dataclass(frozen=True)
class Template:
    """A template: its name, a one-line description, the parameters it takes and its own defaults."""

    name: str
    description: str
    params: tuple[str, ...]
    defaults: Mapping[str, Value] = field(default_factory=dict)

    @property
    def source(self) -> Path:
        return SOURCE_DIR / f"{self.name}.sbatch.in"

    def default(self, param: str) -> Value:
        if param == "job_name":
            return self.defaults.get("job_name", f"ddp-{self.name}")
        return self.defaults.get(param, _BASE_DEFAULTS[param])


TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("srun-gpu", "multi-node DDP, one srun task per GPU (rank = SLURM_PROCID), NCCL over InfiniBand",
             ("nodes", "tasks_per_node", *_GPU, *_COMMON)),
    Template("srun-cpu", "multi-node DDP on CPUs with gloo, one srun task per process (rank = SLURM_PROCID)",
             ("nodes", "tasks_per_node", "gloo_socket_ifname", *_COMMON), {"cpus_per_task": 4}),
    Template("torchrun-gpu", "multi-node DDP, one srun task per node running torchrun, NCCL over InfiniBand",
             ("nodes", "tasks_per_node", *_GPU, *_COMMON), {"cpus_per_task": 32}),  # one task per node: all cores
    Template("torchrun-cpu", "multi-node DDP on CPUs with gloo, one srun task per node running torchrun",
             ("nodes", "tasks_per_node", "gloo_socket_ifname", *_COMMON), {"cpus_per_task": 4}),
    Template("requeue", "one task per GPU that checkpoints on USR2 (preemption, time limit) and requeues itself",
             ("nodes", "tasks_per_node", "max_requeues", "signal_delay", "checkpoint_dir", *_GPU, *_COMMON)),
    Template("sweep", "job-array hyper-parameter sweep, one DDP run per array task, ports that never collide",
             ("nodes", "tasks_per_node", "array", *_GPU, *_COMMON), {"nodes": 1}),
    Template("standalone", "single-node multi-GPU job with torchrun --standalone (no ports to choose)",
             ("tasks_per_node", *_GPU, *_COMMON), {"cpus_per_task": 32}),
)}


def list_templates() -> list[tuple[str, str]]:
    """(name, one-line description) of every template, in a stable order."""
    return [(t.name, t.description) for t in TEMPLATES.values()]


def get_template(name: str) -> Template:
    """The template called `name`, or a TemplateError that lists the known ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise TemplateUsageError(f"no template named {name!r}",
                                 f"Choose one of: {', '.join(TEMPLATES)} (`ddpslurm template --list`)") from None


def slurm_time_seconds(text: str) -> int:
    """Seconds in a Slurm time limit as sbatch takes it (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; the fields after
    the first within their clock ranges), the parser `submit` and `doctor` share."""
    return parse_time(text, TemplateUsageError)


def validate(param: str, value: object) -> Value:
    """The checked value for `param`, or a one-line TemplateError with the option and an example."""
    spec = PARAMS[param]
    fix = f"For example: {spec.option} {spec.example}"
    if spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TemplateUsageError(f"{spec.option} must be a whole number, got {value!r}", fix)
        try:
            number = int(value)
        except ValueError:
            raise TemplateUsageError(f"{spec.option} must be a whole number, got {value!r}", fix) from None
        if spec.minimum is not None and number < spec.minimum:
            raise TemplateUsageError(f"{spec.option} must be at least {spec.minimum}, got {number}", fix)
        return number
    if not isinstance(value, str):
        raise TemplateUsageError(f"{spec.option} must be text, got {value!r}", fix)
    if value == "" and spec.optional:
        return value
    if param == "time":
        slurm_time_seconds(value)
    elif spec.pattern is not None and not re.fullmatch(spec.pattern, value):
        raise TemplateUsageError(f"{spec.option} {value!r} is not allowed in a template (letters, digits, "
                                 "'_', '.', '-' in the usual format only, so that nothing can inject shell)", fix)
    if param in SBATCH_OPTIONS:  # then the check shared with `submit`: an ASCII token in the option's sbatch syntax
        return check_sbatch_value(SBATCH_OPTIONS[param], value, TemplateError, spec.option)
    if spec.pattern is not None:
        return value
    # Free text (paths): shell-quoted when rendered; still no control character (C0, C1, bidi, line separators:
    # the script is printed to a terminal and its comments must stay comments), and no '%' because
    # srun would expand it in the --output patterns that contain the log folder.
    if not value or not value.isprintable() or (param.endswith("_dir") and "%" in value):
        raise TemplateUsageError(f"{spec.option} {value!r} is not a usable path (empty, a control character or '%')",
                                 fix)
    return value


def resolve(template: Template, overrides: Mapping[str, object]) -> dict[str, Value]:
    """The template's defaults with `overrides` applied, every value validated."""
    unknown = [p for p in overrides if p not in template.params]
    if unknown:
        options = ", ".join(PARAMS[p].option if p in PARAMS else p for p in unknown)
        raise TemplateUsageError(f"template {template.name!r} does not take {options}",
                                 f"It takes: {', '.join(PARAMS[p].option for p in template.params)}")
    values = {p: validate(p, overrides.get(p, template.default(p))) for p in template.params}
    limit = slurm_time_seconds(str(values["time"]))
    delay = values.get("signal_delay")
    if isinstance(delay, int) and delay + SIGNAL_RESOLUTION_S >= limit:
        raise TemplateUsageError(
            f"--signal-delay {delay} leaves no time to train within --time {values['time']} ({limit}s): Slurm may "
            f"send the signal up to {SIGNAL_RESOLUTION_S}s earlier than asked, i.e. as the job starts",
            signal_delay_fix(delay, limit))
    return values


def _directive(option: str, value: Value, placeholder: str) -> str:
    """`#SBATCH --option=value`, or the same switched off (`##SBATCH`) when no value is set."""
    if value == "":
        return f"##SBATCH --{option}={placeholder}"
    return f"#SBATCH --{option}={value}"


def rerender_command(template: Template, values: Mapping[str, Value], train_args: Sequence[str]) -> str:
    """The `ddpslurm template ...` command line that renders exactly this script."""
    argv = ["ddpslurm", "template", template.name]
    for param in template.params:
        if param == "tasks_per_node" and int(values.get("gpus_per_node", 0)) > 0:
            continue  # one rank per GPU: the value does not matter
        if values[param] != "" or PARAMS[param].kind is int:
            argv += [PARAMS[param].option, str(values[param])]
    if train_args:
        argv += ["--", *train_args]
    return shlex.join(argv)


def placeholders(template: Template, values: Mapping[str, Value], train_args: Sequence[str]) -> dict[str, str]:
    """Every placeholder's text for this template and these (validated) values."""
    gpus = int(values.get("gpus_per_node", 0))
    per_node = gpus if gpus > 0 else int(values["tasks_per_node"])
    text = {
        "TEMPLATE": template.name,
        "DESCRIPTION": template.description,
        "RERENDER": rerender_command(template, values, train_args),
        "TASKS_PER_NODE": str(per_node),
        "GPU_DIRECTIVE": (f"#SBATCH --gpus-per-node={gpus}" if gpus > 0
                          else "##SBATCH --gpus-per-node=N  (rendered with --gpus-per-node 0: no GPU requested)"),
        "PARTITION_DIRECTIVE": _directive("partition", values["partition"], "PARTITION"),
        "ACCOUNT_DIRECTIVE": _directive("account", values["account"], "ACCOUNT"),
        "QOS_DIRECTIVE": _directive("qos", values["qos"], "QOS"),
        "MEM_DIRECTIVE": _directive("mem", values["mem"], "64G"),
        "TRAIN_SCRIPT": shlex.quote(str(values["script"])),
        "PYTHON": shlex.quote(str(values["python"])),
        "LOG_ROOT": shlex.quote(str(values["log_dir"])),
        "CKPT_ROOT": shlex.quote(str(values["checkpoint_dir"])) if "checkpoint_dir" in values else "",
        "TRAIN_ARGS": " ".join(shlex.quote(arg) for arg in train_args),
    }
    if "gloo_socket_ifname" in values:
        ifname = values["gloo_socket_ifname"]
        text["GLOO_IFNAME_LINE"] = (f"export GLOO_SOCKET_IFNAME='{ifname}'" if ifname
                                    else "# export GLOO_SOCKET_IFNAME=eth0")
    for param, example in (("nccl_socket_ifname", "ib0"), ("nccl_ib_hca", "mlx5")):
        if param in values:  # validated to [A-Za-z0-9_.:,^=-]: single quotes are enough, and keep "=" literal
            name = param.upper()
            text[f"{name}_LINE"] = (f"export {name}='{values[param]}'" if values[param]
                                    else f"# export {name}={example}  (set with {PARAMS[param].option})")
    for param, value in values.items():
        if param not in ("partition", "account", "qos", "mem", "script", "python", "log_dir", "checkpoint_dir",
                         "gloo_socket_ifname", "nccl_socket_ifname", "nccl_ib_hca"):
            text.setdefault(param.upper(), shlex.quote(str(value)))
    return text


def substitute(source: str, text: Mapping[str, str], blocks: Mapping[str, str] | None = None, depth: int = 0) -> str:
    """Replace every `@@NAME@@` in `source`; an unknown name is an error, never left in the output.

    Blocks may use blocks, up to a few levels (a block that includes itself is an error, not a loop).
    """
    blocks = blocks or {}
    if depth > 4:
        raise TemplateError("template blocks nest too deep (a block includes itself?)",
                            "Fix the sources in ddpslurm/template_sources/")

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("BLOCK_") and name in blocks:
            return substitute(blocks[name], text, blocks, depth + 1)
        if name in text:
            return text[name]
        raise TemplateError(f"template source uses the unknown placeholder @@{name}@@",
                            "Fix the source in ddpslurm/template_sources/ or add the value in templates.py")

    return PLACEHOLDER.sub(one, source)


def _blocks() -> dict[str, str]:
    return {"BLOCK_" + p.stem.lstrip("_").upper(): p.read_text(encoding="utf-8").rstrip("\n")
            for p in sorted(SOURCE_DIR.glob("_*.in"))}


def render(name: str, overrides: Mapping[str, object] | None = None, train_args: Iterable[str] = ()) -> str:
    """The sbatch script `name` filled with the defaults and `overrides` (a TemplateError on bad values)."""
    template = get_template(name)
    args = tuple(train_args)
    for arg in args:
        if not arg.isprintable():  # a newline would leave the RERENDER comment; C1/bidi would reach the terminal
            raise TemplateUsageError(f"training argument {arg!r} contains a newline or a control character",
                                     "Pass it on one line, in printable characters")
    values = resolve(template, dict(overrides or {}))
    return substitute(template.source.read_text(encoding="utf-8"), placeholders(template, values, args), _blocks())


def golden_name(name: str) -> str:
    """File name of a template's golden output in `sbatch_templates/`."""
    return f"{name}{GOLDEN_SUFFIX}"


def write_golden(folder: Path) -> list[Path]:
    """Render every template with its defaults into `folder` (what `ddpslurm template --regenerate` does)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TEMPLATES:
        path = folder / golden_name(name)
        path.write_text(render(name), encoding="utf-8")
        written.append(path)
    return written


def golden_folder() -> Path:
    """`sbatch_templates/` of a source checkout (regenerating into an installed wheel is refused)."""
    from ddpslurm._data import data_dir

    folder = data_dir("sbatch_templates")
    if "_data" in folder.parts:
        raise TemplateError("the golden templates of an installed ddpslurm cannot be regenerated",
                            "Run `ddpslurm template --regenerate` from a source checkout (pip install -e .)")
    return folder
