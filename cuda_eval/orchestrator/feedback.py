"""The short text shown to the model after each attempt (Kevin-style: one branch per outcome).

Branches, first match wins: format error; rejected before running (static flags); compiler flags refused (the
allow-list's message); compile error (trimmed log);
runtime error (crash, timeout, exception); reference failure (not the model's fault); incorrect (which trial, max
abs/rel error, shape/dtype mismatch); correct but rejected (dynamic flags); compiled only (no GPU); correct with its
timing and speedup.

`mode="profile"` (EvalRequest.feedback, the trainer's env.feedback) adds to the correct branch a short profile of
the candidate's kernels and the reference's (kernel_profile.render_feedback: launches, GPU time per kernel, launch
configuration, registers, spills, occupancy, bytes and FLOPs over the measured time). Without a usable profile the
text is exactly the "kevin" one (`profile_unavailable` says why).
"""
from __future__ import annotations

from typing import Any

from cuda_eval.profile import kernel_profile


def _trim(text: str, limit: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: max(0, limit - 14)].rstrip() + "\n... (trimmed)"


def _flags_text(flags: list[dict]) -> str:
    return "\n".join(f"- {f['reason']}" for f in flags)


def profile_unavailable(result: Any) -> str | None:
    """Why a correct kernel's profile feedback fell back to the plain text; None when the profile is usable."""
    profile = (getattr(result, "meta", None) or {}).get("kernel_profile")
    if not isinstance(profile, dict):
        return "no profile was taken"
    if profile.get("error"):
        return str(profile["error"])[:300]
    if kernel_profile.render_feedback(profile) is None:
        return "the profile holds nothing to show"
    return None


def render(result: Any, max_chars: int = 3000, mode: str = "kevin") -> str:
    """Feedback for an EvalResult (or anything with the same attributes); `mode` "kevin" or "profile"."""
    r = result
    if not r.format_ok:
        return _trim(f"Your answer could not be evaluated: {r.format_error}. Reply with the complete program in one "
                     "```python code block that defines class ModelNew and builds its CUDA kernels with "
                     "torch.utils.cpp_extension.load_inline.", max_chars)
    if r.hack_flags and r.compiled is None and r.correct is None:
        return _trim("Your kernel was rejected without being run, for these reasons:\n" + _flags_text(r.hack_flags)
                     + "\nWrite the computation as your own CUDA kernels, called from ModelNew.forward.", max_chars)
    if r.compiled is False and (r.meta or {}).get("compile_error_kind") == "flag_rejected":
        return _trim("Your program was not compiled: it passes a compiler or linker option this evaluator does not "
                     f"allow.\n{r.compile_log}\nRemove that option (extra_cflags, extra_cuda_cflags, extra_ldflags, "
                     "extra_include_paths) or use only allowed ones.", max_chars)
    if r.compiled is False:
        return _trim("Your kernel failed to compile:\n" + (r.compile_log or "(no compiler output)"), max_chars)
    if r.meta.get("task_too_large"):
        return _trim("This task could not be judged on this machine (too large for it; not a problem of your kernel):"
                     f"\n{r.runtime_error}", max_chars)
    if r.meta.get("reference_error"):
        return _trim("The evaluation could not run the reference program (a problem of the task, not of your "
                     f"kernel):\n{r.runtime_error}", max_chars)
    if r.runtime_error:
        return _trim("Your kernel compiled but failed at run time:\n" + r.runtime_error, max_chars)
    if r.correct is False:
        failed = next((t for t in r.trials if not t.get("passed")), None)
        n = len(r.trials)
        text = "Your kernel compiled and ran, but its output is incorrect"
        if failed is not None:
            trial = failed.get("trial", n - 1)
            text += f" (trial {trial + 1}"
            total = r.meta.get("num_trials")
            text += f" of {total})" if total else ")"
            text += f": {failed.get('message') or 'outputs differ'}"
            if failed.get("max_abs_err") and "max abs err" not in (failed.get("message") or ""):
                text += (f" (max abs err {failed['max_abs_err']:.3g}, max rel err {failed['max_rel_err']:.3g}, "
                         f"{failed['mismatch_frac']:.1%} of elements mismatched)")
        text += "."
        if r.hack_flags:
            text += "\nIt was also rejected for these reasons:\n" + _flags_text(r.hack_flags)
        return _trim(text, max_chars)
    if r.hack_flags:
        return _trim("Your kernel produced correct results but was rejected (score 0) for these reasons:\n"
                     + _flags_text(r.hack_flags)
                     + "\nWrite the computation as your own CUDA kernels, called from ModelNew.forward.", max_chars)
    if r.correct is None:
        return _trim("Your kernel compiled successfully. It was not run (no GPU available in compile-only mode), "
                     "so correctness and speed are unknown.", max_chars)
    trials = len(r.trials)
    text = f"Your kernel is correct ({trials}/{trials} trials passed)"
    if r.timing and r.ref_timing and r.speedup:
        text += (f". It runs in {r.timing['median_ms']:.4g} ms versus {r.ref_timing['median_ms']:.4g} ms for the "
                 f"PyTorch reference: a speedup of {r.speedup:.2f}x.")
        if r.speedup < 1:
            text += " It is slower than the reference; make it faster."
        else:
            text += " Try to make it even faster."
    else:
        text += "."
    advisory = getattr(r, "advisory_flags", None)
    if advisory:
        text += ("\nAccepted under this evaluation's rules, but Kevin's training rules would reject it for:\n"
                 + _flags_text(advisory))
    if mode == "profile":
        budget = min(kernel_profile.FEEDBACK_PROFILE_CHARS, max_chars - len(text) - 1)
        profile = kernel_profile.render_feedback((r.meta or {}).get("kernel_profile"), budget) if budget > 80 else None
        if profile:
            text += "\n" + profile
    return _trim(text, max_chars)
