"""Recipes: what devices and analyzer agree on for one query (samplable-anonymous-aggregation 4.1).

A recipe names a channel, a local randomizer and every one of its parameters, the fragmentation,
the local budget (epsilon_local), the central target (epsilon_central_target, delta) and the
smallest crowd it may be released in, the query class and the data fields the query reads (what a
device verifies before answering, Sections 4.2-4.3), and how a device spreads its messages over the
K shuffler instances (instance_weights: the respondents' trust, Section II-C of
esa-privacy-revisited). Recipes are JSON files (``schemas/recipes/*.json``, documented by
``schemas/recipe.schema.json``); ``id`` is ``name@version`` and is stamped on every report.

Validation is strict and names the offending field: an unknown randomizer, parameters its
constructor refuses, or an epsilon_local that is not the randomizer's own are errors. The stated
epsilon_local may round the randomizer's up by at most 1e-6 and never down: a recipe must not
understate the local privacy loss that a device's budget is charged with.

A recipe may instead state ``"epsilon_local": "solve"`` with ``expected_crowd`` (and optionally
``solve_bound``, default the tight variation-ratio bound): on loading, epsilon_local becomes the
largest eps_l whose shuffled reports from expected_crowd respondents are
(epsilon_central_target, delta)-DP by that bound (``privacy.accounting.solve_epsilon_local``, as
the paper's tables are made, Section VII-A of esa-privacy-revisited), rounded down to a whole
micro-epsilon (the unit of device budgets, ``privacy.budget``), and it fills both
epsilon_local and the randomizer's ``epsilon``. The frozen Recipe and its JSON form state the
solved number beside expected_crowd and solve_bound; loading that form solves again and refuses
a number that is not the solver's.

``"aggregation": "prio3"`` (default ``"shuffle"``) puts the recipe in the aggregate model of
samplable-anonymous-aggregation (§3.1.2, §4.4.1): a device randomizes as always, then splits its
whole randomized report into two additive shares with a Prio3 validity proof
(``schemas.crypto.vdaf``), one sealed to each of two aggregators, and sends it as one message
through the shuffler. The VDAF type is the one the randomizer's output calls for
(:meth:`Recipe.build_vdaf`): the bit vector of a one-hot randomizer is Prio3MultihotCountVec with
1-bit entries and no weight bound (any bit pattern is a valid randomized report; only 0/1 entries
are enforced). Chaff (sealed to the analyzer) has no place there: ``chaff_rate`` must be 0.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from privacy import accounting
from privacy.budget import MICRO_PER_EPSILON, Query
from privacy.randomizers import RANDOMIZERS, LocalRandomizer, build_randomizer
from schemas.regular_files import read_text

if TYPE_CHECKING:  # the VDAF is imported where it is built: shufflers never load crypto code
    from schemas.crypto.vdaf import Prio3

__all__ = [
    "RECIPE_DIR",
    "RecipeError",
    "SHUFFLE",
    "PRIO3",
    "Recipe",
    "recipe_from_dict",
    "load_recipe",
    "shipped_recipes",
    "recipe_names",
]

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
ATTRIBUTE = "attribute"
REPORT = "report"
# A stated epsilon_local may exceed the randomizer's by this much (rounding up), never fall short.
EPSILON_LOCAL_ROUNDING = 1e-6
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_WINDOW = re.compile(r"^([1-9][0-9]*)([smhd])$")
_WINDOW_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_REPORT_KEYS = ("tau", "epsilon_backstop", "epsilon_fragment")
SOLVE = "solve"
SHUFFLE = "shuffle"
PRIO3 = "prio3"
AGGREGATIONS = (SHUFFLE, PRIO3)
# Randomizers whose output is a vector of bits, one message per set bit, signs all +1: their
# randomized report is one Prio3MultihotCountVec measurement.
PRIO3_RANDOMIZERS = ("one_hot_rappor", "symmetric_one_hot", "asymmetric_one_hot", "binary_rr")
# Randomizers whose epsilon_local can be solved for, and the accounting mechanism of each (with
# attribute fragmentation: every set bit is its own message, Section III).
_SOLVABLE = {"one_hot_rappor": accounting.ONE_HOT_RAPPOR, "binary_rr": accounting.BINARY_RR}
# A stated number in the solved form may differ from the solver's by float noise only.
_SOLVED_TOLERANCE = 1e-9


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the recipe and the field."""


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Solutions that arrived with a pickled recipe (Recipe.__reduce__), by _solved_epsilon_local's
# arguments: the process that pickled the recipe solved it.
_CARRIED_SOLUTIONS: dict[tuple[float, int, float, str, str], float] = {}


def _solved_epsilon_local(
    epsilon_central: float, crowd: int, delta: float, mechanism: str, bound: str
) -> float:
    """``accounting.solve_epsilon_local``'s eps_l rounded down to a whole micro-epsilon, the unit
    device budgets charge and allow in (privacy.budget): a smaller eps_l keeps the (increasing)
    bound under the target; the solution a pickled recipe carried when there is one."""
    key = (epsilon_central, crowd, delta, mechanism, bound)
    carried = _CARRIED_SOLUTIONS.get(key)
    return carried if carried is not None else _solve_rounded(*key)


@functools.lru_cache(maxsize=64)
def _solve_rounded(
    epsilon_central: float, crowd: int, delta: float, mechanism: str, bound: str
) -> float:
    """Memoized: the solution is a function of these arguments alone, and a recipe is rebuilt from
    its JSON by every stage and every unpickled DoFn of a run (an ``esa run`` built one 35 times,
    each solve a root-finding of ~0.4 s); a failed solve (ValueError) is not cached.
    """
    guarantee = accounting.solve_epsilon_local(
        epsilon_central, crowd, delta, mechanism, bound=bound
    )
    return math.floor(Fraction(guarantee.epsilon_local) * MICRO_PER_EPSILON) / MICRO_PER_EPSILON


@dataclass(frozen=True)
class Recipe:
    """One validated recipe. Build it with :func:`recipe_from_dict` or :func:`load_recipe`."""

    name: str
    version: int
    channel: str
    randomizer: str
    randomizer_params: Mapping[str, Any] = field(hash=False)
    fragmentation: str | Mapping[str, Mapping[str, Any]] = field(hash=False)
    epsilon_local: float
    epsilon_central_target: float
    delta: float
    min_crowd_size: int
    query_class: str
    data_fields: tuple[str, ...]
    shuffler_instances: int = 1
    instance_weights: tuple[float, ...] = ()
    window: str = "1d"
    chaff_rate: float = 0.0  # sealed cover messages per device, crowd and instance (issue 12)
    expected_crowd: int | None = None  # epsilon_local solved for this crowd (issue 13)
    solve_bound: str | None = None  # the bound it is solved with (default variation_ratio)
    default_respondents: int | None = None  # what `esa run` simulates when not told (issue 27)
    aggregation: str = SHUFFLE  # or PRIO3: two aggregators sum additive shares (issue 25)
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "randomizer_params", _freeze(dict(self.randomizer_params)))
        if isinstance(self.fragmentation, Mapping):
            object.__setattr__(self, "fragmentation", _freeze(self.fragmentation))
        if isinstance(self.data_fields, list | tuple | set | frozenset):
            object.__setattr__(self, "data_fields", tuple(self.data_fields))
        if isinstance(self.instance_weights, list | tuple):
            object.__setattr__(self, "instance_weights", tuple(self.instance_weights))
        self._check_plain_fields()
        self._solve_epsilon_local()
        built = self._check_randomizer()
        object.__setattr__(self, "_randomizer", built)
        self._check_fragmentation(built)
        self._check_privacy(built)
        self._check_aggregation()

    # -- validation -----------------------------------------------------------------------

    def _fail(self, field_name: str, message: str) -> RecipeError:
        label = f"{self.name}@{self.version}" if isinstance(self.name, str) else "recipe"
        return RecipeError(f"recipe {label}: field {field_name!r}: {message}")

    def _check_plain_fields(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise self._fail("name", f"must match {_NAME.pattern} (no '@'), got {self.name!r}")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise self._fail("version", f"must be a positive integer, got {self.version!r}")
        for name in ("channel", "query_class"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise self._fail(name, f"must be a non-empty string, got {value!r}")
        if (
            not isinstance(self.data_fields, tuple)
            or not self.data_fields
            or not all(isinstance(f, str) and f for f in self.data_fields)
            or len(set(self.data_fields)) != len(self.data_fields)
        ):
            raise self._fail(
                "data_fields", f"must be distinct non-empty names, got {self.data_fields!r}"
            )
        if (
            not isinstance(self.min_crowd_size, int)
            or isinstance(self.min_crowd_size, bool)
            or (self.min_crowd_size < 1)
        ):
            raise self._fail(
                "min_crowd_size", f"must be a positive integer, got {self.min_crowd_size!r}"
            )
        k = self.shuffler_instances
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise self._fail("shuffler_instances", f"must be a positive integer, got {k!r}")
        weights = self.instance_weights
        if weights == ():
            object.__setattr__(self, "instance_weights", (1.0 / k,) * k)
        elif (
            not isinstance(weights, tuple)
            or len(weights) != k
            or not all(_is_number(w) and math.isfinite(w) and w >= 0 for w in weights)
            or abs(math.fsum(weights) - 1) > 1e-9
        ):
            raise self._fail(
                "instance_weights",
                f"must be {k} non-negative numbers summing to 1 (one per shuffler instance), "
                f"got {weights!r}",
            )
        if not isinstance(self.window, str) or not _WINDOW.match(self.window):
            raise self._fail(
                "window", f"must look like '1d', '6h', '15m' or '30s', got {self.window!r}"
            )
        if not _is_number(self.chaff_rate) or not 0 <= self.chaff_rate <= 16:
            raise self._fail("chaff_rate", f"must be a number in [0, 16], got {self.chaff_rate!r}")
        if not isinstance(self.description, str):
            raise self._fail("description", "must be a string")
        default = self.default_respondents
        if default is not None and (
            not isinstance(default, int) or isinstance(default, bool) or default < 1
        ):
            raise self._fail("default_respondents", f"must be a positive integer, got {default!r}")
        target = self.epsilon_central_target
        if not _is_number(target) or not math.isfinite(target) or target <= 0:
            raise self._fail(
                "epsilon_central_target", f"must be a finite number > 0, got {target!r}"
            )
        if not _is_number(self.delta) or not 0 < self.delta < 1:
            raise self._fail("delta", f"must be in (0, 1), got {self.delta!r}")

    def _solve_epsilon_local(self) -> None:
        """Resolve ``"epsilon_local": "solve"`` for expected_crowd (module docstring)."""
        stated = self.epsilon_local
        solve = stated == SOLVE
        if isinstance(stated, str) and not solve:
            raise self._fail(
                "epsilon_local", f"must be a number, null or {SOLVE!r}, got {stated!r}"
            )
        params = dict(self.randomizer_params)
        crowd = self.expected_crowd
        if crowd is None:
            if solve:
                raise self._fail("expected_crowd", f"is required when epsilon_local is {SOLVE!r}")
            if self.solve_bound is not None:
                raise self._fail("solve_bound", "is only used with expected_crowd")
            return
        if not isinstance(crowd, int) or isinstance(crowd, bool) or crowd < 1:
            raise self._fail("expected_crowd", f"must be a positive integer, got {crowd!r}")
        mechanism = _SOLVABLE.get(self.randomizer)
        if mechanism is None or self.fragmentation != ATTRIBUTE:
            raise self._fail(
                "expected_crowd",
                f"epsilon_local can be solved only for {sorted(_SOLVABLE)} with attribute "
                f"fragmentation, not {self.randomizer} with {self.fragmentation!r}",
            )
        bound = accounting.VARIATION_RATIO if self.solve_bound is None else self.solve_bound
        known = [*accounting.mechanism_bounds(mechanism), accounting.TIGHTEST]
        if bound not in known:
            raise self._fail(
                "solve_bound", f"unknown bound {bound!r} for {mechanism}; known: {known}"
            )
        try:
            solved = _solved_epsilon_local(
                self.epsilon_central_target, crowd, self.delta, mechanism, bound
            )
        except ValueError as error:
            raise self._fail("expected_crowd", f"cannot solve epsilon_local: {error}") from error
        object.__setattr__(self, "solve_bound", bound)
        if solve:
            if params.get("epsilon", SOLVE) != SOLVE:
                raise self._fail(
                    "randomizer_params",
                    f"epsilon must be absent or {SOLVE!r} when epsilon_local is {SOLVE!r}, "
                    f"got {params['epsilon']!r}",
                )
            params["epsilon"] = solved
            object.__setattr__(self, "randomizer_params", _freeze(params))
            object.__setattr__(self, "epsilon_local", solved)
            return
        if not _is_number(stated) or abs(stated - solved) > _SOLVED_TOLERANCE:
            raise self._fail(
                "epsilon_local",
                f"is {stated!r} but solving for epsilon_central_target "
                f"{self.epsilon_central_target!r} at expected_crowd {crowd} by {bound} gives "
                f"{solved!r} (state {SOLVE!r} to have it solved)",
            )

    def _check_randomizer(self) -> LocalRandomizer:
        if self.randomizer not in RANDOMIZERS:
            raise self._fail(
                "randomizer",
                f"unknown randomizer {self.randomizer!r}; known: {sorted(RANDOMIZERS)}",
            )
        try:
            return build_randomizer(self.randomizer, _thaw(self.randomizer_params))
        except (ValueError, TypeError) as error:
            raise self._fail("randomizer_params", str(error)) from error

    def _check_fragmentation(self, built: LocalRandomizer) -> None:
        fragmentation = self.fragmentation
        if fragmentation == ATTRIBUTE:
            if self.randomizer == "report_fragmented":
                raise self._fail(
                    "fragmentation",
                    "report_fragmented needs {'report': {tau, epsilon_backstop, ...}}",
                )
            return
        if not (isinstance(fragmentation, Mapping) and set(fragmentation) == {REPORT}):
            raise self._fail(
                "fragmentation",
                f"must be 'attribute' or {{'report': {{...}}}}, got {fragmentation!r}",
            )
        report = fragmentation[REPORT]
        if not isinstance(report, Mapping) or set(report) != set(_REPORT_KEYS):
            raise self._fail(
                "fragmentation", f"'report' must have exactly the keys {list(_REPORT_KEYS)}"
            )
        if self.randomizer != "report_fragmented":
            raise self._fail(
                "fragmentation", "report fragmentation needs randomizer 'report_fragmented'"
            )
        expected = {
            "tau": built.fragments,
            "epsilon_backstop": built.backstop_epsilon,
            "epsilon_fragment": built.fragment_epsilon,
        }
        for key, value in expected.items():
            if report[key] != value:
                raise self._fail(
                    "fragmentation",
                    f"report.{key}={report[key]!r} differs from the randomizer's {value!r}",
                )

    def _check_privacy(self, built: LocalRandomizer) -> None:
        actual = float(built.epsilon_local)
        stated = self.epsilon_local
        if stated is None:
            stated = math.inf
            object.__setattr__(self, "epsilon_local", stated)
        if not _is_number(stated) or math.isnan(stated):
            raise self._fail(
                "epsilon_local", f"must be a number (or null for none), got {stated!r}"
            )
        if math.isinf(actual) or math.isinf(stated):
            if not (math.isinf(actual) and math.isinf(stated)):
                raise self._fail(
                    "epsilon_local",
                    f"is {stated!r} but the randomizer's local epsilon is {actual!r}",
                )
        elif not actual <= stated <= actual + EPSILON_LOCAL_ROUNDING:
            raise self._fail(
                "epsilon_local",
                f"is {stated!r} but {self.randomizer} with these parameters gives {actual!r} "
                f"(state it rounded up by at most {EPSILON_LOCAL_ROUNDING})",
            )
        central = getattr(built, "central_epsilon", None)
        if central is not None and self.epsilon_central_target < central:
            raise self._fail(
                "epsilon_central_target",
                f"{self.epsilon_central_target!r} is below the randomizer's guarantee {central!r}",
            )
        central_delta = getattr(built, "central_delta", None)
        if central_delta is not None and self.delta < central_delta:
            raise self._fail("delta", f"{self.delta!r} is below the randomizer's {central_delta!r}")
        calibrated_for = getattr(built, "respondents", None)
        if calibrated_for is not None and self.min_crowd_size < calibrated_for:
            raise self._fail(
                "min_crowd_size",
                f"{self.min_crowd_size} is below the {calibrated_for} respondents the randomizer "
                "is calibrated for",
            )

    def _check_aggregation(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise self._fail(
                "aggregation", f"must be one of {list(AGGREGATIONS)}, got {self.aggregation!r}"
            )
        if self.aggregation != PRIO3:
            return
        if self.randomizer not in PRIO3_RANDOMIZERS or self.fragmentation != ATTRIBUTE:
            raise self._fail(
                "aggregation",
                f"prio3 needs a bit-vector randomizer ({', '.join(PRIO3_RANDOMIZERS)}) with "
                f"attribute fragmentation, got {self.randomizer!r}",
            )
        if self.chaff_rate:
            raise self._fail("chaff_rate", "must be 0 with aggregation prio3 (no sealed chaff)")

    # -- derived values ---------------------------------------------------------------------

    @property
    def is_prio3(self) -> bool:
        """True in the aggregate model (two aggregators, Prio3 shares)."""
        return self.aggregation == PRIO3

    def build_vdaf(self) -> Prio3:
        """The Prio3 instance of a prio3 recipe: Prio3MultihotCountVec over the randomizer's
        message domain, 1-bit entries, any weight; its XOF context is the recipe id, so shares
        of one recipe never verify under another."""
        if not self.is_prio3:
            raise RecipeError(f"recipe {self.id}: aggregation is {self.aggregation!r}, not prio3")
        from schemas.crypto.vdaf import Prio3

        length = int(self.build_randomizer().message_domain_size)
        return Prio3("multihot", length, max_weight=length, context=self.id.encode("utf-8"))

    @property
    def id(self) -> str:
        """``name@version``: the recipe_id stamped on reports."""
        return f"{self.name}@{self.version}"

    @property
    def payload_kind(self) -> str:
        """The payload kind of the randomizer's messages (``schemas/payloads.avsc``)."""
        return RANDOMIZERS[self.randomizer].payload_kind

    @property
    def report_fragments(self) -> int:
        """tau for report fragmentation, 1 for attribute fragmentation."""
        if isinstance(self.fragmentation, Mapping):
            return int(self.fragmentation[REPORT]["tau"])
        return 1

    @property
    def chaff_allowance(self) -> int:
        """Most sealed chaff messages a device sends per crowd and instance: ceil(chaff_rate)."""
        return math.ceil(self.chaff_rate)

    @property
    def window_seconds(self) -> int:
        match = _WINDOW.match(self.window)
        assert match is not None  # validated in __post_init__
        return int(match.group(1)) * _WINDOW_SECONDS[match.group(2)]

    def build_randomizer(self) -> LocalRandomizer:
        """The recipe's local randomizer (immutable; built once at validation)."""
        return self._randomizer  # type: ignore[attr-defined]

    def to_query(self) -> Query:
        """What a device's budget accountant checks before answering (privacy.budget)."""
        return Query(
            query_id=self.id,
            query_class=self.query_class,
            data_fields=frozenset(self.data_fields),
            epsilon_local=self.epsilon_local,
            epsilon_central=self.epsilon_central_target,
            delta=self.delta,
            min_crowd_size=self.min_crowd_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``recipe_from_dict`` inverts it)."""
        result = {f.name: _thaw(getattr(self, f.name)) for f in fields(self)}
        if math.isinf(self.epsilon_local):
            result["epsilon_local"] = None
        if self.expected_crowd is None:
            del result["expected_crowd"], result["solve_bound"]
        if self.default_respondents is None:
            del result["default_respondents"]
        if self.aggregation == SHUFFLE:
            del result["aggregation"]
        return result

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], tuple | None]]:
        """Pickles as its JSON form and, when epsilon_local was solved for expected_crowd, that
        solution: unpickling validates the JSON as loading does, but takes the root-finding's
        result from the pickle instead of solving again (a worker process that unpickles a
        recipe saves the solve and scipy.stats' import, ~1 s of CPU)."""
        solution = None
        if self.expected_crowd is not None:
            key = (
                self.epsilon_central_target,
                self.expected_crowd,
                self.delta,
                _SOLVABLE[self.randomizer],
                self.solve_bound,
            )
            solution = (key, _solved_epsilon_local(*key))
        return _unpickle_recipe, (self.to_dict(), solution)


def _unpickle_recipe(data: dict[str, Any], solution: tuple | None) -> Recipe:
    if solution is not None:
        key, solved = solution
        _CARRIED_SOLUTIONS[tuple(key)] = solved
    return recipe_from_dict(data, source="pickled recipe")


_FIELD_NAMES = tuple(f.name for f in fields(Recipe))
_REQUIRED = tuple(
    f.name for f in fields(Recipe) if f.default is MISSING and f.default_factory is MISSING
)


def recipe_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Recipe:
    """Validate and build a recipe from its JSON form; errors name ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"recipe {source}: must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELD_NAMES))
    if unknown:
        raise RecipeError(
            f"recipe {source}: field {unknown[0]!r}: unknown field (known: {list(_FIELD_NAMES)})"
        )
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise RecipeError(f"recipe {source}: field {missing[0]!r}: required field is missing")
    values = dict(data)
    if not isinstance(values["randomizer_params"], Mapping):
        raise RecipeError(f"recipe {source}: field 'randomizer_params': must be a JSON object")
    for name in ("data_fields", "instance_weights"):
        if name in values and not isinstance(values[name], list | tuple):
            raise RecipeError(f"recipe {source}: field {name!r}: must be a JSON array")
    return Recipe(**values)


def _load_file(path: Path) -> Recipe:
    try:
        data = json.loads(read_text(path))
    except (OSError, json.JSONDecodeError) as error:
        raise RecipeError(f"recipe {path}: cannot be read: {error}") from error
    return recipe_from_dict(data, source=str(path))


@functools.cache
def _shipped() -> MappingProxyType[str, Recipe]:
    recipes: dict[str, Recipe] = {}
    for path in sorted(RECIPE_DIR.glob("*.json")):
        recipe = _load_file(path)
        if recipe.id in recipes:
            raise RecipeError(f"recipe {path}: id {recipe.id} is shipped twice")
        recipes[recipe.id] = recipe
    return MappingProxyType(recipes)


def shipped_recipes() -> Mapping[str, Recipe]:
    """Every recipe in ``schemas/recipes/``, by id (validated once per process)."""
    return _shipped()


def recipe_names() -> list[str]:
    """Names of the shipped recipes (sorted)."""
    return sorted({recipe.name for recipe in _shipped().values()})


def load_recipe(name_or_path: str | os.PathLike[str]) -> Recipe:
    """A recipe by file path, by id (``name@version``) or by name (its highest shipped version)."""
    text = os.fspath(name_or_path)
    path = Path(text)
    if text.endswith(".json") or os.sep in text or isinstance(name_or_path, Path):
        return _load_file(path)
    recipes = _shipped()
    if "@" in text:
        if text in recipes:
            return recipes[text]
        raise RecipeError(f"no shipped recipe {text!r}; shipped: {sorted(recipes)}")
    versions = [r for r in recipes.values() if r.name == text]
    if not versions:
        raise RecipeError(f"no shipped recipe named {text!r}; shipped: {recipe_names()}")
    return max(versions, key=lambda r: r.version)
