"""Every option of a triage run, and its default, written once.

`triage run`, `triage issue` and `triage sweep` build one `Settings` from their flags
(`cli._settings`; the flags' defaults are read from here), and it reaches every stage as it
is: the sweep ships it through Ray unchanged, and a stage that runs arms differently (the
ablations, the reported arm's model, the minimal script's verification) derives its own with
`dataclasses.replace`, so an option added here is carried everywhere unless a stage says
otherwise.  Plain data only (no torch, no numpy): the CLI and the sweep's driver import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1 << 30


@dataclass(frozen=True)
class RunSettings:
    """How each arm runs the script (`triage.arms.run`)."""

    timeout_s: float = 300.0
    memory_bytes: int | None = None  # per arm; None: a share of this machine's memory
    output_bytes: int = 256 * 1024
    seed: int = 0
    reference: bool = True
    reference_budget_s: float = 120.0
    value_budget_bytes: int = 64 << 20
    max_leaf_bytes: int = 1 << 30
    jobs: int | None = None
    collect_env_timeout_s: float = 30.0
    cache_dir: str | None = None
    keep_dirs: bool = False
    export_graphs: bool = True  # eager arms write their op graph for the minimizer
    # Simulated rounding (triage/worker/rounding.py): K random replays of each observed value's
    # graph; 0 switches it off. It needs the float64 reference.
    rounding_samples: int = 29
    rounding_budget_s: float = 60.0
    # Judge the values as this device would round them ("cuda": a reporter's GPU, modelled on
    # the CPU arm that runs the same program; triage/reported/), None: the arm's own device.
    rounding_model: str | None = None
    # "auto": the namespace sandbox where this machine has it, else the process sandbox
    # (which the report names); "namespace" or "process" insist.
    isolation: str = "auto"
    # The script's sys.argv[1:] in every arm (`triage run SCRIPT -- ARGS`): data, never parsed
    # by a shell. Runs of triage's own minimal script leave them out.
    script_args: tuple[str, ...] = ()
    # The triage run's one compile cache (inductor, triton): the arms of the reporter's script,
    # its ablations, the minimizer's workers and the minimal script's verification all use it.
    # None: the script's own (sandbox/caches.py); never one shared across different scripts.
    compile_cache: str | None = None
    # Arms on another torch release (`cpu/compile@2.15.0`) run their worker with that release's
    # interpreter: release -> python, from sandbox/torch_envs.py (prepared before the run).
    interpreters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AblationSettings:
    """Which switches are tried (`triage.ablate`)."""

    enabled: bool = True
    budget_s: float = 120.0
    # False: stop at the first switch that explains the divergence (the sides agree inside
    # their rounding spreads); the verdict rests on that one.  True: try every switch.
    exhaustive: bool = False


@dataclass(frozen=True)
class MinimizeSettings:
    """How far the minimizer reduces a divergence (`triage.minimize`)."""

    enabled: bool = True
    budget_s: float = 900.0  # for the reduction passes; the best op set so far is kept
    reduce_data: bool = True  # False: the minimal script's inputs are the recorded values, exactly
    data_budget_s: float = 180.0  # for the data passes; the smallest inputs so far are kept
    query_timeout_s: float = 180.0
    memory_bytes: int = 8 * GiB
    directory: str | None = None  # where minimal.py (and its inputs file) are written


@dataclass(frozen=True)
class Settings:
    """One triage run's options: the arms', the ablations' and the minimizer's."""

    run: RunSettings = field(default_factory=RunSettings)
    ablation: AblationSettings = field(default_factory=AblationSettings)
    minimize: MinimizeSettings = field(default_factory=MinimizeSettings)
