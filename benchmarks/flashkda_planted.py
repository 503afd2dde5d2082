"""A planted fault for ``--impl benchmarks/flashkda_planted.py:planted`` (GPU, the patched fork build):
the state the fork's backward reads for global chunk ``CHUNK`` (``all_states``, every head) is scaled by
``1 + EPS`` before the raw backward call, and the gradients reported are that call's. ``kdadbg diff``
must name ``S`` at chunk ``CHUNK`` (fwd_recurrence) as the first divergence, with the backward taps of
that chunk after it."""

from __future__ import annotations

from kdadbg.impls import flashkda as fk

CHUNK = 5
EPS = 0.05


class _PlantedCall(fk._Call):
    def raw_backward(self):
        if self.tiles > CHUNK:
            for h in range(self.H):
                self._states[h * self.tiles + CHUNK] *= 1 + EPS
        return super().raw_backward()


class Planted(fk.FlashKDA):
    name = "flashkda-planted-S5"

    def run(self, inputs, config, *, device, taps=None):
        saved = fk._Call
        fk._Call = _PlantedCall
        try:
            run = super().run(inputs, config, device=device, taps=taps)
        finally:
            fk._Call = saved
        return run

    def _add_taps(self, run, call, inputs, config, sel):
        super()._add_taps(run, call, inputs, config, sel)
        for n in fk.GRADS:   # report the faulty call's gradients
            if n in call.raw_outputs and n in run.outputs:
                run.outputs[n] = call.raw_outputs[n].reshape(run.outputs[n].shape)
        run.notes.append(f"planted fault: all_states of chunk {CHUNK} x {1 + EPS} before the backward")


planted = Planted()
