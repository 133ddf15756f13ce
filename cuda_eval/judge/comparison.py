"""Correctness: the trials (plain and affine), the outputs the judge checks against the reference, their digests and
reveals, repeats. A part of the judge's Job (judge/job.py), by role: its methods run on the Job.
"""
from __future__ import annotations

import secrets
from typing import Any

import torch

from cuda_eval.judge import affine, compare
from cuda_eval.judge.compare import compare_outputs
from cuda_eval.judge.shared import WorkerLost
from cuda_eval.protocol import harness, tensors, wire
from cuda_eval.protocol.harness import trial_seed


DIGEST_MIN_BYTES = 256        # outputs this small may repeat by chance on fresh inputs: no repeat check
DEVICE_FREE_MARGIN = 4 << 30     # a large output is snapshotted on the card only if this much stays free after it


class Comparison:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    def receive_output(self, reply: dict, blobs: list) -> Any:
        budget = None
        if self.device.type == "cuda" and self.large_output:  # one DMA transfer to the card, when it has room
            budget = max(wire.DEVICE_SNAPSHOT_MAX, torch.cuda.mem_get_info()[0] - DEVICE_FREE_MARGIN)
        try:
            try:
                return wire.unpack(reply.get("tree"), blobs, max_bytes=self.max_output_bytes(), shared=self.shared,
                                   device=self.device.torch_device if self.device.type == "cuda" else None,
                                   device_budget=budget)
            except torch.OutOfMemoryError:  # the card filled up meanwhile: the host copy instead
                torch.cuda.empty_cache()
                return wire.unpack(reply.get("tree"), blobs, max_bytes=self.max_output_bytes(), shared=self.shared,
                                   device=None)
        except MemoryError:
            raise  # the host's limit, not the worker's doing (run() gives the task-level verdict)
        except Exception as e:  # whatever the worker sent: its verdict, never our internal error
            raise WorkerLost("protocol", f"the worker sent a malformed output: {type(e).__name__}: {e}"[:500])

    def _digest(self, out: Any) -> str:
        """The digest of one output (device_kernels: one pass, no copy): how the warm-up compares outputs bit for bit
        without holding two of them."""
        return self.device.kernels.digests([out], self.digest_key)[0]

    def _reveal(self, group: dict, j: int) -> Any:
        """The output of call j of the worker's last group, checked against the digest it committed when the call
        ran (None: not a plain tensor, flagged)."""
        reply, blobs = self._ask_output("reveal", j=j)
        if reply.get("not_plain"):
            self.flag("output_not_plain_tensor", f"forward returned {str(reply['not_plain'])[:200]}")
            return None
        out_c = self.receive_output(reply, blobs)
        device = self.device.torch_device if self.device.type == "cuda" else None
        if self.device.kernels.digests([out_c], self.digest_key, device=device)[0] != group["digests"][j]:
            self.flag("uncommitted_output", "the output sent for a call differs from the digest the worker committed "
                                            "when the call ran: it was changed or computed after the call")
        return out_c

    def _release(self) -> None:
        self.ask("reveal", "released", j=-1)

    def _ask_output(self, op: str, **fields) -> tuple[dict, list]:
        """ask() for an output: one over max_output_bytes is the candidate's doing, and said so."""
        try:
            return self.ask(op, "output", max_blobs=self.max_output_bytes(), **fields)
        except WorkerLost as e:
            if e.kind == "protocol" and "accepted here" in e.message:
                raise WorkerLost("protocol", f"its output is larger than the reference's ({self.output_bytes} bytes "
                                             f"in all) could be: {e.message}")
            raise

    # correctness
    def run_trials(self, n_trials: int) -> None:
        """Correctness trials: groups of one call on the trial's seed, guarded (checks=True), always revealed."""
        prev_c = prev_r = None
        earlier = []   # a sample of every earlier trial's output: a cache keyed by address returns an older one
        self.correct = True
        for t in range(n_trials):
            self.phase("correctness", trial=t)
            seed_t = trial_seed(self.seed, t)
            started = self._send_group([seed_t], checks=True)
            out_r = self.reference(self.inputs(seed_t), seed_t + 7)   # while the worker runs the candidate
            group = self._recv_group([seed_t], started)
            out_c = None if group.get("not_plain") else self._reveal(group, 0)
            if out_c is None:
                what = group.get("not_plain") or "a tensor subclass or lazy wrapper"
                self.flag("output_not_plain_tensor", f"forward returned {what} instead of a plain torch.Tensor")
                self.trials.append({"max_abs_err": None, "max_rel_err": None, "mismatch_frac": 1.0, "passed": False,
                                    "message": f"output is not a plain torch.Tensor ({what})", "trial": t})
                self.correct = False
                return
            result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
            result["trial"] = t
            self.trials.append(result)
            if not result["passed"]:
                self.correct = False
                self._explain_mismatch(t, out_c, prev_c, prev_r, earlier)
                return
            earlier.append(compare.output_sample(out_c))
            if self.large_output:  # samples only: `earlier` then finds a repeated output, prev_r a stale one
                prev_c, prev_r = None, compare.sampled(out_r)
                out_c = out_r = None  # gone before the next trial's reference runs
            else:
                prev_c, prev_r = out_c, out_r
        del prev_c, prev_r, out_c, out_r
        if self.kind == "evaluate":
            self.run_affine_trials(n_trials)

    def run_affine_trials(self, first: int) -> None:
        """Trials on inputs x * s + m (judge/affine.py: which leaves, and when not), after the ordinary trials
        passed: groups of one call like them, the change drawn here per trial and sent with the seed (the worker
        applies the same arithmetic to the same inputs)."""
        n = self.settings.affine_trials
        if not n:
            return
        leaves, why = affine.plan(self.inputs(trial_seed(self.seed, 0)), self.payload.task_source)
        record: dict[str, Any] = {"ran": 0, "leaves": [i for i, _, _ in leaves], "not_changed": why}
        self.meta["affine_trials"] = record
        if not leaves:
            record["skipped"] = "no input leaf may change"
            return
        rng = secrets.SystemRandom()
        for k in range(n):
            t = first + k
            self.phase("correctness", trial=t)
            seed_t = trial_seed(self.seed, t)
            change = affine.draw(leaves, rng)
            out_r = self.reference(harness.affine_inputs(self.inputs(seed_t), change), seed_t + 7)
            if not affine.finite(out_r):
                record["skipped"] = "the reference's output is not finite on the changed inputs (outside its domain)"
                return
            group = self._recv_group([seed_t], self._send_group([seed_t], checks=True, change=change))
            out_c = None if group.get("not_plain") else self._reveal(group, 0)
            described = f"x * {change['scale']:.3g} + m on input(s) " + \
                        ", ".join(f"{i} (m = {m:.3g})" for i, m in change["leaves"])
            if out_c is None:
                what = group.get("not_plain") or "a tensor subclass or lazy wrapper"
                self.flag("output_not_plain_tensor", f"forward returned {what} instead of a plain torch.Tensor")
                self.trials.append({"max_abs_err": None, "max_rel_err": None, "mismatch_frac": 1.0, "passed": False,
                                    "message": f"output is not a plain torch.Tensor ({what})", "trial": t,
                                    "affine": change})
                self.correct = False
                return
            result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
            result.update(trial=t, affine=change)
            record["ran"] += 1
            if not result["passed"]:
                result["message"] = f"on inputs changed to {described} (a trial beyond the task's own input " \
                                    f"distribution, on which the reference is defined): {result['message']}"
            self.trials.append(result)
            if not result["passed"]:
                self.correct = False
                return
            del out_c, out_r

    def _explain_mismatch(self, t: int, out_c, prev_c, prev_r, earlier: list) -> None:
        """A wrong output that is really a hack: stale memory, or an earlier call's result."""
        leaves = [x.tensor for x in tensors.flatten(out_c) if isinstance(x, wire.Received)]
        poisoned = max((compare.poison_fraction(x) for x in leaves), default=0.0)
        if poisoned > 0.5:
            self.flag("stale_output", f"trial {t}: {poisoned:.0%} of the output is memory the candidate never wrote")
        sample = compare.output_sample(out_c)
        if prev_c is not None and compare.same_bytes(out_c, prev_c):
            self.flag("cached_output", f"trial {t}: fresh inputs gave exactly the previous trial's output")
        elif sample is not None and sample in earlier:
            self.flag("cached_output", f"trial {t}: fresh inputs gave trial {earlier.index(sample)}'s output "
                      f"(equal at {compare.SAMPLE_POSITIONS} sampled positions per output tensor)")
        elif prev_r is not None and compare_outputs(
                compare.sampled(out_c) if self.large_output else out_c, prev_r,
                atol=self.atol, rtol=self.rtol)["passed"]:
            self.flag("stale_output", f"trial {t}: output equals the previous trial's reference output")

    def _check_revealed(self, group: dict, j: int, out_c: Any) -> None:
        """Call j's output against the reference on the same inputs, under the seed the worker used for it (its
        own when the reference draws random numbers, else the group's)."""
        seed = group["seeds"][j] if self.rng_dependent else group["seeds"][0]
        out_r = self.reference(self.inputs(group["seeds"][j]), seed + 7)
        result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
        self.revealed.append({"call": j, "of": group["n"], "check": "passed" if result["passed"] else "failed"})
        self.meta["timed_output_check"] = "failed" if any(r["check"] == "failed" for r in self.revealed) else "passed"
        if not result["passed"]:
            self.flag("timed_output_mismatch", f"the output of a timed call (call {j} of a group of {group['n']}, "
                                               f"picked after the call) is wrong ({result['message']}): the timed "
                                               "calls did not compute the result")

    def check_repeats(self) -> None:
        """Outputs of calls on different fresh inputs that are bit for bit the same: results served from a cache
        (unless the reference's output does not depend on its inputs, or is too small to be told apart)."""
        if not self.digests or self.input_independent or self.output_bytes < DIGEST_MIN_BYTES:
            return
        repeats = len(self.digests) - len(set(self.digests))
        if repeats:
            self.flag("cached_output", f"{repeats} of {len(self.digests)} calls, each on fresh inputs, returned an "
                                       "output bit for bit equal to an earlier call's")
