"""Pipeline options whose views are made once per options class.

Beam asks a pipeline's options for a view (``options.view_as(TypeOptions)``) for every transform
applied and for every type-consistency check of its inputs and outputs, and each view builds an
argparse parser and parses the flags again: about 0.7 ms a view and 538 of them (~0.4 s) to build
the analyzer's pipeline, paid again by every stage of ``esa run``. A view holds nothing of its
own: its values live in the ``_all_options`` dict that every view of the same options shares
(``PipelineOptions.view_as``), and the flags it parses do not change; so one view per options
class, kept, reads and writes exactly what a fresh one would.
"""

from __future__ import annotations

from typing import Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions

__all__ = ["ViewsOnce", "views_once"]

_View = TypeVar("_View", bound=PipelineOptions)


class ViewsOnce(PipelineOptions):
    """Options (a view of others, sharing their values) that keep the views they make. It adds
    no flags of its own."""

    def view_as(self, cls: type[_View]) -> _View:
        views = self.__dict__.get("_views")
        if views is None:
            views = {}
            object.__setattr__(self, "_views", views)  # not an option: PipelineOptions stores
            # every other attribute set on it as one
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict[str, Any]:
        # A copy or pickle (Beam deep-copies a pipeline's options) makes its own views: kept
        # ones would share the original's values.
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


def views_once(options: PipelineOptions) -> ViewsOnce:
    """``options`` as :class:`ViewsOnce`, sharing their values (setting an option on either sets
    it on both): give it to ``beam.Pipeline(options=...)``."""
    if isinstance(options, ViewsOnce):
        return options
    return options.view_as(ViewsOnce)
