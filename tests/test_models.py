"""The SPIN models of models/: every property of every model verifies, and every mutant is caught.

Each run is ``models/check.py``'s: ``spin -a``, gcc, ``./pan`` in a temporary
directory, exhaustive. A property run must end with 0 errors, a search not
cut short and at least ``MIN_STATES`` states; a mutant run (a bug put back,
or an assumption dropped) must end with an error of the expected kind and a
trail. Skipped, saying why, where spin or gcc is not installed
(``tests/run.sh`` installs both).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MODELS = Path(__file__).resolve().parent.parent / "models"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("models_check", MODELS / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


check = _load()
# (the searches are the suite's heaviest CPU; the tests beside them that wait on timers go first)
check.NICENESS = 10
missing = check.tools()
needs_spin = pytest.mark.skipif(missing is not None, reason=f"the SPIN models need spin and gcc ({missing})")

PROPERTIES = [(model, prop) for model in check.MODELS for prop in model.properties]
MUTANTS = [(model, mutant) for model in check.MODELS for mutant in model.mutants]


def _tail(output: str) -> str:
    return "\n".join(output.splitlines()[-25:])


@needs_spin
@pytest.mark.parametrize(("model", "prop"), PROPERTIES, ids=[f"{m.name}-{p.name}" for m, p in PROPERTIES])
def test_every_property_of_every_model_verifies(model: Any, prop: Any, tmp_path: Path) -> None:
    result = check.run(model, prop, workdir=tmp_path)
    failure = check.verdict(prop, result)
    assert failure is None, f"{failure}\n{_tail(result.output)}"
    assert result.errors == 0 and not result.truncated and result.states >= check.MIN_STATES


@needs_spin
@pytest.mark.parametrize(("model", "mutant"), MUTANTS, ids=[f"{m.name}-{x.define}" for m, x in MUTANTS])
def test_every_mutant_is_caught_with_a_trail(model: Any, mutant: Any, tmp_path: Path) -> None:
    result = check.run(model, model.property(mutant.caught_by), mutant, workdir=tmp_path)
    failure = check.mutant_verdict(mutant, result)
    assert failure is None, f"{failure}\n{_tail(result.output)}"
    assert result.errors >= 1 and result.trail


@needs_spin
def test_a_search_cut_short_fails_the_check(tmp_path: Path) -> None:
    """A depth limit the model outgrows: pan says so, and the run does not pass however few errors it found."""
    model = check.find("etcd_mutex")
    result = check.run(model, model.property(check.SAFETY), workdir=tmp_path, depth=50)
    assert result.truncated, result.output
    failure = check.verdict(model.property(check.SAFETY), result)
    assert failure is not None and "cut short" in failure


def test_the_catalogue_names_every_model_and_every_mutant_of_the_files() -> None:
    """A model or a mutant added to models/ is run by the suite: each .pml file is in the
    catalogue, and each switch it tests is one of its mutants (or assumptions), or its build."""
    files = {path.stem: path.read_text() for path in MODELS.glob("*.pml")}
    assert set(files) == {model.name for model in check.MODELS}
    # the liveness build, and the bounds (each overridable with -D when exploring by hand)
    builds = {"LIVENESS", "N", "ACQS", "TTL", "DRIFT", "GRANTS", "MSG_WINDOW", "CRASHES", "SESSION", "EXPIRIES"}
    builds |= {"LEASE", "TRIES", "DOWN", "LOSSES", "HOLDERS", "WRITES"}
    for model in check.MODELS:
        switches = set(re.findall(r"#\s*(?:ifn?def|elif defined|if defined)\s*\(?(\w+)", files[model.name]))
        expected = {mutant.define for mutant in model.mutants}
        assert switches - builds == expected, model.name
        assert {p.ltl for p in model.properties if p.ltl} <= set(re.findall(r"^ltl (\w+)", files[model.name], re.M))
