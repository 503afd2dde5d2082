"""Launch knobs (kernels/tuning.py): defaults, overrides, and refusals that protect normal runs."""

import pytest

from kdadbg_kernels.tuning import knob


def test_default_without_override(monkeypatch):
    monkeypatch.delenv("KDADBG_REC_BV", raising=False)
    assert knob("REC_BV", 16) == 16


def test_environment_overrides_the_default(monkeypatch):
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    assert knob("REC_BV", 16) == 32


def test_non_integer_override_names_the_variable(monkeypatch):
    monkeypatch.setenv("KDADBG_REC_BV", "wide")
    with pytest.raises(ValueError, match="KDADBG_REC_BV: expected an integer, found 'wide'"):
        knob("REC_BV", 16)


def test_ablation_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv("KDADBG_ALLOW_ABLATE", raising=False)
    monkeypatch.setenv("KDADBG_PREP_ABLATE", "4")
    with pytest.raises(ValueError, match="timing only"):
        knob("PREP_ABLATE", 0)
    monkeypatch.setenv("KDADBG_ALLOW_ABLATE", "1")
    assert knob("PREP_ABLATE", 0) == 4
    monkeypatch.setenv("KDADBG_PREP_ABLATE", "0")
    monkeypatch.delenv("KDADBG_ALLOW_ABLATE")
    assert knob("PREP_ABLATE", 0) == 0
