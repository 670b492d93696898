"""Stage 4b, the minimizer: from the headline divergence to a verified minimal repro.

``steps``       the stage itself (`minimize_divergence`): arms, warm workers, reliability,
                localization, reduction, float64 ablations, the script, its verification
``problem``     the one abstraction, `ReductionProblem`: a recorded graph, two warm arm
                workers and the cached predicate "do the arms still diverge this way?"
``passes``      op-set reductions (truncate, ddmin, one-minimal, ...)
``data``        data reductions of the minimal op set's inputs (fewer elements, plainer values)
``localize``    per-op end-to-end and local errors
``arm_worker``  the parent's side of a warm arm worker
``standalone``  the minimal script written by arm A's worker and verified in fresh arms

The recorded op graph it reduces is `triage.arms.graph` (an arm's output, read as untrusted).
"""
from triage.minimize.steps import MinimizeResult, minimize_divergence

__all__ = ["MinimizeResult", "minimize_divergence"]
