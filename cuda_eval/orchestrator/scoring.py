"""Evaluation profiles: named sets of EvalConfig fields, so that one switch scores a solution by one set of rules.

    EvalConfig(profile="kernelbench")            # or --config.eval.profile=kernelbench

- "kevin" (the default): Kevin's training rules, which the RL reward needs. No torch compute in forward, no
  try/except, the candidate's own kernels only, and every runtime hack check of this evaluator: any flag zeroes the
  score (it is listed in `EvalResult.hack_flags`).
- "kernelbench": scores a solution as KernelBench's own evaluator does at its current main
  (ScalingIntelligence/KernelBench, src/kernelbench/eval.py and kernel_static_checker.py): its default static
  rejections (a `__global__` kernel built with load_inline/cpp_extension, no try/except, no `pass`, no timing
  monkeypatches, no threads or multiprocessing, no lazy tensor subclasses), its tolerances (atol = rtol = 1e-4 for
  float32 outputs, 1e-2 for half precision), 5 correctness trials and its cuda_event timing protocol. PyTorch ops
  kept in forward (a cuDNN convolution next to a fused CUDA epilogue, standard on its leaderboards) are accepted.
  Every other check of this evaluator still runs: its flags go to `EvalResult.advisory_flags`, marked "would be
  rejected under kevin", and do not zero the score.
- "strict": Kevin's rules with tighter numerics and more paranoia: atol = rtol = 1e-4 for float32 outputs and
  native threads left running after forward flagged.

A profile sets its fields; setting one of them to another value as well is an error (a profile is a contract: a
change of it is a new profile, or profile="kevin" with the fields set by hand). The verdict records the profile in
`meta.profile`. docs/EVALUATOR.md, "Profiles", has the table.
"""
from __future__ import annotations

import dataclasses

# Flags that KernelBench's evaluator also rejects, by its static checker's default STRICT_CHECKS plus its backend
# check, or at run time (a lazy tensor subclass is its `lazy_eval` check; ours catches it on the output itself).
KERNELBENCH_REJECTS = frozenset({
    "no_cuda_kernel", "no_load_inline",            # cuda_impl
    "try_except", "pass_statement",                # code_bypass
    "monkeypatch",                                 # timing_event_patch (ours is broader: any torch/time/builtin)
    "thread",                                      # thread_injection
    "output_not_plain_tensor",                     # lazy_eval
})
ADVISORY_NOTE = "would be rejected under kevin"


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    settings: dict                       # EvalConfig field -> value
    rejects: frozenset | None = None     # flag codes that zero the score; None = every flag
    summary: str = ""

    def is_rejecting(self, code: str) -> bool:
        return self.rejects is None or code in self.rejects


PROFILES: dict[str, Profile] = {
    "kevin": Profile("kevin", {}, None, "Kevin's training rules (the RL reward): every hack flag zeroes the score"),
    "kernelbench": Profile(
        "kernelbench",
        {"static_policy": "kernelbench", "strict": True, "num_correct_trials": 5, "timing_method": "kernelbench",
         "retime_speedup_threshold": 0.0, "affine_trials": 0},
        KERNELBENCH_REJECTS,
        "KernelBench's rules: its static rejections, tolerances and timing; our other flags are advisory"),
    "strict": Profile("strict", {"strict": True, "flag_native_threads": True}, None,
                      "Kevin's rules, float32 tolerances 1e-4, lingering native threads flagged"),
}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown evaluation profile {name!r}: expected one of {sorted(PROFILES)}") from None


def apply(config, defaults: dict) -> None:
    """Sets the profile's fields on `config` (an EvalConfig being constructed; `defaults`: field -> default). A field
    the caller changed from its default to something else than the profile's value is a conflict: ValueError naming
    both."""
    profile = get(config.profile)
    for name, value in profile.settings.items():
        current, default = getattr(config, name), defaults[name]
        if current != value and current != default:
            raise ValueError(f"EvalConfig.{name}={current!r} conflicts with profile {profile.name!r}, which sets "
                             f"{name}={value!r} (use profile='kevin' and set the fields yourself)")
        setattr(config, name, value)


def split_flags(flags: list[dict], profile_name: str) -> tuple[list[dict], list[dict]]:
    """(rejecting, advisory) under a profile. Advisory flags keep their code and reason, with the note that Kevin's
    rules would reject the kernel."""
    profile = get(profile_name)
    rejecting, advisory = [], []
    for f in flags:
        if profile.is_rejecting(str(f.get("code"))):
            rejecting.append(f)
        else:
            advisory.append(dict(f, note=ADVISORY_NOTE))
    return rejecting, advisory
