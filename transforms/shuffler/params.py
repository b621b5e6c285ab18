"""Parameters of the ESA shuffler: recipe routes, validation rules, windows, deletion (Algorithm 3).

Frozen, validated objects (PipelineDP's habit): every field is checked in ``__post_init__`` with a
message that names it. Pure: no Beam.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from privacy import noise
from privacy.accounting.deletion import deletion_noise
from schemas.windows import WindowSpec, parse_duration_ms  # noqa: F401 - re-exported
from transforms.shuffler import decide


@dataclass(frozen=True)
class RecipeRoute:
    """What the shuffler needs to know about one recipe: where its messages may go."""

    channel: str
    shuffler_instances: int
    min_crowd_size: int = 0
    # Per shuffler instance u, the most data messages one origin may send to one crowd of u
    # (release_core.max_messages_per_respondent); empty: no cap (hand-made routes in tests).
    origin_caps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.channel, str) or not self.channel:
            raise ValueError(f"channel must be a non-empty string, got {self.channel!r}")
        if not isinstance(self.shuffler_instances, int) or self.shuffler_instances < 1:
            raise ValueError(
                f"shuffler_instances must be an int >= 1, got {self.shuffler_instances!r}"
            )
        if not isinstance(self.min_crowd_size, int) or self.min_crowd_size < 0:
            raise ValueError(f"min_crowd_size must be an int >= 0, got {self.min_crowd_size!r}")
        caps = tuple(self.origin_caps)
        object.__setattr__(self, "origin_caps", caps)
        if caps and (
            len(caps) != self.shuffler_instances
            or not all(isinstance(cap, int) and cap >= 0 for cap in caps)
        ):
            raise ValueError(
                f"origin_caps must be {self.shuffler_instances} ints >= 0 (one per instance), "
                f"got {caps!r}"
            )

    def origin_cap(self, instance: int) -> int | None:
        """The per-origin data-message cap of a crowd of ``instance`` (None: uncapped)."""
        if not self.origin_caps or not 0 <= instance < len(self.origin_caps):
            return None
        return self.origin_caps[instance]


def routes_from_recipes(
    recipes: Mapping[str, Any], window_ms: int | None = None
) -> dict[str, RecipeRoute]:
    """``{recipe_id: RecipeRoute}`` from ``schemas.recipes.Recipe`` objects.

    Each route carries the per-origin cap of data messages per crowd and instance
    (:func:`transforms.shuffler.decide.recipe_origin_caps`), for crowds of ``window_ms`` (the
    shuffler's window; None: the recipe's own window).
    """
    return {
        recipe_id: RecipeRoute(
            channel=recipe.channel,
            shuffler_instances=int(recipe.shuffler_instances),
            min_crowd_size=int(getattr(recipe, "min_crowd_size", 0) or 0),
            origin_caps=decide.recipe_origin_caps(recipe, window_ms),
        )
        for recipe_id, recipe in recipes.items()
    }


@dataclass(frozen=True)
class ValidationRules:
    """Which reports the shuffler accepts.

    ``routes`` maps each known recipe id to its channel and number of shuffler instances;
    ``instance`` (optional) makes this run accept only that shuffler instance; ``window_ms``
    (optional) the window length, so event times whose window would end past what Avro
    timestamps hold are refused.
    """

    routes: Mapping[str, RecipeRoute]
    supported_versions: frozenset[int]
    instance: int | None = None
    window_ms: int | None = None
    _recipe_ids: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.routes:
            raise ValueError("routes must name at least one recipe")
        for recipe_id, route in self.routes.items():
            if not isinstance(recipe_id, str) or not recipe_id:
                raise ValueError(f"routes: recipe ids must be non-empty strings, got {recipe_id!r}")
            if not isinstance(route, RecipeRoute):
                raise ValueError(f"routes[{recipe_id!r}] must be a RecipeRoute, got {route!r}")
        if not self.supported_versions:
            raise ValueError("supported_versions must not be empty")
        if self.instance is not None and (
            not isinstance(self.instance, int)
            or isinstance(self.instance, bool)
            or self.instance < 0
        ):
            raise ValueError(f"instance must be an int >= 0 or None, got {self.instance!r}")
        object.__setattr__(self, "_recipe_ids", tuple(sorted(self.routes)))

    @property
    def recipe_ids(self) -> tuple[str, ...]:
        return self._recipe_ids


@dataclass(frozen=True)
class DeletionParameters:
    """(eps_cr, delta_cr) of randomized report deletion, Algorithm 3 (esa-privacy-revisited).

    The noise is discrete Laplace with the paper's Laplace scale 2/eps_cr, and the offset is the
    paper's (2/eps_cr) log(2/delta_cr) rounded up to an integer (``privacy.accounting.deletion``):
    a larger offset only lowers the abort probability below the delta_cr/2 per crowd used in the
    proof of Theorem V.1.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        # deletion_noise validates both and names the field in its message.
        deletion_noise(self.epsilon, self.delta)

    @property
    def scale(self) -> Fraction:
        """The discrete Laplace scale 2 / eps_cr (exact)."""
        return noise.discrete_laplace_scale(self.epsilon, sensitivity=2)

    @property
    def offset(self) -> int:
        """ceil((2 / eps_cr) * log(2 / delta_cr)), line 3 of Algorithm 3."""
        return deletion_noise(self.epsilon, self.delta).offset_records
